"""Snakemake entry: the plan of a model's explorer page (what it shows, at which resolution)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.explorer_samples import explorer_plan

setup_logging(snakemake.log[0], snakemake.threads)
i, p = snakemake.input, snakemake.params
explorer_plan(snakemake.wildcards.model, list(i.attention), i.organized, i.decomposed, i.entropy, i.organized2d,
              snakemake.output.plan, quantity=p.analysis["quantity"], crop=p.analysis["crop"], **p.decompose,
              **p.explorer)
