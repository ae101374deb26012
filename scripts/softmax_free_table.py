"""Snakemake entry: Table 5 and Figure 8 of the softmax-free experiment."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.softmax_free_table import table5

setup_logging(snakemake.log[0], snakemake.threads)
o = snakemake.output
table5(snakemake.params.runs, o.csv, o.md, o.fig)
