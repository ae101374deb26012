"""Snakemake entry: two models' analyses side by side (docs/method.md §15)."""
from oattn_lib.runtime import setup_logging
from oattn_lib.stages.compare import compare

setup_logging(snakemake.log[0], snakemake.threads)
i, o, p = snakemake.input, snakemake.output, snakemake.params
sides = [{"name": n, "rows": i[f"rows_{k}"], "summary": i[f"summary_{k}"], "table2": i[f"table2_{k}"]}
         for k, n in (("a", snakemake.wildcards.a), ("b", snakemake.wildcards.b))]
compare(*sides, o.heads, o.models, o.figure, o.page, heads=p.heads, permutations=p.permutations,
        bootstrap=p.bootstrap, seed=p.seed)
