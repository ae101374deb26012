"""Snakemake entry: the Markdown summary of every model."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.summary import summary

setup_logging(snakemake.log[0], snakemake.threads)
i = snakemake.input
models = snakemake.params.models
tables = {m: {f"Table {t}": i[f"table{t}_{m}"] for t in (1, 2, 3, 4) if f"table{t}_{m}" in i.keys()}
          for m in models}
summary({m: i.get(f"metrics_{m}") for m in models}, tables, snakemake.output.md)
