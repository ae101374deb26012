"""Snakemake entry: Theorem 1 and Corollary 1 measured on every head of a model's first samples."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.theorem1 import theorem1

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
theorem1(snakemake.wildcards.model, list(snakemake.input.attention), snakemake.output.csv,
         out_curves=snakemake.output.curves, questionnaire2d_iters=p.questionnaire2d_iters, crop=p.crop, device=p.device,
         **p.theorem1)
