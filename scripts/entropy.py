"""Snakemake entry: entropies and sparsity of every head and network of one model (SPEC 4)."""
from oattn_lib.pipeline import entropy, setup_logging

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
entropy(list(snakemake.input.decomposed), snakemake.output.store, p.head_top_k, p.network_top_k,
        config_slice={"head_top_k": p.head_top_k, "network_top_k": p.network_top_k})
