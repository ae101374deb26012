"""Snakemake entry: entropies and sparsity of every head and network of one model (docs/method.md §6)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.entropy import entropy

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
entropy(list(snakemake.input.decomposed), snakemake.output.store, p.head_top_k, p.network_top_k,
        config_slice={"head_top_k": p.head_top_k, "network_top_k": p.network_top_k}, code=p.code)
