"""Snakemake entry: scores and probabilities of every head for one sample."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.extract import extract

setup_logging(snakemake.log[0], snakemake.threads)
p, i = snakemake.params, snakemake.input
extract(p.model["kind"], p.model, i.npz, i.meta, i.checkpoint or None, snakemake.output.store,
        int(snakemake.wildcards.sample), device=p.device, config_slice=p.model, code=p.code,
        prepared=i.get("prepared"))
