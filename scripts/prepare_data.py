"""Snakemake entry: build one model's dataset (text splits and vocabulary, or images)."""
from oattn_lib.pipeline import prepare_data, setup_logging

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
prepare_data(p.kind, p.data, snakemake.output.npz, snakemake.output.meta, data_root=p.data_root)
