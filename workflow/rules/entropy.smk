# Haar entropies and sparsity of every head and network, all samples of a model (docs/method.md §6).
# entropy: every analysed model, the softmax-free runs included (ANALYSED_MODEL, common.smk);
# tables, heads: the config's models only.


rule entropy:
    input:
        decomposed=decomposed_stores,
    output:
        store=ENTROPY,
    log:
        f"{R}/logs/{{model}}/entropy.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/entropy.tsv"
    wildcard_constraints:
        model=ANALYSED_MODEL,
    # the analysis chain of a sample before the jobs that read all of it: a long leaf (an LLM's
    # prune) then starts early instead of alone at the end (oattn_lib.plan.PRIORITY)
    priority: PRIORITY["chain"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **analysis_resources("entropy"),
    params:
        head_top_k=config["entropy"]["head_top_k"],
        network_top_k=config["entropy"]["network_top_k"],
        code=code_version("entropy"),
    script:
        "../../scripts/entropy.py"


rule tables:
    input:
        entropy=ENTROPY,
        organized=organized_stores,
        # intervals over the replicates where the model has a `stability` section (stability.smk)
        stability=stability_input,
    output:
        head_tree_csv=f"{R}/{{model}}/tables/head_tree.csv",
        table1_csv=f"{R}/{{model}}/tables/table1.csv",
        table1_md=report(
            f"{R}/{{model}}/tables/table1.md", caption="../report/table1.rst", category="Tables", subcategory="{model}"
        ),
        table2_csv=f"{R}/{{model}}/tables/table2.csv",
        table2_md=report(
            f"{R}/{{model}}/tables/table2.md", caption="../report/table2.rst", category="Tables", subcategory="{model}"
        ),
    log:
        f"{R}/logs/{{model}}/tables.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        fraction=config["entropy"]["fraction"],
        code=code_version("tables"),
    script:
        "../../scripts/tables.py"


# every head's measures per sample, and per head across samples with their intervals, as parquet
# (oattn_lib.heads; the notebook's analyze(...).heads is the same table)
rule heads:
    input:
        entropy=ENTROPY,
        decomposed=decomposed_stores,
        stability=stability_input,
    output:
        rows=f"{R}/{{model}}/heads.parquet",
        summary=f"{R}/{{model}}/heads_summary.parquet",
    log:
        f"{R}/logs/{{model}}/heads.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        fraction=config["entropy"]["fraction"],
        bootstrap=config["claims"]["bootstrap"],
        seed=config["claims"]["seed"],
        code=code_version("heads"),
    script:
        "../../scripts/heads.py"
