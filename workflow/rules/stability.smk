# How far each number can be trusted (docs/method.md §14): replicate analyses of a model's first
# samples under perturbations that carry no information (one float32 step, float16 rounding,
# renamed items, the Haar basis's tie conventions), a bootstrap over all of its samples, and the
# table of how far each measure moves. For the config's models with a `stability` section
# (STABLE, common.smk); Tables 1-2 and the claims read it.


rule stability:
    input:
        attention=stability_stores(ATTENTION),
        organized=stability_stores(ORGANIZED),
        decomposed=stability_stores(DECOMPOSED),
        entropy=ENTROPY,
        kernels=KERNELS,
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
    priority: PRIORITY["long_leaf"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **ANALYSIS_GPU,
        **analysis_resources("stability"),
    params:
        samples=lambda wildcards: STABLE[wildcards.model],
        settings=lambda wildcards: MODELS[wildcards.model]["stability"],
        analysis=analysis_params,
        device=config["device"],
        organize=config["organize"],
        entropy=config["entropy"],
        questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
        code=code_version("stability"),
    script:
        "../../scripts/stability.py"
