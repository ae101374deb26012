# Each sample's own 2-D organization of the heads the explorer shows in 2-D (explorer.heads_2d:
# the figure heads, whose organization the decompose stage made, then the entropy extremes),
# after the entropy stage that ranks them (docs/method.md §12.3), for the samples the page shows
# (its first explorer.max_samples). One job per sample, beside the rest of the run (an LLM's
# prune), or one job for each batch of a small model's shown samples (organize2d_batch_<model>;
# jobs.batch_max_entries and batch_max_samples, common.smk); the explorer's page job only reads them.


rule organize2d:
    input:
        attention=[ATTENTION],
        decomposed=[DECOMPOSED],
        entropy=ENTROPY,
    output:
        store=[ORGANIZED_2D],
    log:
        f"{R}/logs/{{model}}/organize2d_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/organize2d_sample{{sample}}.tsv"
    wildcard_constraints:
        model=PER_SAMPLE_MODEL,
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **ANALYSIS_GPU,
        **analysis_resources("organize2d"),
    params:
        analysis=analysis_params,
        device=config["device"],
        organize2d=ORGANIZE2D,
        code=code_version("organize2d"),
    script:
        "../../scripts/organize2d.py"


for _suffix, _name, _samples in SHOWN_BATCH_JOBS:

    rule:
        name:
            f"organize2d_batch_{_suffix}"
        input:
            attention=batch_paths(ATTENTION, _name, _samples),
            decomposed=batch_paths(DECOMPOSED, _name, _samples),
            entropy=ENTROPY.format(model=_name),
        output:
            store=batch_paths(ORGANIZED_2D, _name, _samples),
        log:
            batch_file("logs", _name, "organize2d", _samples, SHOWN_BATCH_JOBS),
        benchmark:
            batch_file("benchmarks", _name, "organize2d", _samples, SHOWN_BATCH_JOBS)
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **batch_resources(_name, _samples, analysis_resources("organize2d")),
        params:
            analysis=for_model(_name, _samples, analysis_params),
            device=config["device"],
            organize2d=ORGANIZE2D,
            code=code_version(f"organize2d_batch_{_suffix}", "organize2d"),
        script:
            "../../scripts/organize2d.py"
