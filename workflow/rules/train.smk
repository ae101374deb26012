# Training (GPU-capable): the project's Transformer-XL and torchvision ViT, seeded.


rule train:
    input:
        npz=f"{R}/{{model}}/data/dataset.npz",
        meta=f"{R}/{{model}}/data/meta.json",
        weights=pretrained_weights,
    output:
        checkpoint=f"{R}/{{model}}/model/checkpoint.pt",
        metrics=report(
            f"{R}/{{model}}/model/metrics.json",
            caption="../report/metrics.rst",
            category="Training",
            subcategory="{model}",
        ),
    log:
        f"{R}/logs/{{model}}/train.log",
    benchmark:
        f"{R}/benchmarks/{{model}}/train.tsv"
    # first among ready jobs: training starts the longest chain (train, extract, organize, ...)
    priority: PRIORITY["train"]
    conda:
        "../../envs/oattn.yaml"
    # one thread (2 gave the tiny models 1.1-1.2x on 2 cores, and held both cores): training
    # runs beside the other models' jobs. More: --set-threads train=N.
    threads: 1
    resources:
        **GPU_RESOURCES,
    params:
        kind=lambda w: model_cfg(w)["kind"],
        arch=lambda w: model_cfg(w)["arch"],
        train=lambda w: model_cfg(w)["train"],
        data=lambda w: model_cfg(w)["data"],
        pretrained=lambda w: model_cfg(w)["pretrained"],
        device=config["device"],
        code=code_version("train"),
    script:
        "../../scripts/train.py"
