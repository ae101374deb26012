"""Snakemake entry: Figures 1-6 of one model and its temperature figure (Theorem 1)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.figures import figures

setup_logging(snakemake.log[0], snakemake.threads)
i = snakemake.input
figures(snakemake.wildcards.model, list(i.attention), list(i.organized), list(i.decomposed), i.entropy,
        dict(snakemake.output.items()), crop=snakemake.params.analysis["crop"], **snakemake.params.figures)
