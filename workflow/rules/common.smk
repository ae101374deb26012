# Input functions, wildcard constraints and config helpers shared by the rules.
#
# The config reaching this file is complete (schema defaults filled in) and canonical (keys
# sorted, numbers in the schema's types: oattn_lib.config.validate_config), so the params
# of the rules compare by value: the same config written in another key order or number
# form plans nothing.
import functools
import json
import os
import re

from oattn_lib import fingerprint, softmax_free
from oattn_lib.both_masked import both_masked_models, masked_other_jobs
from oattn_lib import resources as oattn_resources
from oattn_lib.config import (
    batch_jobs,
    batched_samples,
    compare_targets,
    explorer_parts,
    prune_settings,
    shown_samples,
    stability_samples,
)
from oattn_lib.models import adapter
from oattn_lib.runtime import KERNEL_MODULES
from oattn_lib.models.files import is_gguf_model, resolve_hf

R = config["results"]
# the config's models: every rule, the tables, figures and summary
MODELS = {m["name"]: m for m in config["models"]}
# each model's head-ablation settings: the top-level `prune`, or the model's own `prune` merged over it
PRUNE = {name: prune_settings(config, m) for name, m in MODELS.items()}
# the models the prune stage runs for: enabled, and of a kind whose heads can be masked (kind
# attention holds no model; its summary says why prune was not run)
PRUNED = {name for name, m in MODELS.items() if PRUNE[name]["enabled"] and adapter(m).prunes}
# the softmax-free experiment's runs (softmax_free.smk), generated from the config: models
# named softmax_free/<model>/<attention>/seed<k>, stored under results/<that name>/, trained
# by softmax_free_train and analysed by the extract, organize, decompose and entropy rules
# (ANALYSED_MODEL), never by tables, figures, prune or the summary
SF = config["softmax_free"]
SF_DIR = f"{R}/{softmax_free.PREFIX}"
SF_MODELS = softmax_free.run_models(config)
ANALYSED = {**MODELS, **SF_MODELS}
# the config's models with a `stability` section: name -> the samples that get replicates (stability.smk)
STABLE = {name: stability_samples(m) for name, m in MODELS.items() if stability_samples(m)}


def stability_replicate_settings(model):
    """What a model's stability_sample jobs read of its `stability` section: not which samples
    are replicated nor the bootstrap (the stability job's), so changing those reruns no replicate."""
    return {k: v for k, v in MODELS[model]["stability"].items() if k not in ("samples", "bootstrap")}


FIGURES = [f"fig{i}" for i in range(1, 7)]


# Job priorities (Snakemake starts the ready job of highest priority first; its scheduler knows
# nothing of run times). Training first (the longest chain), then every step of a sample's
# analysis chain (data, GGUF preparation, extract, organize, decompose, entropy), then the long
# leaves, prune (an LLM's masked forward passes) and stability (a questionnaire per replicate),
# then the leaves that read everything (tables, figures, pages, summary) and the pages' own jobs
# after the entropy stage (organize2d, explorer_plan, explorer_samples). Measured on the default
# run, 2 cores: with only training first, SmolLM2's extraction waited for the small models'
# figures and its prune ran alone for the last two minutes of the run. On the LLM preset, with
# organize2d and the explorer's jobs in the chain and stability among the leaves, prune waited
# 9 minutes after the entropy stage for their 20 jobs, and stability (27 minutes: 2 samples x 7
# replicates at 1024 tokens) started 14 minutes after it and ended the run alone.
PRIORITY = {"train": 10, "chain": 5, "long_leaf": 1}


def name_pattern(names):
    return "|".join(re.escape(n) for n in names) or "(?!)"


ANALYSED_MODEL = name_pattern(ANALYSED)
MODEL_NAMES = name_pattern(MODELS)


wildcard_constraints:
    model=name_pattern(MODELS),
    sample=r"\d+",


def model_cfg(wildcards):
    return ANALYSED[wildcards.model]


def samples(model):
    return range(ANALYSED[model]["extract"]["n_samples"])


def store(path):
    """A zarr store as an input or output of a rule: its root zarr.json, a plain file. A directory()
    output would get Snakemake's .snakemake_timestamp marker inside the store, which zarr
    then warns about every time a user opens it."""
    return f"{path}/zarr.json"


