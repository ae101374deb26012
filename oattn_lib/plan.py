"""What a run does, decided from the completed config before any job starts.

The models analysed and how their samples are grouped into jobs, the samples the explorer shows
and the stability stage replicates, each job's inputs, params, work and resource requests, and
the targets of rule `all`. Pure functions of the config (and, where a docstring says so, of the
files already in the results folder), so that every decision the workflow makes can be tested
without Snakemake; `workflow/rules/common.smk` only wires them to the rules.

`Plan(config)` is built once per run from the config `config.validate_config` completed
(schema defaults filled in, keys in canonical order). Its input functions take a job's
wildcards, or a model's name where that is all they read (`on_model` adapts those to rules).
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import resources as job_resources
from . import softmax_free
from .both_masked import other_rule
from .config import compare_pairs, prune_settings
from .models import adapter
from .models.files import is_gguf_model, resolve_hf
from .models.sizes import n_tokens, stored_units

__all__ = ["Plan", "StageRule", "BatchWildcards", "batch_jobs", "batched_samples", "both_masked_models",
           "compare_heads", "compare_inputs", "compare_targets", "explorer_parts",
           "masked_other_jobs", "name_pattern", "on_model", "rule_stage", "shown_samples",
           "stability_samples", "store"]

FIGURES = [f"fig{i}" for i in range(1, 7)]
"""The figures every model gets (figures stage; Figure 7 is prune's)."""

PRIORITY = {"train": 10, "chain": 5, "long_leaf": 1}
"""Job priorities: Snakemake starts the ready job of highest priority first and knows nothing of
run times. Training comes first (the longest chain), then every step of a sample's analysis
chain (data, GGUF preparation, extract, organize, decompose, entropy), then the long leaves
(prune: an LLM's masked forward passes; stability: a questionnaire per replicate), then the
leaves that read everything (tables, figures, pages, summary) and the pages' own jobs. Without
the chain's priority a long leaf waits for the short leaves of other models and then runs alone
at the end of the run (bench/plan.py plans the presets)."""


# -- jobs: names, batches, samples -----------------------------------------------------------
def name_pattern(names: Iterable[str]) -> str:
    """A wildcard constraint matching exactly `names` (a pattern that matches nothing for none)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def store(path: str) -> str:
    """A zarr store as an input or output of a rule: its root zarr.json, a plain file. A
    directory() output would get Snakemake's .snakemake_timestamp marker inside the store, which
    zarr then warns about every time a user opens it."""
    return f"{path}/zarr.json"


def batched_samples(model: dict, max_entries: int) -> bool:
    """Whether the per-sample stages of `model` run as one job for all its samples (config
    `jobs.batch_max_entries`): when its network tensor, tokens x tokens x stored heads, has at
    most `max_entries` entries. False when `max_entries` is 0 or the model's size cannot be read
    before running it."""
    if max_entries <= 0:
        return False
    units, n = stored_units(model), n_tokens(model)
    if n is None:  # samples of their own lengths: planned for the longest
        n = adapter(model).max_tokens(model)
    if units is None or n is None:
        return False
    return n * n * len(units[0]) * len(units[1]) <= max_entries


def batch_jobs(models: dict, max_samples: int) -> list[tuple[str, str, list[int]]]:
    """The batch jobs of the batched models (`batched_samples`), one per run of at most
    `max_samples` consecutive samples (config `jobs.batch_max_samples`): `(suffix, model,
    samples)` for `models` {name: sample indices}, in their order. `suffix` names the job's
    rules (`<stage>_batch_<suffix>`): the model's name with every character that is not a
    letter, digit or underscore made one, then `_samples<first>_<last>` where the model has
    more than one batch; names that would clash get `_m<k>`, k the model's position.

    Each rule then has outputs with no wildcards (the model's own stores): Snakemake finds a
    file's producer among the rules whose outputs start as the file does, and outputs with a
    `{model}` wildcard all start alike, so that a model of n samples in one job would be
    planned in time growing as n squared."""
    if max_samples < 1:
        raise ValueError(f"jobs.batch_max_samples: {max_samples} is below 1")
    idents = {name: re.sub(r"\W", "_", name, flags=re.ASCII) for name in models}
    clashes = {i for i in idents.values() if list(idents.values()).count(i) > 1}
    jobs = []
    for k, (name, indices) in enumerate(models.items()):
        ident = idents[name] + (f"_m{k}" if idents[name] in clashes else "")
        indices = list(indices)
        chunks = [indices[i:i + max_samples] for i in range(0, len(indices), max_samples)]
        for chunk in chunks:
            suffix = ident if len(chunks) == 1 else f"{ident}_samples{chunk[0]}_{chunk[-1]}"
            jobs.append((suffix, name, chunk))
    return jobs


def rule_stage(rule: str) -> str:
    """The stage a Snakemake rule runs: a batch rule's (`<stage>_batch_<model>`, `batch_jobs`)
    its stage, any other rule's its name."""
    m = re.fullmatch(r"(\w+?)_batch_\w+", rule)
    return m.group(1) if m else rule


def explorer_parts(n_samples: int, max_jobs: int) -> list[list[int]]:
    """The samples of each `explorer_samples` job of a model of one job per sample (config
    `jobs.explorer_jobs` = `max_jobs`): consecutive runs of ceil(n / max_jobs) samples."""
    if n_samples < 1 or max_jobs < 1:
        raise ValueError(f"n_samples, max_jobs: need at least 1 each, got {n_samples}, {max_jobs}")
    per = -(-n_samples // max_jobs)
    return [list(range(start, min(n_samples, start + per))) for start in range(0, n_samples, per)]


def shown_samples(n_samples: int, max_samples: int | None) -> int:
    """How many samples a model's explorer page shows: its first `max_samples` (config
    `explorer.max_samples`), or all `n_samples` where that is None or more."""
    return n_samples if max_samples is None else min(n_samples, int(max_samples))


def stability_samples(model: dict) -> list[int]:
    """The samples of a model that get stability replicates (`stability.samples`: the first n, or
    all); [] when the model has no `stability` section (docs/method.md §14)."""
    st = model.get("stability")
    if not st:
        return []
    n = model["extract"]["n_samples"]
    k = st.get("samples", "all")
    return list(range(n if k == "all" else min(int(k), n)))


# -- the other rule for masked entries (docs/method.md §9.5) ---------------------------------
def both_masked_models(config: dict) -> dict[str, str]:
    """The config's models analysed under the other rule for masked entries too, as {model name:
    that rule}, where `claims.both_masked` is true ({} where it is false).

    Every model whose analysed quantity is `scores`: the rule is what decides how its masked
    entries enter the organization, the Haar expansions and the entropies (docs/method.md
    §9.5). Whether a model's attention has masked entries at all is known only from its
    attention stores (the project's Transformer-XL always has them, a decoder loaded through
    transformers has them, an encoder or a ViT has none), so such a model is planned too, and the
    stage finds no masked entry, says so in its log and writes stores equal to the main
    analysis's. A model analysing `probs` never: its masked entries are exactly 0 whatever the
    rule. The softmax-free runs are not the claims' models and are never planned.

    Parameters
    ----------
    config : dict
        The completed config (`config.validate_config`: schema defaults filled in).

    Returns
    -------
    dict of str to str
        Model name -> the rule of `both_masked.OTHER_RULE` it is not analysed under by its main
        analysis, in the config's order.
    """
    if not config["claims"]["both_masked"]:
        return {}
    return {m["name"]: other_rule(m["extract"]["masked"]) for m in config["models"]
            if m["extract"]["quantity"] == "scores"}


def masked_other_jobs(samples_by_model: dict) -> list[tuple[str, str, list[int]]]:
    """The jobs of the analysis under the other rule: one per model, all its samples
    (`batch_jobs` with no cut), as `(suffix, model, samples)` for {model: sample indices}."""
    return batch_jobs(samples_by_model, max([len(list(v)) for v in samples_by_model.values()] or [1]))


# -- comparisons (docs/method.md §15) --------------------------------------------------------
def compare_heads(config: dict, a: str, b: str) -> bool:
    """Whether the pair `a`, `b` of the config's `compare` section is compared head by head."""
    return next(p["heads"] for p in compare_pairs(config) if (p["a"], p["b"]) == (a, b))


def compare_inputs(results: str, a: str, b: str) -> dict[str, str]:
    """The files rule compare reads of the pair: each model's heads tables and Table 2, named
    rows_a, summary_a, table2_a and the same with _b."""
    files = {"rows": "heads.parquet", "summary": "heads_summary.parquet", "table2": "tables/table2.csv"}
    return {f"{k}_{side}": f"{results}/{name}/{f}" for side, name in (("a", a), ("b", b)) for k, f in files.items()}


def compare_targets(config: dict) -> list[str]:
    """The page of each pair of the config's `compare` section (what rule all asks for)."""
    return [f"{config['results']}/compare/{p['a']}_vs_{p['b']}/compare.html" for p in compare_pairs(config)]


# -- a batch rule's wildcards ------------------------------------------------------------------
class BatchWildcards:
    """The wildcards a batch rule's functions are given (`StageRule.bind`): attributes, and
    `keys()` as Snakemake's own wildcards have."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def keys(self):
        return self.__dict__.keys()


def bound_to(wildcards: BatchWildcards, fn: Callable) -> Callable:
    """`fn` (an input, params or resources function of a job's wildcards) called with
    `wildcards` in place of the job's (a batch rule's outputs have none). Its signature, which
    Snakemake reads to pass `input`, `attempt` and the like, is `fn`'s."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "wildcards" in kwargs:
            kwargs["wildcards"] = wildcards
        else:
            args = (wildcards, *args[1:])
        return fn(*args, **kwargs)

    return call


def on_model(fn: Callable[[str], object]) -> Callable:
    """An input or params function of a job's wildcards from `fn` of the model's name."""

    def by_model(wildcards):
        return fn(wildcards.model)

    by_model.__name__ = by_model.__qualname__ = getattr(fn, "__name__", "by_model")
    return by_model


@dataclass(frozen=True)
class StageRule:
    """One rule of a stage that runs per sample: the per-sample rule (named as the stage, with
    wildcards `model` and `sample`) or one batch rule of a small model (`<stage>_batch_<suffix>`,
    no wildcards: `batch_jobs`). A rule file declares the stage once and fills each of these in:
    the same inputs, params and resources, with paths and functions made for the rule here."""

    stage: str
    name: str
    results: str
    job_samples_fn: Callable
    model: str | None = None
    samples: tuple[int, ...] = ()
    whole: bool = True
    per_sample_models: str = "(?!)"

    @property
    def batch(self) -> bool:
        return self.model is not None

    def paths(self, pattern: str) -> list[str]:
        """The per-sample stores of `pattern` the rule reads or writes: the pattern itself for the
        per-sample rule, the batch's samples' paths for a batch rule."""
        if not self.batch:
            return [pattern]
        return [pattern.format(model=self.model, sample=i) for i in self.samples]

    def path(self, pattern: str) -> str:
        """A per-model path (`{model}` only, such as the entropy store) for this rule."""
        return pattern.format(model=self.model) if self.batch else pattern

    def _file(self, folder: str) -> str:
        ext = "log" if folder == "logs" else "tsv"
        if not self.batch:  # <stage>_sample<i>, or stability_sample<i> for a stage already so named
            stem = self.stage if self.stage.endswith("_sample") else f"{self.stage}_sample"
            return f"{self.results}/{folder}/{{model}}/{stem}{{sample}}.{ext}"
        tail = "" if self.whole else f"_samples{self.samples[0]}-{self.samples[-1]}"
        return f"{self.results}/{folder}/{self.model}/{self.stage}{tail}.{ext}"

    @property
    def log(self) -> str:
        """results/logs/<model>/<stage>_sample<i>.log, or a batch's <stage>[_samples<a>-<b>].log."""
        return self._file("logs")

    @property
    def benchmark(self) -> str:
        """As `log`, under results/benchmarks/ and ending in .tsv."""
        return self._file("benchmarks")

    @property
    def constraints(self) -> dict[str, str]:
        """The rule's wildcard constraints: the per-sample rule's models (batch rules have none)."""
        return {} if self.batch else {"model": self.per_sample_models}

    @property
    def job_samples(self):
        """Param `samples`: the job's samples (a function of the wildcards for the per-sample rule)."""
        return list(self.samples) if self.batch else self.job_samples_fn

    def bind(self, fn: Callable) -> Callable:
        """`fn` of a job's wildcards as this rule calls it (a batch rule: with `model` and `batch`)."""
        if not self.batch:
            return fn
        return bound_to(BatchWildcards(model=self.model, batch=list(self.samples)), fn)

    def resources(self, resources: dict) -> dict:
        """A stage's resources for this rule: its callables bound (`bind`), its numbers as they are."""
        return {k: self.bind(v) if callable(v) else v for k, v in resources.items()}


# -- the plan of a run -------------------------------------------------------------------------
class Plan:
    """Everything a run decides before its first job, from the completed config.

    Attributes are the run's sets and job lists (`models`, `analysed`, `batch_jobs`, ...) and its
    path patterns (`attention`, `organized`, ...: Snakemake patterns with `{model}` and
    `{sample}`); methods give a job's inputs, params, work and resources.
    """

    def __init__(self, config: dict):
        self.config = config
        R = self.results = config["results"]
        jobs = config["jobs"]
        # the config's models: every rule, the tables, figures and summary
        self.models = {m["name"]: m for m in config["models"]}
        # each model's head-ablation settings: the top-level `prune`, or the model's own merged over it
        self.prune = {name: prune_settings(config, m) for name, m in self.models.items()}
        # the models prune runs for: enabled, and of a kind whose heads can be masked
        self.pruned = {n for n, m in self.models.items() if self.prune[n]["enabled"] and adapter(m).prunes}
        # the softmax-free experiment's runs, named softmax_free/<model>/<attention>/seed<k> and
        # analysed by extract, organize, decompose and entropy, never by tables, figures, prune or summary
        self.sf = config["softmax_free"]
        self.sf_dir = f"{R}/{softmax_free.PREFIX}"
        self.sf_models = softmax_free.run_models(config)
        self.sf_softmax = [n for n, m in self.sf_models.items() if m["softmax_free"]["attention"] == "softmax"]
        self.analysed = {**self.models, **self.sf_models}
        # the config's models with a `stability` section: name -> the samples that get replicates
        self.stable = {n: stability_samples(m) for n, m in self.models.items() if stability_samples(m)}

        # path patterns
        self.attention = store(f"{R}/{{model}}/attention/sample{{sample}}.zarr")
        self.organized = store(f"{R}/{{model}}/organized/sample{{sample}}.zarr")
        self.decomposed = store(f"{R}/{{model}}/decomposed/sample{{sample}}.zarr")
        self.entropy = store(f"{R}/{{model}}/entropy.zarr")
        self.organized_2d = store(f"{R}/{{model}}/organized2d/sample{{sample}}.zarr")
        self.stability = store(f"{R}/{{model}}/stability.zarr")
        self.stability_sample = store(f"{R}/{{model}}/stability/sample{{sample}}.zarr")
        self.masked_other_organized = store(f"{R}/{{model}}/masked_{{masked}}/organized/sample{{sample}}.zarr")
        self.masked_other_decomposed = store(f"{R}/{{model}}/masked_{{masked}}/decomposed/sample{{sample}}.zarr")
        self.masked_other_entropy = store(f"{R}/{{model}}/masked_{{masked}}/entropy.zarr")
        self.explorer_plan = f"{R}/{{model}}/explorer/plan.json"
        self.explorer_part = f"{R}/{{model}}/explorer/part{{part}}.json.gz"
        # the numba kernels, compiled once before the jobs that run them (kernels.smk)
        self.kernels = f"{R}/kernels/numba.json"
        # an hf model stored as GGUF is dequantised once to a safetensors directory (prepare_model.smk)
        self.prepared = {"prepared": f"{R}/{{model}}/model/config.json",
                         "prepared_weights": f"{R}/{{model}}/model/model.safetensors"}

        # A model whose per-sample tensor has at most jobs.batch_max_entries entries runs each
        # per-sample stage as one job per batch of at most jobs.batch_max_samples samples
        # (`batch_jobs`), writing the same per-sample stores: such a job's work is shorter than a
        # job's start-up, which the model then pays once per batch instead of once per sample.
        self.batched = {n for n, m in self.analysed.items() if batched_samples(m, jobs["batch_max_entries"])}
        self.per_sample_model = name_pattern([n for n in self.analysed if n not in self.batched])
        self.batch_jobs = batch_jobs({n: self.samples(n) for n in self.analysed if n in self.batched},
                                     jobs["batch_max_samples"])
        self.stability_batch_jobs = batch_jobs({n: s for n, s in self.stable.items() if n in self.batched},
                                               jobs["batch_max_samples"])
        self.shown_batch_jobs = batch_jobs({n: self.shown(n) for n in self.models if n in self.batched},
                                           jobs["batch_max_samples"])
        self.explorer_per_sample = name_pattern([n for n in self.models if n not in self.batched])
        self.stability_per_sample = name_pattern([n for n in self.stable if n not in self.batched])

        self.masked_other = both_masked_models(config)
        self.masked_other_jobs = masked_other_jobs({n: self.samples(n) for n in self.masked_other})
        self.gguf_models = {n: m for n, m in self.models.items() if is_gguf_model(m)}
        # the weights file each model's training starts from (None: none)
        self.pretrained = {n: adapter(m).pretrained_weights(m) for n, m in self.models.items()}

        # what the organize2d rules read: the heads shown in 2-D and the 2-D questionnaire's iterations
        self.organize2d_settings = {
            "figure_heads": config["decompose"]["figure_heads"],
            "questionnaire2d_iters": config["decompose"]["questionnaire2d_iters"],
            "heads_2d": config["explorer"]["heads_2d"],
        }
        # what the replicates and masked_other read of the entropy settings: the numbers of coefficients
        self.entropy_top_k = {k: config["entropy"][k] for k in ("head_top_k", "network_top_k")}

        data_root = config["data_root"]
        self.dataset_files_of = {
            "wikitext103": [f"{data_root}/wikitext-103/wiki.{s}.tokens" for s in ("train", "valid", "test")],
            "cifar10": [f"{data_root}/cifar-10-batches-py/{b}"
                        for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]],
        }

        res = config["resources"]
        self.gpu_resources = {"mem_mb": res["gpu_mem_mb"], "runtime": res["gpu_runtime"]}
        if res["gpu"] > 0:
            self.gpu_resources.update(gpu=res["gpu"], cpus_per_gpu=res["cpus_per_gpu"])
        # the analysis stages: a GPU each when asked for, for the engine and the 2-D questionnaires
        self.analysis_gpu = {"gpu": res["analysis_gpu"]} if res["analysis_gpu"] > 0 else {}

    # -- samples ----------------------------------------------------------------------------
    def samples(self, model: str) -> range:
        """The sample indices of an analysed model."""
        return range(self.analysed[model]["extract"]["n_samples"])

    def job_samples(self, wildcards) -> list[int]:
        """The samples a job of a model's per-sample stage analyses: its own, its batch's, or all."""
        if "sample" in wildcards.keys():
            return [int(wildcards.sample)]
        if "batch" in wildcards.keys():
            return list(wildcards.batch)
        return list(self.samples(wildcards.model))

    def shown(self, model: str) -> range:
        """The samples a model's explorer page shows: its first explorer.max_samples. Only these
        get their 2-D organizations (organize2d)."""
        return range(shown_samples(len(self.samples(model)), self.config["explorer"]["max_samples"]))

    def explorer_part_samples(self, model: str) -> list[list[int]]:
        """The samples of each explorer_samples job of a model."""
        return explorer_parts(len(self.shown(model)), self.config["jobs"]["explorer_jobs"])

    def stores(self, pattern: str, model: str, samples: Iterable[int]) -> list[str]:
        """The paths of `pattern` of model `model`'s `samples`."""
        return [pattern.format(model=model, sample=i) for i in samples]

    def stage_rules(self, stage: str, batches: list | None = None, per_sample_models: str | None = None, *,
                    per_sample: bool = True) -> list[StageRule]:
        """The rules of a per-sample stage: the per-sample rule (for `per_sample_models`, default
        the analysed models not batched; none with `per_sample` False), then a batch rule for each
        of `batches` (default `batch_jobs`)."""
        batches = self.batch_jobs if batches is None else batches
        rules = []
        if per_sample:
            models = self.per_sample_model if per_sample_models is None else per_sample_models
            rules.append(StageRule(stage, stage, self.results, self.job_samples, per_sample_models=models))
        for suffix, name, indices in batches:
            whole = sum(1 for _, n, _ in batches if n == name) == 1
            rules.append(StageRule(stage, f"{stage}_batch_{suffix}", self.results, self.job_samples, model=name,
                                   samples=tuple(indices), whole=whole))
        return rules

    # -- params ------------------------------------------------------------------------------
    def analysis_params(self, model: str) -> dict:
        """What organize and everything after it read from a model's extraction config: the rule
        for masked entries only where scores are analysed (probabilities are 0 there whatever it
        says, so changing it reruns nothing of a model analysing probs)."""
        ex = self.analysed[model]["extract"]
        masked = ex["masked"] if ex["quantity"] == "scores" else "keep"
        return {"quantity": ex["quantity"], "crop": ex.get("crop"), "masked": masked}

    def masked_other_params(self, model: str) -> dict:
        """`analysis_params` with the rule for masked entries the other one (`masked_other`)."""
        return {**self.analysis_params(model), "masked": self.masked_other[model]}

    def analysis_crop(self, model: str):
        """The crop alone, for the rules that read the scores as stored (the temperature figure, theorem1)."""
        return self.analysed[model]["extract"].get("crop")

    def extraction_params(self, model: str) -> dict:
        """What extraction reads: the model, not the analysed quantity (both are stored) nor its
        head-ablation and stability settings (the prune and stability rules' own params)."""
        m = self.analysed[model]
        ex = {k: v for k, v in m["extract"].items() if k not in ("quantity", "crop", "masked")}
        return {**{k: v for k, v in m.items() if k not in ("extract", "prune", "stability")}, "extract": ex}

    def stability_replicate_settings(self, model: str) -> dict:
        """What a model's stability_sample jobs read of its `stability` section: not which samples
        are replicated nor the bootstrap (the stability job's), so changing those reruns no replicate."""
        return {k: v for k, v in self.models[model]["stability"].items() if k not in ("samples", "bootstrap")}

    def prune_model_params(self, model: str) -> dict:
        """What prune reads from a model's config: how to load it and read its data."""
        m = self.models[model]
        # a GGUF model is loaded from the directory prepare_model wrote (input `prepared`)
        prepared = os.path.dirname(self.prepared["prepared"].format(model=model)) if model in self.gguf_models else None
        return adapter(m).prune_params(m, prepared)

    def softmax_free_runs(self) -> list[dict]:
        """Every softmax-free run, as the dicts `stages.softmax_free_table.table5` reads."""
        runs = []
        for name, m in self.sf_models.items():
            run = m["softmax_free"]
            has_pp = name in self.sf_softmax and self.sf["paraproduct_samples"] > 0
            runs.append({
                "model": run["model"], "kind": m["kind"], "attention": run["attention"], "seed": run["seed"],
                "metrics": f"{self.results}/{name}/model/metrics.json",
                "entropy": f"{self.results}/{name}/entropy.zarr",
                "paraproduct": f"{self.results}/{name}/paraproduct.zarr" if has_pp else None,
            })
        return runs

    # -- inputs ------------------------------------------------------------------------------
    def model_data(self, model: str) -> dict[str, str]:
        """A model's dataset: a softmax-free run reads its base model's."""
        name = self.analysed[model].get("softmax_free", {}).get("model", model)
        return {"npz": f"{self.results}/{name}/data/dataset.npz", "meta": f"{self.results}/{name}/data/meta.json"}

    def prepared_model(self, model: str) -> dict[str, str]:
        """Inputs `prepared` and `prepared_weights` of a GGUF model's jobs ({} for other models)."""
        if model not in self.gguf_models:
            return {}
        return {k: v.format(model=model) for k, v in self.prepared.items()}

    def gguf_source(self, model: str):
        """The local GGUF file prepare_model reads ([] for a hub id)."""
        m = self.gguf_models[model]
        directory, name = resolve_hf(m["path"], m.get("gguf_file"))
        path = os.path.join(directory, name)
        return path if os.path.isfile(path) else []

    def user_inputs(self, wildcards) -> list[str]:
        """The user's files an extract job reads itself (kind attention: the files of its samples),
        so that editing one reruns the analysis of its own samples only ([] for the other kinds)."""
        m = self.analysed[wildcards.model]
        return adapter(m).sample_files(m, self.job_samples(wildcards))

    def checkpoint_input(self, model: str):
        """The trained checkpoint a model's extract and prune jobs read ([] for a kind the workflow
        does not train)."""
        if not adapter(self.analysed[model]).trains:
            return []
        return f"{self.results}/{model}/model/checkpoint.pt"

    def dataset_files(self, model: str) -> list[str]:
        """The files a model's prepare_data reads: downloads ([] for stdlib text and digits) and the
        user's own inputs (data.texts), so that editing a prompt reruns what depends on it."""
        m = self.models[model]
        kind = adapter(m)
        return [f for name in kind.datasets(m) for f in self.dataset_files_of[name]] + kind.input_files(m)

    def pretrained_weights(self, model: str):
        """The torchvision weights file a model's train job starts from ([] unless pretrained)."""
        return self.pretrained[model] or []

    @property
    def vit_b_16_weights(self) -> str | None:
        """The torchvision ViT-B/16 weights: the only pretrained weights a model starts from."""
        return next((f for f in self.pretrained.values() if f), None)

    def held_out_texts(self, model: str) -> list[str]:
        """The user's held-out texts of a model's ablation (prune.held_out.texts; [] for none)."""
        return self.prune[model]["held_out"].get("texts") or []

    def attention_stores(self, model: str) -> list[str]:
        return self.stores(self.attention, model, self.samples(model))

    def organized_stores(self, model: str) -> list[str]:
        return self.stores(self.organized, model, self.samples(model))

    def decomposed_stores(self, model: str) -> list[str]:
        return self.stores(self.decomposed, model, self.samples(model))

    def shown_stores(self, pattern: str, model: str) -> list[str]:
        """The stores of `pattern` of the samples a model's explorer page shows."""
        return self.stores(pattern, model, self.shown(model))

    def stability_stores(self, model: str) -> list[str]:
        """The replicate stores of the model's stability samples."""
        return self.stores(self.stability_sample, model, self.stable[model])

    def stability_input(self, model: str) -> list[str]:
        """The model's stability store where it has a `stability` section, else nothing."""
        return [self.stability.format(model=model)] if model in self.stable else []

    def theorem1_attention(self, model: str) -> list[str]:
        """The attention stores the theorem1 job measures: the first theorem1.samples, or all."""
        k = self.config["theorem1"]["samples"]
        chosen = self.samples(model) if k == "all" else self.samples(model)[: int(k)]
        return self.stores(self.attention, model, chosen)

    def paraproduct_attention(self, model: str) -> list[str]:
        """The samples of a softmax run whose every head gets a paraproduct residual."""
        return self.stores(self.attention, model, range(min(self.sf["paraproduct_samples"], self.sf["n_samples"])))

    def masked_other_paths(self, pattern: str, model: str):
        """The stores of `pattern` (`masked_other_organized`, `_decomposed`: one per sample;
        `masked_other_entropy`: one) of `model` under its other rule."""

        def fill(i):
            return pattern.format(model=model, masked=self.masked_other[model], sample=i)

        return [fill(i) for i in self.samples(model)] if "{sample}" in pattern else fill(0)

    def summary_inputs(self) -> dict:
        """Every file the summary (its tables and claims) reads, named <what>_<model>."""
        R, inputs = self.results, {}
        for name, m in self.models.items():
            if adapter(m).trains:
                inputs[f"metrics_{name}"] = f"{R}/{name}/model/metrics.json"
            inputs[f"table1_{name}"] = f"{R}/{name}/tables/table1.md"
            inputs[f"table2_{name}"] = f"{R}/{name}/tables/table2.md"
            inputs[f"table1csv_{name}"] = f"{R}/{name}/tables/table1.csv"
            inputs[f"entropy_{name}"] = self.entropy.format(model=name)
            inputs[f"temperature_{name}"] = f"{R}/{name}/figures/temperature.json"
            inputs[f"theorem1_{name}"] = f"{R}/{name}/figures/theorem1.csv"
            inputs[f"theorem1curves_{name}"] = f"{R}/{name}/figures/theorem1_curves.csv"
            # the claims: Theorem 1's residuals per head-sample, the diffusion map of every sample
            inputs[f"temperaturecsv_{name}"] = f"{R}/{name}/figures/temperature.csv"
            inputs[f"decomposed_{name}"] = self.decomposed_stores(name)
            if name in self.stable:
                inputs[f"stability_{name}"] = self.stability.format(model=name)
                inputs[f"stabilitymd_{name}"] = f"{R}/{name}/tables/stability.md"
            if name in self.masked_other:  # the claims on the expansions under the other masked rule too
                inputs[f"maskedentropy_{name}"] = self.masked_other_paths(self.masked_other_entropy, name)
                inputs[f"maskeddecomposed_{name}"] = self.masked_other_paths(self.masked_other_decomposed, name)
            if name in self.pruned:
                inputs[f"table3_{name}"] = f"{R}/{name}/tables/table3.md"
                inputs[f"table4_{name}"] = f"{R}/{name}/tables/table4.md"
                inputs[f"table3csv_{name}"] = f"{R}/{name}/tables/table3.csv"
                inputs[f"curves_{name}"] = f"{R}/{name}/prune/curves.csv"
                inputs[f"bottom_{name}"] = f"{R}/{name}/prune/bottom.csv"
        return inputs

    def page_stores(self, model: str, samples: Iterable[int]) -> dict[str, list[str]]:
        """The stores an explorer page encodes of `samples`: attention, organized, decomposed, organized2d."""
        patterns = {"attention": self.attention, "organized": self.organized, "decomposed": self.decomposed,
                    "organized2d": self.organized_2d}
        return {k: self.stores(p, model, samples) for k, p in patterns.items()}

    def explorer_part_inputs(self, model: str, part: int) -> dict:
        """The plan and the stores of the samples of one explorer_samples job."""
        wanted = self.explorer_part_samples(model)[part]
        return {"plan": self.explorer_plan.format(model=model),
                **self.page_stores(model, wanted)}

    def explorer_inputs(self, model: str) -> dict:
        """What a model's page job reads: the shown samples' stores (a batched model, whose page job
        encodes them itself) or its plan and the explorer_samples jobs' parts, and the tables."""
        R = self.results
        if model in self.batched:
            inputs = self.page_stores(model, self.shown(model))
        else:
            inputs = {"plan": self.explorer_plan.format(model=model),
                      "samples": [self.explorer_part.format(model=model, part=k)
                                  for k in range(len(self.explorer_part_samples(model)))]}
        inputs |= {"entropy": self.entropy.format(model=model), "table1": f"{R}/{model}/tables/table1.csv",
                   "table2": f"{R}/{model}/tables/table2.csv"}
        if model in self.pruned:
            inputs |= {"table3": f"{R}/{model}/tables/table3.csv", "table4": f"{R}/{model}/tables/table4.csv",
                       "rankings": f"{R}/{model}/prune/rankings.csv"}
        if model in self.stable:
            inputs |= {"stability": self.stability.format(model=model),
                       "stability_table": f"{R}/{model}/tables/stability.csv"}
        return inputs

    def all_targets(self) -> list[str]:
        """What rule `all` asks for. The softmax-free experiment's table and figure where it is
        enabled, or once it has been run (its table exists), so that the report keeps Table 5."""
        R, out = self.results, [f"{self.results}/summary.md", f"{self.results}/explorer.html"]
        for name in self.models:
            out += [f"{R}/{name}/figures/{f}.png" for f in FIGURES]
            out += [f"{R}/{name}/heads.parquet"]
            if name in self.pruned:
                out += [f"{R}/{name}/figures/fig7.png", f"{R}/{name}/tables/table3.md", f"{R}/{name}/tables/table4.md"]
        out += compare_targets(self.config)
        sf_table = f"{self.sf_dir}/table5.md"
        if self.sf["enabled"] or os.path.exists(sf_table):
            out += [sf_table, f"{self.sf_dir}/fig8.png"]
        return out

    # -- work and resources ------------------------------------------------------------------
    def analysis_work(self, stage: str, wildcards) -> int:
        """Samples a job of `stage` analyses one after another: every sample of the model for a job
        of all of them (entropy, explorer), one for a per-sample job, its batch's for a batch job,
        its part's for an explorer_samples job; stability (a stability_sample job): its samples
        times their replicates."""
        if stage == "stability":
            # imported here: `stability` brings xarray and pandas, which planning does not otherwise need
            from .stability import replicate_plan

            st = self.models[wildcards.model]["stability"]
            return len(self.job_samples(wildcards)) * (len(replicate_plan(st["perturbations"], st["replicates"])) - 1)
        if "sample" in wildcards.keys() or "batch" in wildcards.keys():
            return len(self.job_samples(wildcards))
        if "part" in wildcards.keys():
            return len(self.explorer_part_samples(wildcards.model)[int(wildcards.part)])
        if stage in ("explorer", "organize2d"):
            return len(self.shown(wildcards.model))
        return len(self.samples(wildcards.model))

    def analysis_resources(self, stage: str) -> dict[str, Callable]:
        """`mem_mb` and `runtime` of an analysis stage's jobs: `resources`' model of what the job
        holds (one sample's network tensor, its size read from the input stores' headers),
        `resources.GROWTH` times more on each retry. Callables of the job's `input`, so that
        Snakemake evaluates them when the job runs, its inputs written."""

        def mem_mb(wildcards, input, attempt):
            return job_resources.memory_mb(stage, job_resources.largest_array_mb(input), attempt,
                                           job_resources.largest_head_mb(input))

        def runtime(wildcards, input, attempt):
            return job_resources.runtime_minutes(stage, job_resources.largest_array_mb(input),
                                                 self.analysis_work(stage, wildcards), attempt,
                                                 job_resources.largest_head_mb(input))

        return {"mem_mb": mem_mb, "runtime": runtime}

    def model_job_resources(self, stage: str) -> dict:
        """`mem_mb` and `runtime` of the jobs that hold a model (extract, prune): `resources`' model
        of the weights, attention and logits they hold, `GROWTH` times more on each retry; the
        config's `resources.gpu_mem_mb` / `gpu_runtime` where these cannot be known before the job
        (a hub id, samples of unknown length). A GPU each when `resources.gpu` asks for one."""
        gpu = {k: v for k, v in self.gpu_resources.items() if k not in ("mem_mb", "runtime")}
        growth = job_resources.GROWTH

        def features(wildcards, input):
            m = self.analysed[wildcards.model]
            return job_resources.model_job_features(stage, m, f"{self.results}/{wildcards.model}/model",
                                                    self.prune.get(wildcards.model))

        def mem_mb(wildcards, input, attempt):
            f = features(wildcards, input)
            if f is None:
                return int(self.gpu_resources["mem_mb"] * growth ** (attempt - 1))
            return job_resources.model_job_memory_mb(stage, f, attempt)

        def runtime(wildcards, input, attempt):
            f = features(wildcards, input)
            if f is None:
                return int(self.gpu_resources["runtime"] * growth ** (attempt - 1))
            if stage == "prune":
                m = wildcards.model
                work = job_resources.prune_passes(self.prune[m], self.analysed[m], self.config["entropy"]["fraction"])
            else:
                work = len(self.job_samples(wildcards))
            return job_resources.model_job_runtime_minutes(stage, f, work, attempt)

        return {"mem_mb": mem_mb, "runtime": runtime, **gpu}

    def theorem1_resources(self) -> dict[str, Callable]:
        """`mem_mb` and `runtime` of the theorem1 job: `resources`' model of a job measuring heads one
        after another, from one head's size and the head-samples it measures (the stores' headers,
        theorem1.max_heads), `GROWTH` times more on each retry."""

        def mem_mb(wildcards, input, attempt):
            return job_resources.head_job_memory_mb("theorem1", job_resources.largest_head_mb(input.attention),
                                                    attempt)

        def runtime(wildcards, input, attempt):
            n = job_resources.theorem1_head_samples(job_resources.stored_heads(input.attention), len(input.attention),
                                                    self.config["theorem1"]["max_heads"])
            return job_resources.head_job_runtime_minutes("theorem1", job_resources.largest_head_mb(input.attention),
                                                          n, attempt)

        return {"mem_mb": mem_mb, "runtime": runtime}

    @staticmethod
    def prepare_mem_mb(wildcards, input, attempt) -> int:
        """prepare_model's memory: two copies of the dequantised float32 weights, their parameters
        read from the GGUF header."""
        return job_resources.prepare_memory_mb(input.gguf or None, attempt)
