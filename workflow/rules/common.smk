# Input functions, wildcard constraints and config helpers shared by the rules.
import json
import os
import re

R = config["results"]
MODELS = {m["name"]: m for m in config["models"]}
FIGURES = [f"fig{i}" for i in range(1, 7)]


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS),
    sample=r"\d+",


def model_cfg(wildcards):
    return MODELS[wildcards.model]


def samples(model):
    return range(MODELS[model]["extract"]["n_samples"])


def attention_stores(wildcards):
    return [f"{R}/{wildcards.model}/attention/sample{i}.zarr" for i in samples(wildcards.model)]


def decomposed_stores(wildcards):
    return [f"{R}/{wildcards.model}/decomposed/sample{i}.zarr" for i in samples(wildcards.model)]


def organized_stores(wildcards):
    return [f"{R}/{wildcards.model}/organized/sample{i}.zarr" for i in samples(wildcards.model)]


def checkpoint_input(wildcards):
    if MODELS[wildcards.model]["kind"] == "hf":
        return []
    return f"{R}/{wildcards.model}/model/checkpoint.pt"


def analysis_params(wildcards):
    """What organize and everything after it read from a model's extraction config."""
    ex = MODELS[wildcards.model]["extract"]
    return {"quantity": ex["quantity"], "crop": ex.get("crop")}


def extraction_params(wildcards):
    """What extraction reads: the model, not the analysed quantity (both are stored)."""
    m = MODELS[wildcards.model]
    ex = {k: v for k, v in m["extract"].items() if k not in ("quantity", "crop")}
    return {**{k: v for k, v in m.items() if k != "extract"}, "extract": ex}


def _gpu_resources():
    """Cluster resources of the GPU-capable rules (train, extract), from config["resources"]."""
    r = config["resources"]
    res = {"mem_mb": r["gpu_mem_mb"], "runtime": r["gpu_runtime"]}
    if r["gpu"] > 0:
        res.update(gpu=r["gpu"], cpus_per_gpu=r["cpus_per_gpu"])
    return res


GPU_RESOURCES = _gpu_resources()


def analysis_mem_mb(wildcards, input, attempt):
    # the per-sample analysis holds a few copies of the tensor and its coefficients
    size_mb = sum(os.path.getsize(os.path.join(dp, f)) for p in input
                  for dp, _, fs in os.walk(p) for f in fs) / 1e6 if input else 100
    return int(1000 + 30 * size_mb) * attempt


def all_targets():
    out = [f"{R}/summary.md"]
    for name in MODELS:
        out += [f"{R}/{name}/figures/{f}.png" for f in FIGURES]
        if config["prune"]["enabled"]:
            out += [f"{R}/{name}/figures/fig7.png", f"{R}/{name}/tables/table3.md",
                    f"{R}/{name}/tables/table4.md"]
    # the softmax-free experiment (softmax_free.smk): when enabled, and once it has been run,
    # so that the report keeps its Table 5
    sf_table = f"{R}/softmax_free/table5.md"
    if config["softmax_free"]["enabled"] or os.path.exists(sf_table):
        out += [sf_table, f"{R}/softmax_free/fig8.png"]
    return out
