"""Snakemake entry of the softmax-free experiment's rules: train one run, analyse one run, or
build Table 5 and Figure 8 (oattn_lib.softmax_free), by the rule that runs it."""
from oattn_lib import softmax_free as sf
from oattn_lib.runtime import setup_logging

setup_logging(snakemake.log[0], snakemake.threads)
p, i, o = snakemake.params, snakemake.input, snakemake.output
if snakemake.rule == "softmax_free_train":
    sf.train_run(p.kind, p.arch, p.train, p.data, i.npz, i.meta, p.attention, p.seed, p.steps,
                 o.checkpoint, o.metrics, device=p.device)
elif snakemake.rule == "softmax_free_analyse":
    sf.analyse_run(p.kind, p.model, i.npz, i.meta, i.checkpoint, i.metrics, o.analysis,
                   n_samples=p.n_samples, quantity=p.quantity, organize_params=p.organize,
                   questionnaire2d_iters=p.questionnaire2d_iters, head_top_k=p.head_top_k,
                   network_top_k=p.network_top_k, paraproduct_samples=p.paraproduct_samples, device=p.device)
else:
    sf.table5(p.runs, o.csv, o.md, o.fig)
