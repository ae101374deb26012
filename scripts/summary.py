"""Snakemake entry: the claims table and the Markdown summary of every model."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.summary import summary

setup_logging(snakemake.log[0], snakemake.threads)
summary(snakemake.params.kinds, dict(snakemake.input.items()), dict(snakemake.output.items()),
        snakemake.params.fraction, snakemake.params.claims)
