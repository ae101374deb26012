# How far each number can be trusted (docs/method.md §14): replicate analyses of a model's first
# samples under perturbations that carry no information (one float32 step, float16 rounding,
# renamed items, the Haar basis's tie conventions), a bootstrap over all of its samples, and the
# table of how far each measure moves. For the config's models with a `stability` section
# (STABLE, common.smk); Tables 1-2 and the claims read it. One job per replicated sample
# (stability_sample: its questionnaires, beside the other samples' analyses; a small model's in
# batches), then the model's table (stability: the bootstrap and the summary, seconds).

# what the replicates read of the entropy settings: the entropies' numbers of coefficients
REPLICATE_TOP_K = {k: config["entropy"][k] for k in ("head_top_k", "network_top_k")}


rule stability_sample:
    input:
        attention=[ATTENTION],
        organized=[ORGANIZED],
        decomposed=[DECOMPOSED],
        kernels=KERNELS,
    output:
        store=[STABILITY_SAMPLE],
    log:
        f"{R}/logs/{{model}}/stability_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/stability_sample{{sample}}.tsv"
    wildcard_constraints:
        model=name_pattern([n for n in STABLE if n not in BATCHED]),
    priority: PRIORITY["long_leaf"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **ANALYSIS_GPU,
        **analysis_resources("stability"),
    params:
        samples=job_samples,
        settings=lambda wildcards: stability_replicate_settings(wildcards.model),
        analysis=analysis_params,
        device=config["device"],
        organize=config["organize"],
        entropy=REPLICATE_TOP_K,
        questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
        code=code_version("stability_sample"),
    script:
        "../../scripts/stability_sample.py"


# a small model's replicated samples (jobs.batch_max_entries, common.smk): one job for each batch
# of them (rules stability_sample_batch_<model>), each sample's replicates in a store of its own
for _suffix, _name, _samples in STABILITY_BATCH_JOBS:

    rule:
        name:
            f"stability_sample_batch_{_suffix}"
        input:
            attention=batch_paths(ATTENTION, _name, _samples),
            organized=batch_paths(ORGANIZED, _name, _samples),
            decomposed=batch_paths(DECOMPOSED, _name, _samples),
            kernels=KERNELS,
        output:
            store=batch_paths(STABILITY_SAMPLE, _name, _samples),
        log:
            batch_file("logs", _name, "stability_sample", _samples, STABILITY_BATCH_JOBS),
        benchmark:
            batch_file("benchmarks", _name, "stability_sample", _samples, STABILITY_BATCH_JOBS)
        priority: PRIORITY["long_leaf"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **batch_resources(_name, _samples, analysis_resources("stability")),
        params:
            samples=_samples,
            settings=stability_replicate_settings(_name),
            analysis=for_model(_name, _samples, analysis_params),
            device=config["device"],
            organize=config["organize"],
            entropy=REPLICATE_TOP_K,
            questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
            code=code_version(f"stability_sample_batch_{_suffix}", "stability_sample"),
        script:
            "../../scripts/stability_sample.py"


rule stability:
    input:
        replicates=stability_stores(STABILITY_SAMPLE),
        entropy=ENTROPY,
    output:
        store=STABILITY,
        csv=f"{R}/{{model}}/tables/stability.csv",
        md=report(
            f"{R}/{{model}}/tables/stability.md",
            caption="../report/stability.rst",
            category="Tables",
            subcategory="{model}",
        ),
    log:
        f"{R}/logs/{{model}}/stability.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/stability.tsv"
    wildcard_constraints:
        model=name_pattern(STABLE),
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    # it reads per-sample summaries as the entropy job does, no tensor: the entropy job's model
    resources:
        **analysis_resources("entropy"),
    params:
        samples=lambda wildcards: STABLE[wildcards.model],
        settings=lambda wildcards: MODELS[wildcards.model]["stability"],
        fraction=config["entropy"]["fraction"],
        code=code_version("stability"),
    script:
        "../../scripts/stability.py"
