"""Snakemake entry: every replicate analysis of one sample of a model, or of each sample of a
batch, a store each (docs/method.md §14)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.stability import stability_sample_stores

setup_logging(snakemake.log[0], snakemake.threads)
p, i = snakemake.params, snakemake.input
stability_sample_stores(list(i.attention), list(i.organized), list(i.decomposed), list(snakemake.output.store),
                        samples=list(p.samples), organize=p.organize, head_top_k=p.entropy["head_top_k"],
                        network_top_k=p.entropy["network_top_k"], settings=p.settings,
                        questionnaire2d_iters=p.questionnaire2d_iters, device=p.device,
                        config_slice={**p.analysis, "organize": p.organize, "entropy": p.entropy,
                                      "stability": p.settings}, code=p.code, **p.analysis)
