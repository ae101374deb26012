"""Snakemake entry: a model's organization, Haar expansions and entropies under the other rule for
masked entries (docs/method.md §9.5)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.masked_other import masked_other

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
o = snakemake.output
masked_other(list(snakemake.input.attention), list(o.organized), list(o.decomposed), o.entropy, analysis=p.analysis,
             organize_params=p.organize, decompose_params=p.decompose, entropy_params=p.entropy, code=p.code,
             device=p.device)
