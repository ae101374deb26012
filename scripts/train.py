"""Snakemake entry: train one model, seeded; checkpoint and metrics."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.train import train_model

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
train_model(p.kind, p.arch, p.train, p.data, snakemake.input.npz, snakemake.input.meta,
            snakemake.output.checkpoint, snakemake.output.metrics, device=p.device, pretrained=p.pretrained)
