"""Snakemake entry: replicate analyses, bootstrap and stability table of one model (docs/method.md §14)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.stability import stability

setup_logging(snakemake.log[0], snakemake.threads)
p, i, o = snakemake.params, snakemake.input, snakemake.output
stability(list(i.attention), list(i.organized), list(i.decomposed), i.entropy, o.store, o.csv, o.md,
          samples=list(p.samples), organize=p.organize, head_top_k=p.entropy["head_top_k"],
          network_top_k=p.entropy["network_top_k"], fraction=p.entropy["fraction"], settings=p.settings,
          questionnaire2d_iters=p.questionnaire2d_iters, model_name=snakemake.wildcards.model,
          config_slice={**p.analysis, "organize": p.organize, "entropy": p.entropy, "stability": p.settings},
          code=p.code, device=p.device, **p.analysis)
