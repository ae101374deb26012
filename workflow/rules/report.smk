# One Markdown summary opening with the paper's claims as measured (one table), then every
# model's training metrics and tables. The HTML report is `snakemake --report
# results/report.html`, built from the report() outputs; its opening page is the claims table.


report: "../report/workflow.rst"


def summary_inputs(wildcards):
    inputs = {}
    for name, m in MODELS.items():
        if m["kind"] != "hf":
            inputs[f"metrics_{name}"] = f"{R}/{name}/model/metrics.json"
        inputs[f"table1_{name}"] = f"{R}/{name}/tables/table1.md"
        inputs[f"table2_{name}"] = f"{R}/{name}/tables/table2.md"
        inputs[f"table1csv_{name}"] = f"{R}/{name}/tables/table1.csv"
        inputs[f"table2csv_{name}"] = f"{R}/{name}/tables/table2.csv"
        inputs[f"entropy_{name}"] = ENTROPY.format(model=name)
        inputs[f"temperature_{name}"] = f"{R}/{name}/figures/temperature.json"
        if config["prune"]["enabled"]:
            inputs[f"table3_{name}"] = f"{R}/{name}/tables/table3.md"
            inputs[f"table4_{name}"] = f"{R}/{name}/tables/table4.md"
            inputs[f"table3csv_{name}"] = f"{R}/{name}/tables/table3.csv"
    return inputs


rule summary:
    input:
        unpack(summary_inputs),
    output:
        md=report(
            f"{R}/summary.md", caption="../report/summary.rst", category="Summary"
        ),
        claims_csv=f"{R}/claims.csv",
        claims_rst=f"{R}/claims.rst",
    log:
        f"{R}/logs/summary.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        kinds={name: m["kind"] for name, m in MODELS.items()},
        fraction=config["entropy"]["fraction"],
        code=code_version("summary"),
    script:
        "../../scripts/summary.py"
