"""Snakemake entry: the interactive explorer page of one model."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.explorer import explorer

setup_logging(snakemake.log[0], snakemake.threads)
i, p, o = snakemake.input, snakemake.params, snakemake.output
# a model of one job per sample: its plan and encoded samples (explorer_plan, explorer_sample);
# a small model: its stores, read here
explorer(snakemake.wildcards.model, p.kind, i.get("attention", []), i.get("organized", []), i.get("decomposed", []),
         i.entropy, i.table1, i.table2, o.page, table3_csv=i.get("table3"), table4_csv=i.get("table4"),
         rankings_csv=i.get("rankings"), stability_store=i.get("stability"), stability_csv=i.get("stability_table"),
         organized2d_stores=i.get("organized2d"), page_plan=i.get("plan"), page_samples=i.get("samples"),
         **p.analysis, **p.decompose, **p.explorer)
