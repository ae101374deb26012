# Figures 1-6 of the paper, per model.


rule figures:
    input:
        attention=attention_stores,
        organized=organized_stores,
        decomposed=decomposed_stores,
        entropy=ENTROPY,
    output:
        **{f: report(f"{R}/{{model}}/figures/{f}.png", caption=f"../report/{f}.rst",
                     category="Figures", subcategory="{model}") for f in FIGURES},
    params:
        figures=config["figures"],
        code=code_version("figures"),
    log:
        f"{R}/logs/{{model}}/figures.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/figures.tsv"
    threads: 1
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/figures.py"
