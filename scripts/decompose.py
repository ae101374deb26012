"""Snakemake entry: Haar expansions, paraproduct and diffusion map of one sample, or of each of a
model's samples."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.decompose import decompose_samples

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
decompose_samples(list(snakemake.input.attention), list(snakemake.input.organized), list(snakemake.output.store),
                  config_slice={**p.analysis, "decompose": p.decompose}, code=p.code, device=p.device,
                  **p.analysis, **p.decompose)
