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
    # with training, which it gates (the longest chain of a run): a text model's data has no
    # inputs, and the greedy scheduler, largest inputs first, would start its training late
    priority: PRIORITY["train"]
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    resources:
        mem_mb=4000,
    params:
        kind=lambda w: model_cfg(w)["kind"],
        data=lambda w: model_cfg(w)["data"],
        # what decides the candidate samples it counts (a corpus model's tokenizer and
        # max_length); its n_samples is read by the script, not a param (no rerun)
        candidates=lambda w: adapter(model_cfg(w)).candidates_params(model_cfg(w)),
        data_root=config["data_root"],
        code=code_version("prepare_data"),
    script:
        "../../scripts/prepare_data.py"
