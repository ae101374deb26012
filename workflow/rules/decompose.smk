# bi-/tri-Haar expansions, random-tree baselines, the figure heads' 2-D organization and
# paraproduct, and the diffusion map of heads (docs/method.md §3, §5.3, §7, §8).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One job per sample, or one job for each batch of a small model's samples
# (decompose_batch_<model>; jobs.batch_max_entries and batch_max_samples, common.smk).


rule decompose:
    input:
        attention=[ATTENTION],
        organized=[ORGANIZED],
    output:
        store=[DECOMPOSED],
    log:
        f"{R}/logs/{{model}}/decompose_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/decompose_sample{{sample}}.tsv"
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
        **analysis_resources("decompose"),
    params:
        analysis=analysis_params,
        device=config["device"],
        decompose=config["decompose"],
        code=code_version("decompose"),
    script:
        "../../scripts/decompose.py"


for _suffix, _name, _samples in BATCH_JOBS:

    rule:
        name:
            f"decompose_batch_{_suffix}"
        input:
            attention=batch_paths(ATTENTION, _name, _samples),
            organized=batch_paths(ORGANIZED, _name, _samples),
        output:
            store=batch_paths(DECOMPOSED, _name, _samples),
        log:
            batch_file("logs", _name, "decompose", _samples, BATCH_JOBS),
        benchmark:
            batch_file("benchmarks", _name, "decompose", _samples, BATCH_JOBS)
        priority: PRIORITY["chain"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **batch_resources(_name, _samples, analysis_resources("decompose")),
        params:
            analysis=for_model(_name, _samples, analysis_params),
            device=config["device"],
            decompose=config["decompose"],
            code=code_version(f"decompose_batch_{_suffix}", "decompose"),
        script:
            "../../scripts/decompose.py"