ATTENTION = store(f"{R}/{{model}}/attention/sample{{sample}}.zarr")
ORGANIZED = store(f"{R}/{{model}}/organized/sample{{sample}}.zarr")
DECOMPOSED = store(f"{R}/{{model}}/decomposed/sample{{sample}}.zarr")
ENTROPY = store(f"{R}/{{model}}/entropy.zarr")
ORGANIZED_2D = store(f"{R}/{{model}}/organized2d/sample{{sample}}.zarr")
STABILITY = store(f"{R}/{{model}}/stability.zarr")
STABILITY_SAMPLE = store(f"{R}/{{model}}/stability/sample{{sample}}.zarr")


# -- jobs: one per sample, or one for all samples of a small model ------------------------
# A model whose per-sample tensor has at most jobs.batch_max_entries entries runs extract,
# organize and decompose as one job for all its samples, at most jobs.batch_max_samples at a
# time (rules <stage>_batch_<model>, config.batch_jobs), writing the same per-sample stores:
# such a job's work is shorter than a job's start-up, which the model then pays once per batch
# instead of once per sample. The batch rules' outputs are the model's own paths, no wildcards:
# Snakemake's output index then finds each file's producer at once (outputs with a {model}
# wildcard would all share the prefix "results/", and a batch of n samples plan in n^2).
BATCHED = {n for n, m in ANALYSED.items() if batched_samples(m, config["jobs"]["batch_max_entries"])}
PER_SAMPLE_MODEL = name_pattern([n for n in ANALYSED if n not in BATCHED])
BATCH_JOBS = batch_jobs({n: samples(n) for n in ANALYSED if n in BATCHED}, config["jobs"]["batch_max_samples"])


