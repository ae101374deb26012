# How far each number can be trusted (docs/method.md §14): replicate analyses of a model's first
# samples under perturbations that carry no information (one float32 step, float16 rounding,
# renamed items, the Haar basis's tie conventions), a bootstrap over all of its samples, and the
# table of how far each measure moves. For the config's models with a `stability` section
# (STABLE, common.smk); Tables 1-2 and the claims read it. One job per replicated sample
# (stability_sample: its questionnaires, beside the other samples' analyses; a small model's in
# batches), then the model's table (stability: the bootstrap and the summary, seconds).

# One rule per replicated sample, or, for a small model (jobs.batch_max_entries), one for each
# batch of its replicated samples (stability_sample_batch_<model>; oattn_lib.plan.StageRule),
# each sample's replicates in a store of its own.
for _rule in stage_rules("stability_sample", STABILITY_BATCH_JOBS, PLAN.stability_per_sample):

    rule:
        name:
            _rule.name
        input:
            attention=_rule.paths(ATTENTION),
            organized=_rule.paths(ORGANIZED),
            decomposed=_rule.paths(DECOMPOSED),
            kernels=KERNELS,
        output:
            store=_rule.paths(STABILITY_SAMPLE),
        log:
            _rule.log,
        benchmark:
            _rule.benchmark
        wildcard_constraints:
            **_rule.constraints,
        priority: PRIORITY["long_leaf"]
        conda:
            "../../envs/oattn.yaml"
        threads: 1
        resources:
            **ANALYSIS_GPU,
            **_rule.resources(analysis_resources("stability")),
        params:
            samples=_rule.job_samples,
            settings=_rule.bind(replicate_settings),
            analysis=_rule.bind(analysis_params),
            device=config["device"],
            organize=config["organize"],
            entropy=ENTROPY_TOP_K,
            questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
            code=code_version(_rule.name, "stability_sample"),
        script:
            "../../scripts/stability_sample.py"


rule stability:
    input:
        replicates=stability_stores,
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
