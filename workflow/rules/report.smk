# One Markdown summary of every model's training metrics and tables; the HTML report is
# `snakemake --report results/report.html`, built from the report() outputs.


def summary_inputs(wildcards):
    inputs = {}
    for name, m in MODELS.items():
        if m["kind"] != "hf":
            inputs[f"metrics_{name}"] = f"{R}/{name}/model/metrics.json"
        inputs[f"table1_{name}"] = f"{R}/{name}/tables/table1.md"
        inputs[f"table2_{name}"] = f"{R}/{name}/tables/table2.md"
        if config["prune"]["enabled"]:
            inputs[f"table3_{name}"] = f"{R}/{name}/tables/table3.md"
            inputs[f"table4_{name}"] = f"{R}/{name}/tables/table4.md"
    return inputs


rule summary:
    input:
        unpack(summary_inputs),
    output:
        md=report(f"{R}/summary.md", caption="../report/summary.rst", category="Summary"),
    params:
        models=list(MODELS),
        code=code_version("summary"),
    log:
        f"{R}/logs/summary.log",
    threads: 1
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/summary.py"
