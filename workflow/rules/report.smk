# One Markdown summary opening with the paper's claims as measured (one table), then every
# model's training metrics and tables. The HTML report is `snakemake --report
# results/report.html`, built from the report() outputs; its opening page is the claims table.


report: "../report/workflow.rst"


rule summary:
    input:
        unpack(summary_inputs),
    output:
        md=report(f"{R}/summary.md", caption="../report/summary.rst", category="Summary"),
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
        claims=config["claims"],
        code=code_version("summary"),
    script:
        "../../scripts/summary.py"
