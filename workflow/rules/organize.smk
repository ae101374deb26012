# The 3-D questionnaire per sample: query, key and head trees and affinities (docs/method.md §5.2).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One job per sample, or, for a model small enough (jobs.batch_max_entries, common.smk), one
# job for all of its samples (rules organize_<k>_samples, one per sample count k): the same
# per-sample stores, written by one process.


rule organize:
    input:
        attention=[ATTENTION],
        kernels=KERNELS,
    output:
        store=[ORGANIZED],
    log:
        f"{R}/logs/{{model}}/organize_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/organize_sample{{sample}}.tsv"
    wildcard_constraints:
        model=PER_SAMPLE_MODEL,
    # the analysis chain of a sample before the jobs that read all of it: a long leaf (an LLM's
    # prune) then starts early instead of alone at the end (common.smk, PRIORITY)
    priority: PRIORITY["chain"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **ANALYSIS_GPU,
        **analysis_resources("organize"),
    params:
        analysis=analysis_params,
        device=config["device"],
        organize=config["organize"],
        code=code_version("organize"),
    script:
        "../../scripts/organize.py"


for _k in BATCH_SIZES:

    rule:
        name:
            f"organize_{_k}_samples"
        input:
            attention=all_samples(ATTENTION, _k),
            kernels=KERNELS,
        output:
            store=all_samples(ORGANIZED, _k),
        log:
            f"{R}/logs/{{model}}/organize.log",
        benchmark:
            f"{R}/benchmarks/{{model}}/organize.tsv"
        wildcard_constraints:
            model=batched_pattern(_k),
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **analysis_resources("organize"),
        params:
            analysis=analysis_params,
            device=config["device"],
            organize=config["organize"],
            code=code_version(f"organize_{_k}_samples", "organize"),
        script:
            "../../scripts/organize.py"
