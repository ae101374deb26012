# The interactive explorer: one self-contained HTML page per model (plotly.js inline,
# opens from disk with no network) and an index page linking them. Reads every stage's outputs,
# the 2-D organizations of the heads it shows in 2-D included (organize2d.smk).


rule explorer:
    input:
        unpack(explorer_inputs),
    output:
        # not in the report: a page of several MB is beyond the length of a URL the report's
        # frames can open (2 MB in Chromium); the index's caption links the pages instead
        page=f"{R}/{{model}}/explorer.html",
    log:
        f"{R}/logs/{{model}}/explorer.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/explorer.tsv"
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **analysis_resources("explorer"),
    params:
        kind=lambda wildcards: MODELS[wildcards.model]["kind"],
        analysis=analysis_params,
        decompose={k: config["decompose"][k] for k in ("figure_heads", "questionnaire2d_iters")},
        explorer=config["explorer"],
        code=code_version("explorer"),
    script:
        "../../scripts/explorer.py"


rule explorer_index:
    input:
        pages=expand(f"{R}/{{model}}/explorer.html", model=MODELS),
    output:
        index=report(f"{R}/explorer.html", caption="../report/explorer.rst", category="Explorer"),
        note=f"{R}/explorer_note.rst",
    log:
        f"{R}/logs/explorer_index.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        models=list(MODELS),
        code=code_version("explorer_index"),
    script:
        "../../scripts/explorer_index.py"
