# Figures 1-6 of the paper, per model, and where Theorem 1 holds: the paraproduct's relative
# residual against logit temperature (its curves, crossovers and the caption's finding beside it).


rule figures:
    input:
        attention=attention_stores,
        organized=organized_stores,
        decomposed=decomposed_stores,
        entropy=ENTROPY,
    output:
        **{
            f: report(
                f"{R}/{{model}}/figures/{f}.png",
                caption=f"../report/{f}.rst",
                category="Figures",
                subcategory="{model}",
            )
            for f in FIGURES
        },
        temperature=report(
            f"{R}/{{model}}/figures/temperature.png",
            caption="../report/temperature.rst",
            category="Figures",
            subcategory="{model}",
        ),
        temperature_csv=f"{R}/{{model}}/figures/temperature.csv",
        temperature_json=f"{R}/{{model}}/figures/temperature.json",
        temperature_finding=f"{R}/{{model}}/figures/temperature.rst",
    log:
        f"{R}/logs/{{model}}/figures.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/figures.tsv"
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **analysis_resources("figures"),
    params:
        figures=config["figures"],
        analysis=analysis_params,
        code=code_version("figures"),
    script:
        "../../scripts/figures.py"


# Theorem 1 and Corollary 1 on every head of every sample (or a seeded random subset per
# sample): each head's 2-D organized order against its original order and random orders. The
# claims read its table. It asks for one head's memory and the time of the head-samples it
# measures (oattn_lib.resources.HEAD_JOBS).
rule theorem1:
    input:
        attention=theorem1_attention,
        kernels=KERNELS,
    output:
        csv=f"{R}/{{model}}/figures/theorem1.csv",
        curves=f"{R}/{{model}}/figures/theorem1_curves.csv",
    log:
        f"{R}/logs/{{model}}/theorem1.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/theorem1.tsv"
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **ANALYSIS_GPU,
        **theorem1_resources(),
    params:
        device=config["device"],
        theorem1=config["theorem1"],
        questionnaire2d_iters=config["decompose"]["questionnaire2d_iters"],
        crop=analysis_crop,
        code=code_version("theorem1"),
    script:
        "../../scripts/theorem1.py"
