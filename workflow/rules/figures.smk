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
