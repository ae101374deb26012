"""Snakemake entry: the 2-D organizations of the heads the explorer shows in 2-D, of one sample
or of each of a model's samples."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.organize2d import organize2d_samples

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
organize2d_samples(list(snakemake.input.attention), list(snakemake.input.decomposed), snakemake.input.entropy,
                   list(snakemake.output.store), config_slice={**p.analysis, "organize2d": p.organize2d}, code=p.code,
                   quantity=p.analysis["quantity"], crop=p.analysis["crop"], device=p.device,
                   **p.organize2d)
