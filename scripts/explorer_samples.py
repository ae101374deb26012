"""Snakemake entry: consecutive samples of a model's explorer page, encoded at its planned resolution."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.explorer_samples import explorer_samples

setup_logging(snakemake.log[0], snakemake.threads)
i, p = snakemake.input, snakemake.params
explorer_samples(snakemake.wildcards.model, p.indices, i.plan, list(i.attention), list(i.organized),
                 list(i.decomposed), list(i.organized2d), snakemake.output.part, quantity=p.analysis["quantity"],
                 crop=p.analysis["crop"])
