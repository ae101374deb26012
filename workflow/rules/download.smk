# Downloads of the paper's datasets and pretrained weights. Local rules: on a cluster they run
# on the login node, which has the internet where compute nodes may not. Each is skipped when
# its files are already there (place them yourself on an offline machine); the archives are
# checked against their published MD5 (datasets) or SHA-256 prefix (torchvision weights).

localrules:
    download_wikitext103,
    download_cifar10,


DATA_ROOT = config["data_root"]
WIKITEXT103_FILES = [f"{DATA_ROOT}/wikitext-103/wiki.{s}.tokens" for s in ("train", "valid", "test")]
CIFAR10_FILES = [f"{DATA_ROOT}/cifar-10-batches-py/{b}"
                 for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]]


def dataset_files(wildcards):
    """The downloaded files a model's prepare_data reads ([] for stdlib text and digits)."""
    m = MODELS[wildcards.model]
    data = m.get("data", {})
    if m["kind"] in ("txl", "hf") and data.get("corpus") == "wikitext103":
        return WIKITEXT103_FILES
    if m["kind"] == "vit" and data.get("dataset") == "cifar10":
        return CIFAR10_FILES
    return []


def _vit_b_16_weights_file():
    # imported only when a model needs the weights: torch's import costs seconds per job
    if not any(m["kind"] == "vit" and m.get("pretrained") for m in MODELS.values()):
        return None
    from oattn_lib.models.vit import vit_b_16_weights_path
    return str(vit_b_16_weights_path())


VIT_B_16_WEIGHTS = _vit_b_16_weights_file()


def pretrained_weights(wildcards):
    """The torchvision weights file a model's train job starts from ([] unless pretrained)."""
    m = MODELS[wildcards.model]
    if m["kind"] == "vit" and m.get("pretrained") and VIT_B_16_WEIGHTS:
        return VIT_B_16_WEIGHTS
    return []


rule download_wikitext103:
    output:
        WIKITEXT103_FILES,
    params:
        dataset="wikitext103",
        root=DATA_ROOT,
    log:
        f"{R}/logs/download/wikitext103.log",
    threads: 1
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/download.py"


rule download_cifar10:
    output:
        CIFAR10_FILES,
    params:
        dataset="cifar10",
        root=DATA_ROOT,
    log:
        f"{R}/logs/download/cifar10.log",
    threads: 1
    conda:
        "../../envs/oattn.yaml"
    script:
        "../../scripts/download.py"


if VIT_B_16_WEIGHTS:

    localrules:
        download_vit_b_16_weights,

    rule download_vit_b_16_weights:
        output:
            VIT_B_16_WEIGHTS,
        params:
            dataset="vit_b_16_weights",
            root=DATA_ROOT,
        log:
            f"{R}/logs/download/vit_b_16_weights.log",
        threads: 1
        script:
            "../../scripts/download.py"
