"""Snakemake entry: the interactive explorer page of one model."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.explorer import explorer

setup_logging(snakemake.log[0], snakemake.threads)
i, p, o = snakemake.input, snakemake.params, snakemake.output
explorer(snakemake.wildcards.model, p.kind, i.attention, i.organized, i.decomposed, i.entropy, i.table1, i.table2,
         o.page, table3_csv=i.get("table3"), table4_csv=i.get("table4"), rankings_csv=i.get("rankings"),
         stability_store=i.get("stability"), stability_csv=i.get("stability_table"), organized2d_stores=i.organized2d,
         **p.analysis, **p.decompose, **p.explorer)
