# Extraction (GPU-capable): scores and probabilities of every head, one zarr store per sample.
# Every analysed model: the config's and the softmax-free runs (ANALYSED_MODEL, common.smk).


rule extract:
    input:
        unpack(model_data),
        unpack(prepared_model),
        checkpoint=checkpoint_input,
    output:
        store=ATTENTION,
    log:
        f"{R}/logs/{{model}}/extract_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/extract_sample{{sample}}.tsv"
    wildcard_constraints:
        model=ANALYSED_MODEL,
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        **GPU_RESOURCES,
    params:
        model=extraction_params,
        device=config["device"],
        code=code_version("extract"),
    script:
        "../../scripts/extract.py"
