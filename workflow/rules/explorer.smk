# The interactive explorer: one self-contained HTML page per model (plotly.js inline,
# opens from disk with no network) and an index page linking them. Reads every stage's outputs,
# the 2-D organizations of the heads it shows in 2-D included (organize2d.smk). A model of one job
# per sample gets its page planned (explorer_plan: what it shows, at which resolution, measured on
# sample 0) and its samples encoded by up to jobs.explorer_jobs jobs (explorer_samples), beside the
# rest of the run (an LLM's prune); its page job then only assembles them. A small model's page
# job does all of it (oattn_lib.plan.Plan.explorer_inputs).


rule explorer_plan:
    input:
        attention=shown_stores(ATTENTION),
        organized=lambda w: ORGANIZED.format(model=w.model, sample=0),
        decomposed=lambda w: DECOMPOSED.format(model=w.model, sample=0),
        organized2d=lambda w: ORGANIZED_2D.format(model=w.model, sample=0),
        entropy=ENTROPY,
    output:
        plan=EXPLORER_PLAN,
    log:
        f"{R}/logs/{{model}}/explorer_plan.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/explorer_plan.tsv"
    wildcard_constraints:
        model=EXPLORER_PER_SAMPLE,
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **analysis_resources("explorer"),
    params:
        analysis=analysis_params,
        decompose={k: config["decompose"][k] for k in ("figure_heads", "questionnaire2d_iters")},
        explorer=config["explorer"],
        code=code_version("explorer_plan"),
    script:
        "../../scripts/explorer_plan.py"


rule explorer_samples:
    input:
        unpack(explorer_part_inputs),
    output:
        part=EXPLORER_PART,
    log:
        f"{R}/logs/{{model}}/explorer_samples_part{{part}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/explorer_samples_part{{part}}.tsv"
    wildcard_constraints:
        model=EXPLORER_PER_SAMPLE,
        part=r"\d+",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **analysis_resources("explorer"),
    params:
        analysis=analysis_params,
        indices=explorer_part_samples,
        code=code_version("explorer_samples"),
    script:
        "../../scripts/explorer_samples.py"


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
