# The 3-D questionnaire per sample: query, key and head trees and affinities (SPEC 3.2).
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).


rule organize:
    input:
        attention=ATTENTION,
    output:
        store=ORGANIZED,
    log:
        f"{R}/logs/{{model}}/organize_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/organize_sample{{sample}}.tsv"
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
        organize=config["organize"],
        code=code_version("organize"),
    script:
        "../../scripts/organize.py"
