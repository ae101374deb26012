"""Snakemake entry: the replicates of a model's samples, the bootstrap and the stability table
(docs/method.md §14)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.stability_tables import stability_tables

setup_logging(snakemake.log[0], snakemake.threads)
p, i, o = snakemake.params, snakemake.input, snakemake.output
stability_tables(list(i.replicates), i.entropy, o.store, o.csv, o.md, samples=list(p.samples), settings=p.settings,
                 fraction=p.fraction, model_name=snakemake.wildcards.model,
                 config_slice={"stability": p.settings, "fraction": p.fraction}, code=p.code)
