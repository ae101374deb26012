# Datasets: text splits and vocabularies, images, held-out texts for pretrained models.


rule prepare_data:
    input:
        dataset_files,
    output:
        npz=f"{R}/{{model}}/data/dataset.npz",
        meta=f"{R}/{{model}}/data/meta.json",
    log:
        f"{R}/logs/{{model}}/prepare_data.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/prepare_data.tsv"
    # before the other ready jobs (after training): a trained model's data gates its training,
    # the longest chain of a run; without it the last model's data came after other models'
    # extractions, and its training started 100 s late
    priority: 5
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        mem_mb=4000,
    params:
        kind=lambda w: model_cfg(w)["kind"],
        data=lambda w: model_cfg(w)["data"],
        data_root=config["data_root"],
        code=code_version("prepare_data"),
    script:
        "../../scripts/prepare_data.py"
