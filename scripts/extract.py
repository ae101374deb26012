"""Snakemake entry: scores and probabilities of every head for one sample."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.extract import extract

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
extract(p.model["kind"], p.model, snakemake.input.npz, snakemake.input.meta, snakemake.input.checkpoint or None,
        snakemake.output.store, int(snakemake.wildcards.sample), device=p.device, config_slice=p.model,
        code=p.code)
