"""Snakemake entry: build one model's dataset (text splits and vocabulary, or images)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.data import prepare_data

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
prepare_data(p.kind, p.data, snakemake.output.npz, snakemake.output.meta, data_root=p.data_root)
