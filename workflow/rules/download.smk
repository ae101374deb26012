# Downloads of the paper's datasets and pretrained weights. Local rules: on a cluster they run
# on the login node, which has the internet where compute nodes may not. Each is skipped when
# its files are already there (place them yourself on an offline machine); the archives are
# checked against their published MD5 (datasets) or SHA-256 prefix (torchvision weights).


localrules:
    download_wikitext103,
    download_cifar10,


rule download_wikitext103:
    output:
        DATASET_FILES["wikitext103"],
    log:
        f"{R}/logs/download/wikitext103.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        dataset="wikitext103",
        root=download_root,
    script:
        "../../scripts/download.py"


rule download_cifar10:
    output:
        DATASET_FILES["cifar10"],
    log:
        f"{R}/logs/download/cifar10.log",
    conda:
        "../../envs/oattn.yaml"
    threads: 1
    params:
        dataset="cifar10",
        root=download_root,
    script:
        "../../scripts/download.py"


if VIT_B_16_WEIGHTS:

    localrules:
        download_vit_b_16_weights,

    rule download_vit_b_16_weights:
        output:
            VIT_B_16_WEIGHTS,
        log:
            f"{R}/logs/download/vit_b_16_weights.log",
        threads: 1
        params:
            dataset="vit_b_16_weights",
            root=download_root,
        script:
            "../../scripts/download.py"
