"""Snakemake entry: the 3-D questionnaire on one sample, or on each of a model's samples (docs/method.md §5.2)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.organize import organize_samples

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
organize_samples(list(snakemake.input.attention), list(snakemake.output.store), params=p.organize,
                 config_slice={**p.analysis, "organize": p.organize}, code=p.code, device=p.device, **p.analysis)
