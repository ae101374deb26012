"""Snakemake entry: paraproduct residual of every head of a softmax run (docs/method.md §7)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.softmax_free_paraproduct import paraproduct_residuals

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
paraproduct_residuals(list(snakemake.input.attention), snakemake.output.store, p.questionnaire2d_iters,
                      config_slice={"questionnaire2d_iters": p.questionnaire2d_iters},
                      code=p.code)
