"""Snakemake entry: Tables 1 and 2 of one model, as CSV and Markdown."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.tables import tables

setup_logging(snakemake.log[0], snakemake.threads)
o = snakemake.output
tables(snakemake.input.entropy, o.table1_csv, o.table1_md, o.table2_csv, o.table2_md,
       fraction=snakemake.params.fraction, model_name=snakemake.wildcards.model,
       organized_stores=list(snakemake.input.organized), out_head_tree_csv=o.head_tree_csv,
       stability_store=snakemake.input.stability[0] if snakemake.input.stability else None)
