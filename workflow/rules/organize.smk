# The 3-D questionnaire per sample: query, key and head trees and affinities (docs/method.md §5.2).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One job per sample, or, for a model small enough (jobs.batch_max_entries, common.smk), one
# job for each batch of its samples (rules organize_batch_<model>, jobs.batch_max_samples at a
# time): the same per-sample stores, written by one process.


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


for _suffix, _name, _samples in BATCH_JOBS:

    rule:
        name:
            f"organize_batch_{_suffix}"
        input:
            attention=batch_paths(ATTENTION, _name, _samples),
            kernels=KERNELS,
        output:
            store=batch_paths(ORGANIZED, _name, _samples),
        log:
            batch_file("logs", _name, "organize", _samples, BATCH_JOBS),
        benchmark:
            batch_file("benchmarks", _name, "organize", _samples, BATCH_JOBS)
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **batch_resources(_name, _samples, analysis_resources("organize")),
        params:
            analysis=for_model(_name, _samples, analysis_params),
            device=config["device"],
            organize=config["organize"],
            code=code_version(f"organize_batch_{_suffix}", "organize"),
        script:
            "../../scripts/organize.py"