class BatchWildcards:
    """The wildcards a batch rule's functions are given (`for_model`): attributes, and `keys()`
    as Snakemake's own wildcards have."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def keys(self):
        return self.__dict__.keys()


def for_model(name, indices, fn):
    """`fn` (an input, params or resources function of the job's wildcards) for a batch rule of
    model `name`'s samples `indices`, whose outputs have no wildcards: it is given wildcards
    `model` and `batch` (the samples' indices; `job_samples` reads it). Its signature,
    which Snakemake reads to pass `input`, `attempt` and the like, is `fn`'s."""
    bound = BatchWildcards(model=name, batch=list(indices))

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "wildcards" in kwargs:
            kwargs["wildcards"] = bound
        else:
            args = (bound, *args[1:])
        return fn(*args, **kwargs)

    return call


def job_samples(wildcards):
    """The samples a job of a model's per-sample stage analyses: its own, its batch's, or all."""
    if "sample" in wildcards.keys():
        return [int(wildcards.sample)]
    if "batch" in wildcards.keys():
        return list(wildcards.batch)
    return list(samples(wildcards.model))


def batch_paths(pattern, name, indices):
    """The paths of `pattern` of model `name`'s samples `indices`."""
    return [pattern.format(model=name, sample=i) for i in indices]


def batch_file(folder, name, stage, indices, jobs):
    """A batch job's log or benchmark: <folder>/<model>/<stage>.<ext> (folder `logs`: .log, else
    .tsv) for a model batched in one job of `jobs`, <stage>_samples<first>-<last>.<ext> where it
    has several."""
    ext = "log" if folder == "logs" else "tsv"
    whole = sum(1 for _, n, _ in jobs if n == name) == 1
    tail = "" if whole else f"_samples{indices[0]}-{indices[-1]}"
    return f"{R}/{folder}/{name}/{stage}{tail}.{ext}"


def batch_resources(name, indices, resources):
    """A stage's resources (`model_job_resources`, `analysis_resources`) for a batch rule: its
    callables bound to the batch (`for_model`), its numbers as they are."""
    return {k: for_model(name, indices, v) if callable(v) else v for k, v in resources.items()}


# the numba kernels, compiled once before the jobs that run them (kernels.smk). An input of
# organize, decompose and softmax_free_paraproduct, and not ancient(): Snakemake 9 then skips
# the jobs after a rerun kernels job (an edit of emd.py planned kernels and not organize).
# The kernels job reruns only when the kernels' own modules change, which every consumer runs.
KERNELS = f"{R}/kernels/numba.json"


# -- the other rule for masked entries (masked_other.smk, oattn_lib.both_masked) ----------
MASKED_OTHER = both_masked_models(config)
MASKED_OTHER_ORGANIZED = store(f"{R}/{{model}}/masked_{{masked}}/organized/sample{{sample}}.zarr")
MASKED_OTHER_DECOMPOSED = store(f"{R}/{{model}}/masked_{{masked}}/decomposed/sample{{sample}}.zarr")
MASKED_OTHER_ENTROPY = store(f"{R}/{{model}}/masked_{{masked}}/entropy.zarr")
MASKED_OTHER_JOBS = masked_other_jobs({n: samples(n) for n in MASKED_OTHER})


def masked_other_paths(pattern, name):
    """The stores of `pattern` (MASKED_OTHER_ORGANIZED, _DECOMPOSED: one per sample; _ENTROPY: one)
    of model `name` under its other rule."""

    def fill(i):
        return pattern.format(model=name, masked=MASKED_OTHER[name], sample=i)

    return [fill(i) for i in samples(name)] if "{sample}" in pattern else fill(0)


def masked_other_params(wildcards):
    """analysis_params with the rule for masked entries the other one (MASKED_OTHER)."""
    return {**analysis_params(wildcards), "masked": MASKED_OTHER[wildcards.model]}


def stability_stores(pattern):
    """Input function: the per-sample stores of `pattern` of the model's stability samples."""
    return lambda wildcards: [pattern.format(model=wildcards.model, sample=i) for i in STABLE[wildcards.model]]


def attention_stores(wildcards):
    return [ATTENTION.format(model=wildcards.model, sample=i) for i in samples(wildcards.model)]


def theorem1_attention(wildcards):
    """The attention stores the theorem1 job measures: the first theorem1.samples, or all."""
    k = config["theorem1"]["samples"]
    chosen = samples(wildcards.model) if k == "all" else samples(wildcards.model)[: int(k)]
    return [ATTENTION.format(model=wildcards.model, sample=i) for i in chosen]


def decomposed_stores(wildcards):
    return [DECOMPOSED.format(model=wildcards.model, sample=i) for i in samples(wildcards.model)]


def organized_stores(wildcards):
    return [ORGANIZED.format(model=wildcards.model, sample=i) for i in samples(wildcards.model)]


def explorer_samples_of(model):
    """The samples a model's explorer page shows: its first explorer.max_samples. Only these get
    their 2-D organizations (organize2d) made."""
    return range(shown_samples(len(samples(model)), config["explorer"]["max_samples"]))


# the batched models' organize2d jobs: the samples their pages show, in batches as above
# a batched model's replicated samples (stability.smk), in batches as its other stages' samples
STABILITY_BATCH_JOBS = batch_jobs({n: STABLE[n] for n in STABLE if n in BATCHED}, config["jobs"]["batch_max_samples"])
SHOWN_BATCH_JOBS = batch_jobs(
    {n: explorer_samples_of(n) for n in ANALYSED if n in BATCHED and n in MODELS}, config["jobs"]["batch_max_samples"]
)


def shown_stores(pattern):
    """Input function: the stores of `pattern` of the samples a model's explorer page shows."""
    return lambda wildcards: [
        pattern.format(model=wildcards.model, sample=i) for i in explorer_samples_of(wildcards.model)
    ]


# what the organize2d rules read of the config: the heads the explorer shows in 2-D
# (explorer.heads_2d, the figure heads first) and the 2-D questionnaire's iterations
ORGANIZE2D = {
    "figure_heads": config["decompose"]["figure_heads"],
    "questionnaire2d_iters": config["decompose"]["questionnaire2d_iters"],
    "heads_2d": config["explorer"]["heads_2d"],
}


# -- code fingerprints -------------------------------------------------------------------
# the library beside the workflow's Snakefile (a clone's, a copy's), else the installed one
LIBRARY_ROOT = fingerprint.library_beside(OATTN_LOCAL)


def code_version(rule_name, script=None, modules=None):
    """Param `code`: the fingerprint of the library code (and its declared assets) that the
    rule's script scripts/<script>.py runs, or of the library `modules` (rule kernels), so that
    editing oattn_lib/questionnaire.py reruns organize and what follows, and never training
    (oattn_lib.fingerprint.code_version)."""
    script = script or rule_name
    path = None if modules is not None else fingerprint.workflow_file(workflow, OATTN_HOME, f"scripts/{script}.py")
    return fingerprint.code_version(workflow, rule_name, script, script=path, modules=modules, root=LIBRARY_ROOT)


def model_data(wildcards):
    """A model's dataset: a softmax-free run reads its base model's."""
    name = ANALYSED[wildcards.model].get("softmax_free", {}).get("model", wildcards.model)
    return {"npz": f"{R}/{name}/data/dataset.npz", "meta": f"{R}/{name}/data/meta.json"}


# -- GGUF models (prepare_model.smk) -------------------------------------------------------
# an hf model stored as GGUF is dequantised once to a safetensors directory, which its
# extract and prune jobs load (the directory is named by its two files)
GGUF_MODELS = {n: m for n, m in MODELS.items() if is_gguf_model(m)}
PREPARED = {
    "prepared": f"{R}/{{model}}/model/config.json",
    "prepared_weights": f"{R}/{{model}}/model/model.safetensors",
}


def prepared_model(wildcards):
    """Inputs `prepared` and `prepared_weights` of a GGUF model's jobs ({} for other models)."""
    if wildcards.model not in GGUF_MODELS:
        return {}
    return {k: v.format(model=wildcards.model) for k, v in PREPARED.items()}


def gguf_source(wildcards):
    """The local GGUF file prepare_model reads ([] for a hub id)."""
    m = GGUF_MODELS[wildcards.model]
    directory, name = resolve_hf(m["path"], m.get("gguf_file"))
    path = os.path.join(directory, name)
    return path if os.path.isfile(path) else []


def prepare_mem_mb(wildcards, input, attempt):
    # two copies of the dequantised float32 weights, their parameters read from the GGUF header
    return oattn_resources.prepare_memory_mb(input.gguf or None, attempt)


def user_inputs(wildcards):
    """The user's files an extract job reads itself (kind attention: the files of its samples), so
    that editing one reruns the analysis of its own samples only ([] for the other kinds)."""
    m = ANALYSED[wildcards.model]
    return adapter(m).sample_files(m, job_samples(wildcards))


def checkpoint_input(wildcards):
    """The trained checkpoint a model's extract and prune jobs read ([] for a kind the workflow
    does not train)."""
    if not adapter(ANALYSED[wildcards.model]).trains:
        return []
    return f"{R}/{wildcards.model}/model/checkpoint.pt"


def analysis_params(wildcards):
    """What organize and everything after it read from a model's extraction config: the rule for
    masked entries only where scores are analysed (probabilities are 0 there whatever it says, so
    changing it reruns nothing of a model analysing probs)."""
    ex = ANALYSED[wildcards.model]["extract"]
    masked = ex["masked"] if ex["quantity"] == "scores" else "keep"
    return {"quantity": ex["quantity"], "crop": ex.get("crop"), "masked": masked}


def analysis_crop(wildcards):
    """The crop alone, for the rules that read the scores as stored (the temperature figure, theorem1)."""
    return ANALYSED[wildcards.model]["extract"].get("crop")


def extraction_params(wildcards):
    """What extraction reads: the model, not the analysed quantity (both are stored) nor its
    head-ablation and stability settings (the prune and stability rules' own params)."""
    m = ANALYSED[wildcards.model]
    ex = {k: v for k, v in m["extract"].items() if k not in ("quantity", "crop", "masked")}
    return {**{k: v for k, v in m.items() if k not in ("extract", "prune", "stability")}, "extract": ex}


def _gpu_resources():
    """Cluster resources of the GPU-capable rules (train, extract), from config["resources"]."""
    r = config["resources"]
    res = {"mem_mb": r["gpu_mem_mb"], "runtime": r["gpu_runtime"]}
    if r["gpu"] > 0:
        res.update(gpu=r["gpu"], cpus_per_gpu=r["cpus_per_gpu"])
    return res


GPU_RESOURCES = _gpu_resources()


def model_job_resources(stage):
    """`mem_mb` and `runtime` of the jobs that hold a model (extract, prune): oattn_lib.resources'
    model of the weights, attention and logits they hold, `GROWTH` times more on each retry; the
    profile's `resources.gpu_mem_mb` / `gpu_runtime` where these cannot be known before the job (a
    hub id, samples of unknown length). A GPU each when `resources.gpu` asks for one. The callables
    take `input` so that Snakemake evaluates them when the job runs, its model files written."""
    gpu = {k: v for k, v in GPU_RESOURCES.items() if k not in ("mem_mb", "runtime")}

    def features(wildcards, input):
        m = ANALYSED[wildcards.model]
        return oattn_resources.model_job_features(stage, m, f"{R}/{wildcards.model}/model", PRUNE.get(wildcards.model))

    def mem_mb(wildcards, input, attempt):
        f = features(wildcards, input)
        if f is None:
            return int(GPU_RESOURCES["mem_mb"] * oattn_resources.GROWTH ** (attempt - 1))
        return oattn_resources.model_job_memory_mb(stage, f, attempt)

    def runtime(wildcards, input, attempt):
        f = features(wildcards, input)
        if f is None:
            return int(GPU_RESOURCES["runtime"] * oattn_resources.GROWTH ** (attempt - 1))
        if stage == "prune":
            m = wildcards.model
            work = oattn_resources.prune_passes(PRUNE[m], ANALYSED[m], config["entropy"]["fraction"])
        else:
            work = len(job_samples(wildcards))
        return oattn_resources.model_job_runtime_minutes(stage, f, work, attempt)

    return {"mem_mb": mem_mb, "runtime": runtime, **gpu}


# the analysis stages (organize, decompose, organize2d, theorem1): a GPU each when asked for
# (resources.analysis_gpu), for the engine and the 2-D questionnaires
ANALYSIS_GPU = {"gpu": config["resources"]["analysis_gpu"]} if config["resources"]["analysis_gpu"] > 0 else {}


def analysis_work(stage, wildcards):
    """Samples a job of `stage` analyses one after another: every sample of the model for a job of
    all of them (entropy, explorer), one for a per-sample job, its batch's for a batch job, its
    part's for an explorer_samples job; stability (a stability_sample job): its samples times
    their replicates."""
    if stage == "stability":
        from oattn_lib.stability import replicate_plan

        st = MODELS[wildcards.model]["stability"]
        return len(job_samples(wildcards)) * (len(replicate_plan(st["perturbations"], st["replicates"])) - 1)
    if "sample" in wildcards.keys() or "batch" in wildcards.keys():
        return len(job_samples(wildcards))
    if "part" in wildcards.keys():
        return len(explorer_part_samples(wildcards.model)[int(wildcards.part)])
    if stage in ("explorer", "organize2d"):
        return len(explorer_samples_of(wildcards.model))
    return len(samples(wildcards.model))


def analysis_resources(stage):
    """`mem_mb` and `runtime` of an analysis stage's jobs: oattn_lib.resources' model of what the
    job holds (one sample's network tensor, its size read from the input stores' headers),
    `GROWTH` times more on each retry."""

    def mem_mb(wildcards, input, attempt):
        return oattn_resources.memory_mb(
            stage, oattn_resources.largest_array_mb(input), attempt, oattn_resources.largest_head_mb(input)
        )

    def runtime(wildcards, input, attempt):
        return oattn_resources.runtime_minutes(
            stage,
            oattn_resources.largest_array_mb(input),
            analysis_work(stage, wildcards),
            attempt,
            oattn_resources.largest_head_mb(input),
        )

    return {"mem_mb": mem_mb, "runtime": runtime}


def theorem1_resources():
    """`mem_mb` and `runtime` of the theorem1 job: oattn_lib.resources' model of a job measuring
    heads one after another, from one head's size and the head-samples it measures (the stores'
    headers, theorem1.max_heads), `GROWTH` times more on each retry."""

    def mem_mb(wildcards, input, attempt):
        return oattn_resources.head_job_memory_mb("theorem1", oattn_resources.largest_head_mb(input.attention), attempt)

    def runtime(wildcards, input, attempt):
        n = oattn_resources.theorem1_head_samples(
            oattn_resources.stored_heads(input.attention),
            len(input.attention),
            config["theorem1"]["max_heads"],
        )
        return oattn_resources.head_job_runtime_minutes(
            "theorem1", oattn_resources.largest_head_mb(input.attention), n, attempt
        )

    return {"mem_mb": mem_mb, "runtime": runtime}


def all_targets():
    out = [f"{R}/summary.md", f"{R}/explorer.html"]
    for name in MODELS:
        out += [f"{R}/{name}/figures/{f}.png" for f in FIGURES]
        out += [f"{R}/{name}/heads.parquet"]
        if name in PRUNED:
            out += [f"{R}/{name}/figures/fig7.png", f"{R}/{name}/tables/table3.md", f"{R}/{name}/tables/table4.md"]
    out += compare_targets(config)
    # the softmax-free experiment (softmax_free.smk): when enabled, and once it has been run,
    # so that the report keeps its Table 5
    sf_table = f"{SF_DIR}/table5.md"
    if SF["enabled"] or os.path.exists(sf_table):
        out += [sf_table, f"{SF_DIR}/fig8.png"]
    return out


# -- the softmax-free experiment (softmax_free.smk) ------------------------------------------
SF_SOFTMAX = [n for n, m in SF_MODELS.items() if m["softmax_free"]["attention"] == "softmax"]


def softmax_free_runs():
    """Every run, as the dicts stages.softmax_free_table.table5 reads."""
    runs = []
    for name, m in SF_MODELS.items():
        run = m["softmax_free"]
        has_pp = name in SF_SOFTMAX and SF["paraproduct_samples"] > 0
        runs.append(
            {
                "model": run["model"],
                "kind": m["kind"],
                "attention": run["attention"],
                "seed": run["seed"],
                "metrics": f"{R}/{name}/model/metrics.json",
                "entropy": f"{R}/{name}/entropy.zarr",
                "paraproduct": f"{R}/{name}/paraproduct.zarr" if has_pp else None,
            }
        )
    return runs


def paraproduct_attention(wildcards):
    """The samples of a softmax run whose every head gets a paraproduct residual."""
    n = min(SF["paraproduct_samples"], SF["n_samples"])
    return [ATTENTION.format(model=wildcards.model, sample=i) for i in range(n)]


# -- downloads (download.smk) ------------------------------------------------------------
DATA_ROOT = config["data_root"]
WIKITEXT103_FILES = [f"{DATA_ROOT}/wikitext-103/wiki.{s}.tokens" for s in ("train", "valid", "test")]
CIFAR10_FILES = [
    f"{DATA_ROOT}/cifar-10-batches-py/{b}" for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
]


DATASET_FILES = {"wikitext103": WIKITEXT103_FILES, "cifar10": CIFAR10_FILES}


def dataset_files(wildcards):
    """The files a model's prepare_data reads: downloads ([] for stdlib text and digits) and the
    user's own inputs (data.texts), so that editing a prompt reruns what depends on it."""
    m = MODELS[wildcards.model]
    kind = adapter(m)
    return [f for name in kind.datasets(m) for f in DATASET_FILES[name]] + kind.input_files(m)


# the weights file each model's training starts from (None: none); a kind looks its file up
# only for a model that needs it (torch's import costs seconds per job)
PRETRAINED = {name: adapter(m).pretrained_weights(m) for name, m in MODELS.items()}
# the torchvision ViT-B/16 weights: the only pretrained weights a model starts from
VIT_B_16_WEIGHTS = next((f for f in PRETRAINED.values() if f), None)


def pretrained_weights(wildcards):
    """The torchvision weights file a model's train job starts from ([] unless pretrained)."""
    return PRETRAINED[wildcards.model] or []


def download_root(wildcards, output):
    """data_root, read from a download rule's first output (<data_root>/<dataset dir>/<file>)."""
    return os.path.dirname(os.path.dirname(output[0]))


# -- prune (prune.smk) -------------------------------------------------------------------
def held_out_texts(wildcards):
    """The user's held-out texts of a model's ablation (prune.held_out.texts; [] for none)."""
    return PRUNE[wildcards.model]["held_out"].get("texts") or []


def prune_model_params(wildcards):
    """What prune reads from a model's config: how to load it and read its data."""
    m = MODELS[wildcards.model]
    # a GGUF model is loaded from the directory prepare_model wrote (input `prepared`)
    prepared = os.path.dirname(PREPARED["prepared"].format(model=m["name"])) if m["name"] in GGUF_MODELS else None
    return adapter(m).prune_params(m, prepared)


# -- summary (report.smk) ----------------------------------------------------------------
def summary_inputs(wildcards):
    inputs = {}
    for name, m in MODELS.items():
        if adapter(m).trains:
            inputs[f"metrics_{name}"] = f"{R}/{name}/model/metrics.json"
        inputs[f"table1_{name}"] = f"{R}/{name}/tables/table1.md"
        inputs[f"table2_{name}"] = f"{R}/{name}/tables/table2.md"
        inputs[f"table1csv_{name}"] = f"{R}/{name}/tables/table1.csv"
        inputs[f"entropy_{name}"] = ENTROPY.format(model=name)
        inputs[f"temperature_{name}"] = f"{R}/{name}/figures/temperature.json"
        inputs[f"theorem1_{name}"] = f"{R}/{name}/figures/theorem1.csv"
        inputs[f"theorem1curves_{name}"] = f"{R}/{name}/figures/theorem1_curves.csv"
        # the claims: Theorem 1's residuals per head-sample, the diffusion map of every sample
        inputs[f"temperaturecsv_{name}"] = f"{R}/{name}/figures/temperature.csv"
        inputs[f"decomposed_{name}"] = [DECOMPOSED.format(model=name, sample=i) for i in samples(name)]
        if name in STABLE:
            inputs[f"stability_{name}"] = STABILITY.format(model=name)
            inputs[f"stabilitymd_{name}"] = f"{R}/{name}/tables/stability.md"
        if name in MASKED_OTHER:  # the claims on the expansions under the other masked rule too
            inputs[f"maskedentropy_{name}"] = masked_other_paths(MASKED_OTHER_ENTROPY, name)
            inputs[f"maskeddecomposed_{name}"] = masked_other_paths(MASKED_OTHER_DECOMPOSED, name)
        if name in PRUNED:
            inputs[f"table3_{name}"] = f"{R}/{name}/tables/table3.md"
            inputs[f"table4_{name}"] = f"{R}/{name}/tables/table4.md"
            inputs[f"table3csv_{name}"] = f"{R}/{name}/tables/table3.csv"
            inputs[f"curves_{name}"] = f"{R}/{name}/prune/curves.csv"
            inputs[f"bottom_{name}"] = f"{R}/{name}/prune/bottom.csv"
    return inputs


# -- explorer ------------------------------------------------------------------------------
# a model of one job per sample: its page planned (explorer_plan), then its samples encoded by at
# most jobs.explorer_jobs jobs (explorer_samples, consecutive samples each), which the page job
# assembles (explorer.smk)
EXPLORER_PLAN = f"{R}/{{model}}/explorer/plan.json"
EXPLORER_PART = f"{R}/{{model}}/explorer/part{{part}}.json.gz"
EXPLORER_PER_SAMPLE = name_pattern([n for n in MODELS if n not in BATCHED])


def explorer_part_samples(model):
    """The samples of each explorer_samples job of a model."""
    return explorer_parts(len(explorer_samples_of(model)), config["jobs"]["explorer_jobs"])


def explorer_part_inputs(wildcards):
    """The plan and the stores of the samples of one explorer_samples job."""
    wanted = explorer_part_samples(wildcards.model)[int(wildcards.part)]

    def fill(pattern):
        return [pattern.format(model=wildcards.model, sample=i) for i in wanted]

    return {
        "plan": EXPLORER_PLAN.format(model=wildcards.model),
        "attention": fill(ATTENTION),
        "organized": fill(ORGANIZED),
        "decomposed": fill(DECOMPOSED),
        "organized2d": fill(ORGANIZED_2D),
    }


def explorer_inputs(wildcards):
    if wildcards.model in BATCHED:
        inputs = {
            "attention": shown_stores(ATTENTION)(wildcards),
            "organized": shown_stores(ORGANIZED)(wildcards),
            "decomposed": shown_stores(DECOMPOSED)(wildcards),
            "organized2d": shown_stores(ORGANIZED_2D)(wildcards),
        }
    else:
        inputs = {
            "plan": EXPLORER_PLAN.format(model=wildcards.model),
            "samples": [
                EXPLORER_PART.format(model=wildcards.model, part=k)
                for k in range(len(explorer_part_samples(wildcards.model)))
            ],
        }
    inputs |= {
        "entropy": ENTROPY.format(model=wildcards.model),
        "table1": f"{R}/{wildcards.model}/tables/table1.csv",
        "table2": f"{R}/{wildcards.model}/tables/table2.csv",
    }
    if wildcards.model in PRUNED:
        inputs |= {
            "table3": f"{R}/{wildcards.model}/tables/table3.csv",
            "table4": f"{R}/{wildcards.model}/tables/table4.csv",
            "rankings": f"{R}/{wildcards.model}/prune/rankings.csv",
        }
    if wildcards.model in STABLE:
        inputs |= {
            "stability": STABILITY.format(model=wildcards.model),
            "stability_table": f"{R}/{wildcards.model}/tables/stability.csv",
        }
    return inputs
