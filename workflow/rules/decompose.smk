# bi-/tri-Haar expansions, random-tree baselines, the figure heads' 2-D organization and
# paraproduct, and the diffusion map of heads (SPEC 2, 3.3, 5, 6).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).


rule decompose:
    input:
        attention=ATTENTION,
        organized=ORGANIZED,
    output:
        store=DECOMPOSED,
    log:
        f"{R}/logs/{{model}}/decompose_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/decompose_sample{{sample}}.tsv"
    wildcard_constraints:
        model=ANALYSED_MODEL,
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        mem_mb=analysis_mem_mb,
        runtime=config["resources"]["analysis_runtime"],
        **ANALYSIS_GPU,
    params:
        analysis=analysis_params,
        device=config["device"],
        decompose=config["decompose"],
        code=code_version("decompose"),
    script:
        "../../scripts/decompose.py"
