"""Snakemake entry: the index page linking every model's explorer page."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.explorer import explorer_index

setup_logging(snakemake.log[0], snakemake.threads)
explorer_index(dict(zip(snakemake.params.models, snakemake.input.pages)), snakemake.output.index,
               note=snakemake.output.note)
