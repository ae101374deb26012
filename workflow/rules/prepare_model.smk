# GGUF models (an hf model's gguf_file, or the smollm2 alias), dequantised once to a float32
# safetensors directory that the model's extract and prune jobs load in about a second.


rule prepare_model:
    input:
        gguf=gguf_source,
    output:
        config=PREPARED["prepared"],
        weights=PREPARED["prepared_weights"],
    log:
        f"{R}/logs/{{model}}/prepare_model.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/prepare_model.tsv"
    wildcard_constraints:
        model=name_pattern(GGUF_MODELS),
    # a GGUF model's extraction and everything after it wait for it (oattn_lib.plan.PRIORITY)
    priority: PRIORITY["chain"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        mem_mb=prepare_mem_mb,
        runtime=config["resources"]["analysis_runtime"],
    params:
        path=lambda w: GGUF_MODELS[w.model]["path"],
        gguf_file=lambda w: GGUF_MODELS[w.model].get("gguf_file"),
        code=code_version("prepare_model"),
    script:
        "../../scripts/prepare_model.py"
