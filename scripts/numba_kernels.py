"""Snakemake entry: compile the numba kernels into their disk cache before the jobs that run them."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.kernels import kernels

setup_logging(snakemake.log[0], snakemake.threads)
kernels(snakemake.output.report)
