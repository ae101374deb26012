"""Snakemake entry: train one run of the softmax-free experiment (a model, attention and seed)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.softmax_free_train import train_run

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
train_run(p.kind, p.arch, p.train, p.data, snakemake.input.npz, snakemake.input.meta, p.attention, p.seed,
          p.steps, snakemake.output.checkpoint, snakemake.output.metrics, device=p.device)
