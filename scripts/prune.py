"""Snakemake entry: the head-ablation study of one model (Figure 7, Tables 3 and 4)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.prune import prune

setup_logging(snakemake.log[0], snakemake.threads)
p, i = snakemake.params, snakemake.input
prune(p.model["kind"], p.model, i.npz, i.meta, i.checkpoint or None, list(i.attention), i.entropy,
      dict(snakemake.output.items()), fraction=p.fraction, device=p.device, **p.prune)
