"""Snakemake entry: Haar expansions, paraproduct and diffusion map for one sample."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.decompose import decompose

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
decompose(snakemake.input.attention, snakemake.input.organized, snakemake.output.store,
          config_slice={**p.analysis, "decompose": p.decompose}, code=p.code, device=p.device,
          **p.analysis, **p.decompose)
