# Extraction (GPU-capable): scores and probabilities of every head, one zarr store per sample.


rule extract:
    input:
        npz=f"{R}/{{model}}/data/dataset.npz",
        meta=f"{R}/{{model}}/data/meta.json",
        checkpoint=checkpoint_input,
    output:
        store=ATTENTION,
    params:
        model=extraction_params,
        device=config["device"],
        code=code_version("extract"),
    log:
        f"{R}/logs/{{model}}/extract_sample{{sample}}.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/extract_sample{{sample}}.tsv"
    threads: 1
    resources:
        **GPU_RESOURCES,
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/extract.py"
