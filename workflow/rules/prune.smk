# Head ablation (GPU-capable; beyond the paper): does low Haar entropy mean a head can go?
# Every ranking masks its first k heads; the network is measured on held-out data
# (Figure 7, Table 3) and each ranking's stability across samples is compared (Table 4).
# The bottom-k test (bottom.csv): each ranking's first round(entropy.fraction x heads) heads
# masked, beside every (or random) set of as many heads.


rule prune:
    input:
        unpack(prepared_model),
        npz=f"{R}/{{model}}/data/dataset.npz",
        meta=f"{R}/{{model}}/data/meta.json",
        checkpoint=checkpoint_input,
        attention=attention_stores,
        entropy=ENTROPY,
        held_out_texts=held_out_texts,
    output:
        curves=f"{R}/{{model}}/prune/curves.csv",
        rankings=f"{R}/{{model}}/prune/rankings.csv",
        bottom=f"{R}/{{model}}/prune/bottom.csv",
        finding=f"{R}/{{model}}/prune/finding.rst",
        fig7=report(
            f"{R}/{{model}}/figures/fig7.png", caption="../report/fig7.rst", category="Figures", subcategory="{model}"
        ),
        table3_csv=f"{R}/{{model}}/tables/table3.csv",
        table3_md=report(
            f"{R}/{{model}}/tables/table3.md", caption="../report/table3.rst", category="Tables", subcategory="{model}"
        ),
        table4_csv=f"{R}/{{model}}/tables/table4.csv",
        table4_md=report(
            f"{R}/{{model}}/tables/table4.md", caption="../report/table4.rst", category="Tables", subcategory="{model}"
        ),
    log:
        f"{R}/logs/{{model}}/prune.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/prune.tsv"
    # the longest job after training (an LLM's masked forward passes): before figures and pages
    priority: PRIORITY["long_leaf"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **model_job_resources("prune"),
    params:
        model=prune_model_params,
        prune=lambda wildcards: {k: v for k, v in PRUNE[wildcards.model].items() if k != "enabled"},
        # the bottom set's size, Table 1's: a change reruns prune
        fraction=config["entropy"]["fraction"],
        device=config["device"],
        code=code_version("prune"),
    script:
        "../../scripts/prune.py"
