"""Snakemake entry: Figures 1-6 of one model."""
from oattn_lib.pipeline import figures, setup_logging

setup_logging(snakemake.log[0], snakemake.threads)
i = snakemake.input
figures(snakemake.wildcards.model, list(i.attention), list(i.organized), list(i.decomposed), i.entropy,
        dict(snakemake.output.items()), **snakemake.params.figures)
