# The 3-D questionnaire per sample: query, key and head trees and affinities (SPEC 3.2).


rule organize:
    input:
        attention=ATTENTION,
    output:
        store=ORGANIZED,
    params:
        analysis=analysis_params,
        organize=config["organize"],
        code=code_version("organize"),
    log:
        f"{R}/logs/{{model}}/organize_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/organize_sample{{sample}}.tsv"
    threads: 1
    resources:
        mem_mb=analysis_mem_mb,
        runtime=config["resources"]["analysis_runtime"],
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/organize.py"
