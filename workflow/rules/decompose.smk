# bi-/tri-Haar expansions, random-tree baselines, the figure heads' 2-D organization and
# paraproduct, and the diffusion map of heads (docs/method.md §3, §5.3, §7, §8).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).
# One job per sample, or one job for all samples of a small model (decompose_<k>_samples;
# jobs.batch_max_entries, common.smk).


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


for _k in BATCH_SIZES:

    rule:
        name:
            f"decompose_{_k}_samples"
        input:
            attention=all_samples(ATTENTION, _k),
            organized=all_samples(ORGANIZED, _k),
        output:
            store=all_samples(DECOMPOSED, _k),
        log:
            f"{R}/logs/{{model}}/decompose.log",
        benchmark:
            f"{R}/benchmarks/{{model}}/decompose.tsv"
        wildcard_constraints:
            model=batched_pattern(_k),
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
            code=code_version(f"decompose_{_k}_samples", "decompose"),
        script:
            "../../scripts/decompose.py"
