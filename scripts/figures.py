"""Snakemake entry: Figures 1-6 of one model."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.figures import figures

setup_logging(snakemake.log[0], snakemake.threads)
i = snakemake.input
figures(snakemake.wildcards.model, list(i.attention), list(i.organized), list(i.decomposed), i.entropy,
        dict(snakemake.output.items()), **snakemake.params.figures)
