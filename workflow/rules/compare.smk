# Pairs of the models' analyses side by side (config `compare`, docs/method.md §15): per pair a
# head-by-head table (one model on two sets of prompts), the per-sample measures of any two models,
# a figure and a page, from each model's heads tables and Table 2.
from oattn_lib.plan import compare_heads, compare_inputs


rule compare:
    input:
        unpack(lambda wildcards: compare_inputs(R, wildcards.a, wildcards.b)),
    output:
        heads=f"{R}/compare/{{a}}_vs_{{b}}/heads.csv",
        models=f"{R}/compare/{{a}}_vs_{{b}}/models.csv",
        figure=report(
            f"{R}/compare/{{a}}_vs_{{b}}/compare.png",
            caption="../report/compare.rst",
            category="Comparisons",
            subcategory="{a} vs {b}",
        ),
        page=f"{R}/compare/{{a}}_vs_{{b}}/compare.html",
    log:
        f"{R}/logs/compare/{{a}}_vs_{{b}}.log",
    wildcard_constraints:
        a=MODEL_NAMES,
        b=MODEL_NAMES,
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        heads=lambda wildcards: compare_heads(config, wildcards.a, wildcards.b),
        permutations=config["claims"]["permutations"],
        bootstrap=config["claims"]["bootstrap"],
        seed=config["claims"]["seed"],
        code=code_version("compare"),
    script:
        "../../scripts/compare.py"
