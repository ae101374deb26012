"""Snakemake entry: the Markdown summary of every model."""
from oattn_lib.pipeline import setup_logging, summary

setup_logging(snakemake.log[0], snakemake.threads)
i = snakemake.input
models = snakemake.params.models
summary({m: i.get(f"metrics_{m}") for m in models},
        {m: {"Table 1": i[f"table1_{m}"], "Table 2": i[f"table2_{m}"]} for m in models}, snakemake.output.md)
