"""Snakemake entry: every head's measures of one model, per sample and across samples, as parquet."""
from oattn_lib.heads import heads_files
from oattn_lib.runtime import setup_logging

setup_logging(snakemake.log[0], snakemake.threads)
p, i, o = snakemake.params, snakemake.input, snakemake.output
heads_files(i.entropy, list(i.decomposed), o.rows, o.summary, model=snakemake.wildcards.model, fraction=p.fraction,
            stability_store=i.stability[0] if i.stability else None, bootstrap=p.bootstrap, seed=p.seed)
