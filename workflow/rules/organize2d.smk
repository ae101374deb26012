# Each sample's own 2-D organization of the heads the explorer shows in 2-D (explorer.heads_2d:
# the figure heads, whose organization the decompose stage made, then the entropy extremes),
# after the entropy stage that ranks them (docs/method.md §12.3), for the samples the page shows
# (its first explorer.max_samples). One job per sample, beside the rest of the run (an LLM's
# prune), or one job for all shown samples of a small model (organize2d_<k>_samples;
# jobs.batch_max_entries, common.smk); the explorer's page job only reads them.


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
    priority: PRIORITY["chain"]
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


for _k in SHOWN_BATCH_SIZES:

    rule:
        name:
            f"organize2d_{_k}_samples"
        input:
            attention=all_samples(ATTENTION, _k),
            decomposed=all_samples(DECOMPOSED, _k),
            entropy=ENTROPY,
        output:
            store=all_samples(ORGANIZED_2D, _k),
        log:
            f"{R}/logs/{{model}}/organize2d.log",
        benchmark:
            f"{R}/benchmarks/{{model}}/organize2d.tsv"
        wildcard_constraints:
            model=shown_batched_pattern(_k),
        priority: PRIORITY["chain"]
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
            code=code_version(f"organize2d_{_k}_samples", "organize2d"),
        script:
            "../../scripts/organize2d.py"
