"""What an analysis job asks a cluster for: memory and run time, from what the job holds.

A job of the analysis rules (organize, decompose, organize2d, stability, and entropy, figures and
explorer, which read one sample at a time) holds a few copies of one sample's network tensor (query
x key x stored heads, float32 in memory whatever the store keeps) beside the interpreter and its
libraries. Its peak resident memory is modelled as `base + factor x` the tensor's size, read from
the headers of the job's input stores (their largest array, counted as float32; nothing is loaded),
plus a term linear in the number of tokens (what grows with the length whatever the number of heads:
trees, sweeps and one head at a time) and, for figures, one head's tokens x tokens as float64 (the
temperature figure's paraproduct, `largest_head_mb`). The entropy job reads only the coarsest
coefficients and the level sums of each sample (docs/method.md §6.6), so its memory is the base
alone. Run time is modelled the same way, `seconds + seconds per MB x` the size on one thread, times
`TIME_MARGIN` for slower or busier nodes, and never less than `MIN_RUNTIME` minutes. Each retry after
a failure (an out-of-memory kill, a time limit) asks for `GROWTH` times the previous attempt's request.

The jobs that hold a model (extract, prune: `MODEL_JOBS`) are modelled from what they hold instead,
all of it known before they run (`model_job_features`): the weights (their parameters counted from
the safetensors headers, or a checkpoint's size, as float32 or the extraction's compute dtype), the
attention the forward pass holds at once (extract: one layer's heads x tokens^2, the layers being
written as they come; prune: every layer's, kept for the gradient of the gates) and prune's logits
(held-out windows x tokens x vocabulary, at most the evaluation budget). Their run time grows with
the network's attention (layers x heads x tokens^2) times the samples (extract) or the masked passes
(prune). The theorem1 job (`HEAD_JOBS`) reads one head at a time: its memory is a term in the head's
length beyond the base, its time the head-samples it measures (`theorem1_head_samples`) times a cost
per head that grows with the length. Training keeps the profile's `resources.gpu_mem_mb` and
`gpu_runtime`: only the project's small models train here, too few sizes to fit a model to.

The numbers below are fitted, a linear program per rule, to the jobs of finished runs: their peaks
as their logs record them (`runtime.job_usage`, the kernel's high-water mark, which Snakemake's
sampled benchmarks can miss) and their times. `bench/resources.py` measures them into
`bench/resources.csv` (analysis and theorem1 jobs; a theorem1 row's `work` is its head-samples) and,
with `--model-jobs`, `bench/model_jobs.csv`; with `--fit RECORD` it prints the numbers. The records
say which runs and lengths the fit covers; tests/test_resources.py holds the model within 1.5 times
every recorded peak and never below it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from .data.safetensors_header import read_safetensors_header
from .models import adapter
from .models.sizes import n_units

__all__ = ["JobModel", "MODELS", "GROWTH", "TIME_MARGIN", "MIN_RUNTIME", "largest_array_mb", "largest_head_mb", "head_tokens",
           "memory_mb", "stored_heads", "HeadJob", "HEAD_JOBS", "theorem1_head_samples", "head_job_memory_mb",
           "head_job_runtime_minutes",
           "runtime_minutes", "ModelJob", "MODEL_JOBS", "EVAL_BUDGET_MB", "parameter_count", "model_job_features",
           "model_job_memory_mb", "model_job_runtime_minutes", "prune_passes", "chained", "model_files", "PrepareJob",
           "PREPARE_JOB", "prepare_memory_mb"]

GROWTH = 1.5
"""Each retry asks for this many times the previous attempt's memory and time."""
TIME_MARGIN = 3.0
"""Run time requested over the modelled (measured) time."""
MIN_RUNTIME = 10
"""Minutes: no analysis job asks for less (a cluster's scheduling granularity)."""


@dataclass(frozen=True)
class JobModel:
    """Peak memory (MB) = base_mb + mb_per_mb x tensor MB + per_token x tokens + per_head x head MB
    (one head's tokens x tokens as float64; tokens from the head's size); wall time (s, one
    thread) = base_s + (s_per_mb + s_per_mb_token x tokens / 1024) x tensor MB (per sample for the
    rules that loop over samples; tokens from the head's size): the questionnaire's pairwise
    distances grow as tokens^3 x heads, one more power of the length than the tensor."""

    base_mb: float
    mb_per_mb: float
    base_s: float
    s_per_mb: float
    per_sample_time: bool = False
    per_head: float = 0.0
    s_per_mb_token: float = 0.0
    per_token: float = 0.0


# Fitted to bench/resources.csv (`python bench/resources.py --fit bench/resources.csv`; see the
# module's docstring); a rule not listed here keeps the profile's default resources.
MODELS = {
    # organize: its affinities and their eigenvectors beside the tensor
    "organize": JobModel(829.0, 1.0, 13.6, 0.00848, per_sample_time=True, s_per_mb_token=0.0465, per_token=0.436),
    "decompose": JobModel(892.0, 2.0, 16.3, 0.0, per_sample_time=True, s_per_mb_token=0.032, per_token=0.424),
    "entropy": JobModel(159.0, 0.0, 2.64, 0.0, per_sample_time=True),
    "organize2d": JobModel(785.0, 0.624, 19.7, 0.0185, per_sample_time=True),
    "stability": JobModel(995.0, 3.05, 36.9, 0.0826, per_sample_time=True),
    # figures: the temperature figure's paraproduct holds its block means of every pair of levels
    # and a few temporaries of one head (float64), whatever the number of heads
    "figures": JobModel(748.0, 0.0641, 18.5, 0.121, per_head=41.2, s_per_mb_token=0.00963, per_token=0.665),
    # also the explorer_plan and explorer_sample jobs of a model of one job per sample: each holds
    # what the page job holds of one sample (it reads and encodes it)
    "explorer": JobModel(828.0, 1.09, 9.47, 0.0291, per_sample_time=True, per_token=0.358),
}


def _store_dir(path: str) -> str:
    return os.path.dirname(path) if os.path.basename(path) == "zarr.json" else path


def _read_json(path: str, what: str):
    """The JSON object of file `path`; ValueError naming it as not `what` otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not {what} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not {what} (not a JSON object)")
    return value


def _array_headers(paths):
    """(path, header) of every array of the zarr stores `paths` (a store's folder or its zarr.json;
    other paths and stores not written yet are skipped), each shape checked to be sizes."""
    for p in paths:
        root = _store_dir(str(p))
        if not os.path.isfile(os.path.join(root, "zarr.json")):
            continue
        for name in os.listdir(root):
            meta = os.path.join(root, name, "zarr.json")
            if not os.path.isfile(meta):
                continue
            header = _read_json(meta, "a zarr array header")
            if header.get("node_type") != "array":
                continue
            shape = header.get("shape") or []
            if not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError(f"{meta}: shape {shape!r} is not a list of sizes")
            yield meta, header


def largest_array_mb(paths) -> float:
    """The largest array of the zarr stores `paths` (a store's folder or its zarr.json; other
    paths are skipped), in MB as float32: read from the arrays' headers. 0 where none exists yet
    (a dry run plans before the inputs are written)."""
    return max((math.prod(h.get("shape") or []) for _, h in _array_headers(paths)), default=0) * 4 / 1e6


def _head_shapes(paths):
    """The shapes of the arrays of the zarr stores `paths` whose last two dimensions are named
    query and key (the attention store's), from their headers."""
    for _, h in _array_headers(paths):
        if len(h.get("shape") or []) >= 2 and list(h.get("dimension_names") or [])[-2:] == ["query", "key"]:
            yield h["shape"]


def largest_head_mb(paths) -> float:
    """One head of the zarr stores `paths` as float64, in MB: the largest query x key of their
    attention arrays, read from the arrays' headers; 0 where none exists yet."""
    return max((shape[-1] * shape[-2] for shape in _head_shapes(paths)), default=0) * 8 / 1e6


def head_tokens(head_mb: float) -> float:
    """The side of a square head of `head_mb` (float64), in tokens."""
    return math.sqrt(max(head_mb, 0.0) * 1e6 / 8)


def _lookup(models: dict, rule: str, what: str = ""):
    """The model of `rule` in `models`, or an error naming the rule and the modelled ones."""
    try:
        return models[rule]
    except KeyError:
        raise ValueError(f"rule {rule!r}: no resource model{what}; modelled: {sorted(models)}") from None


def _model(rule: str) -> JobModel:
    return _lookup(MODELS, rule)


def memory_mb(rule: str, tensor_mb: float, attempt: int = 1, head_mb: float = 0.0) -> int:
    """The memory (MB) a job of `rule` asks for, one sample's tensor of `tensor_mb` at a time, one
    head of `head_mb` (`largest_head_mb`)."""
    m = _model(rule)
    mb = m.base_mb + m.mb_per_mb * tensor_mb + m.per_token * head_tokens(head_mb) + m.per_head * head_mb
    return int(math.ceil(mb * GROWTH ** (attempt - 1)))


def runtime_minutes(rule: str, tensor_mb: float, n_samples: int = 1, attempt: int = 1, head_mb: float = 0.0) -> int:
    """The run time (minutes) a job of `rule` asks for: `n_samples` samples of `tensor_mb` each
    for the rules that analyse one sample after another, of heads of `head_mb` (`largest_head_mb`)."""
    m = _model(rule)
    tokens = head_tokens(head_mb)
    per_mb = m.s_per_mb + m.s_per_mb_token * tokens / 1024
    seconds = m.base_s + per_mb * tensor_mb * (n_samples if m.per_sample_time else 1)
    return max(MIN_RUNTIME, int(math.ceil(TIME_MARGIN * seconds / 60 * GROWTH ** (attempt - 1))))


def stored_heads(paths) -> int:
    """The heads of the zarr stores `paths`: the largest product of the leading dimensions (layer x
    head) of the arrays whose last two dimensions are query and key, read from the headers; 0
    where none exists yet."""
    return max((math.prod(shape[:-2]) for shape in _head_shapes(paths)), default=0)


# -- jobs that measure heads one after another: theorem1 ---------------------------------------
@dataclass(frozen=True)
class HeadJob:
    """Peak memory (MB) = base_mb + per_token x tokens + per_head x one head's MB (tokens x tokens as
    float64: the head read, its 2-D questionnaire's affinities, the paraproducts' terms; tokens from
    the head's size); wall time (s) = base_s + head-samples x (s_per_head + s_per_mb_token x head MB x tokens / 1024): each head's 2-D
    questionnaire and paraproducts, whose pairwise distances grow as tokens^3, after a cost per
    head that is most of it at 64-128 tokens."""

    base_mb: float
    per_head: float
    base_s: float
    s_per_head: float
    s_per_mb_token: float
    per_token: float = 0.0


# Fitted to the theorem1 rows of bench/resources.csv (`work`: the head-samples measured; `source`
# names the runs): `python bench/resources.py --fit bench/resources.csv`.
HEAD_JOBS = {"theorem1": HeadJob(720.0, 0.0, 0.0, 0.784, 1.17, per_token=1.16)}


def theorem1_head_samples(n_heads: int, n_samples: int, max_heads: int) -> int:
    """The head-samples a theorem1 job measures: every stored head of each sample, or `max_heads`
    of them where there are more (stages.theorem1.chosen_heads)."""
    return int(n_samples) * min(int(n_heads), int(max_heads))


def _head_job(rule: str) -> HeadJob:
    return _lookup(HEAD_JOBS, rule, " of a job measuring heads")


def head_job_memory_mb(rule: str, head_mb: float, attempt: int = 1) -> int:
    """The memory (MB) a job of `rule` (theorem1) asks for, one head of `head_mb` (`largest_head_mb`) at a time."""
    m = _head_job(rule)
    mb = m.base_mb + m.per_token * head_tokens(head_mb) + m.per_head * head_mb
    return int(math.ceil(mb * GROWTH ** (attempt - 1)))


def head_job_runtime_minutes(rule: str, head_mb: float, head_samples: int, attempt: int = 1) -> int:
    """The run time (minutes) a job of `rule` (theorem1) asks for: `head_samples` heads of `head_mb`
    (`theorem1_head_samples`)."""
    m = _head_job(rule)
    tokens = head_tokens(head_mb)
    seconds = m.base_s + head_samples * (m.s_per_head + m.s_per_mb_token * head_mb * tokens / 1024)
    return max(MIN_RUNTIME, int(math.ceil(TIME_MARGIN * seconds / 60 * GROWTH ** (attempt - 1))))


# -- jobs that hold a model: extract and prune ------------------------------------------------
EVAL_BUDGET_MB = 537.0
"""prune's activation budget of a masked evaluation pass on a CPU (512 MiB, stages.prune): its
logits never exceed it."""


@dataclass(frozen=True)
class ModelJob:
    """Peak memory (MB) = base_mb + per_weight x weights MB + per_attention x attention MB +
    per_logits x logits MB; wall time (s) = base_s + s_per_mb x network attention MB x work
    (samples for extract, masked passes for prune)."""

    base_mb: float
    per_weight: float
    per_attention: float
    per_logits: float
    base_s: float
    s_per_mb: float


# Fitted to bench/model_jobs.csv (`python bench/resources.py --fit bench/model_jobs.csv`; its
# `source` column names the runs).
MODEL_JOBS = {
    "extract": ModelJob(828.0, 1.44, 4.79, 0.0, 20.0, 0.00461),
    "prune": ModelJob(935.0, 2.63, 0.995, 1.84, 216.0, 0.00201),
}

@dataclass(frozen=True)
class PrepareJob:
    """Peak memory (MB) of prepare_model = base_mb + copies x the dequantised float32 weights
    (MB): transformers builds the float32 state dict from the GGUF file, then the model from it,
    so two copies are held at once beside the interpreter, torch and transformers."""

    base_mb: float
    copies: float


PREPARE_JOB = PrepareJob(1000.0, 2.0)
"""prepare_model's model (`prepare_memory_mb`): the base is the interpreter, torch and transformers
beside the two copies of the weights. tests/test_decoders.py runs the job's code in a fresh process
on one thread, as the job runs, and holds the ask between its peak and 1.5 times it."""


def prepare_memory_mb(gguf_path: str | os.PathLike | None, attempt: int = 1, fallback_mb: float = 22000.0) -> int:
    """Memory (MB) a prepare_model job asks for, from the parameters of its GGUF file (read from the
    header: `models.files.gguf_parameter_count`, whatever the file's quantisation); `fallback_mb`
    where there is no local file to read (a hub id: the file comes with the job; 22 GB holds a
    model of about 2.6 billion parameters). `GROWTH` times more on each retry."""
    from .models.files import gguf_parameter_count

    if gguf_path:
        mb = PREPARE_JOB.base_mb + PREPARE_JOB.copies * gguf_parameter_count(gguf_path) * 4 / 1e6
    else:
        mb = fallback_mb
    return int(math.ceil(mb * GROWTH ** (attempt - 1)))


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def _safetensors_params(path: str) -> int:
    """Parameters of a safetensors file, from its header (`data.safetensors_header`, which checks it
    against the file and names the file in its error); no tensor is read."""
    return sum(math.prod(a.shape) for a in read_safetensors_header(path).arrays.values())


def parameter_count(paths) -> int:
    """Parameters of the weight files among `paths` (files, or directories whose top-level files
    are looked at): a safetensors file's from its header, a .bin/.pt/.pth/.ckpt file's as its
    size over 4 (float32); 0 where there is none."""
    files = []
    for p in paths:
        p = str(p)
        if os.path.isdir(p):
            files += [os.path.join(p, n) for n in sorted(os.listdir(p))]
        elif os.path.isfile(p):
            files.append(p)
    total = 0
    for f in dict.fromkeys(files):
        if f.endswith(".safetensors"):
            total += _safetensors_params(f)
        elif f.endswith(_WEIGHT_SUFFIXES):
            total += os.path.getsize(f) // 4
    return total


def _vocabulary(paths) -> int:
    """`vocab_size` of the first config.json among `paths` (a directory's or the file), 0 without."""
    for p in paths:
        p = str(p)
        f = os.path.join(p, "config.json") if os.path.isdir(p) else p
        if os.path.basename(f) != "config.json" or not os.path.isfile(f):
            continue
        cfg = _read_json(f, "a JSON model config")
        for d in (cfg, cfg.get("text_config") or {}):
            v = d.get("vocab_size") if isinstance(d, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return 0


def model_files(model: dict, model_dir: str | os.PathLike) -> list[str]:
    """The files that hold the weights and config of the config entry `model`, whose workflow
    folder for them is `model_dir` (`<results>/<model>/model`): its trained checkpoint there, the
    float32 directory a GGUF model is prepared into there, or its local Hugging Face directory;
    [] for a hub id or attention files."""
    from .models.files import is_gguf_model, resolve_hf

    if adapter(model).trains:
        return [os.path.join(str(model_dir), "checkpoint.pt")]
    if is_gguf_model(model):
        return [str(model_dir)]
    if model.get("path"):
        directory, _ = resolve_hf(model["path"])
        return [directory] if os.path.isdir(directory) else []
    return []


def model_job_features(rule: str, model: dict, model_dir: str | os.PathLike, prune: dict | None = None) -> dict | None:
    """What a job of `rule` (extract or prune) of the config entry `model` holds, from the config
    and the model's files (`model_files`): weights_mb, attention_mb, logits_mb and network_mb (one
    sample's attention over every layer and head), all float32 MB. None when the layers, heads,
    tokens or weights cannot be known before the job (a hub id, samples of unknown length): the
    job then asks the profile's default."""
    units, tokens = n_units(model), adapter(model).max_tokens(model)
    files = model_files(model, model_dir)
    params = parameter_count(files)
    weightless = not adapter(model).extracts_with_weights
    if units is None or not tokens or (params == 0 and not weightless):
        return None
    layers, heads = units
    network = layers * heads * tokens * tokens * 4 / 1e6
    ex = model.get("extract") or {}
    if rule == "extract":
        bytes_per = 2 if ex.get("compute_dtype") in ("bfloat16", "float16") else 4
        # a model computes and writes one layer at a time; attention files are read a sample at once
        attention = network if weightless else network / layers
        return {"weights_mb": params * bytes_per / 1e6, "attention_mb": attention, "logits_mb": 0.0,
                "network_mb": network}
    windows = ((prune or {}).get("held_out") or {}).get("hf_windows", 1)
    logits = min(EVAL_BUDGET_MB, windows * tokens * _vocabulary(files) * 4 / 1e6)
    return {"weights_mb": params * 4 / 1e6, "attention_mb": network, "logits_mb": logits, "network_mb": network}


def prune_passes(prune: dict, model: dict | None = None, fraction: float = 0.1) -> int:
    """Masked forward passes of a prune job, as planned: (5 rankings + random_seeds orders) x
    mask sizes (0 to 100% in fraction_step) x held-out windows, and where the config entry `model`
    tells its heads (`models.sizes.n_units`) the bottom test's null sets (docs/method.md §11.5) x
    windows: every set of round(fraction x heads) heads where there are at most
    bottom_exact_max, else bottom_random_sets."""
    from .entropy import n_extreme

    shape = n_units(model) if model is not None else None
    units = shape[0] * shape[1] if shape else None
    step = float(prune.get("fraction_step", 0.1))
    sizes = int(math.floor(1.0 / step + 1e-9)) + 1
    windows = int((prune.get("held_out") or {}).get("hf_windows", 1))
    passes = (5 + int(prune.get("random_seeds", 5))) * sizes * windows
    if units:
        total = math.comb(int(units), n_extreme(int(units), fraction))
        exact = total <= int(prune.get("bottom_exact_max", 100000))
        passes += (total if exact else int(prune.get("bottom_random_sets", 199))) * windows
    return passes


def chained(parts: list[dict]) -> dict:
    """`mem_mb` and `runtime` of a job that runs stages one after another (their Snakemake resource
    callables `parts`, each {"mem_mb": f, "runtime": f} of (wildcards, input, attempt)): the most
    memory of any, the sum of their times."""
    def mem_mb(wildcards, input, attempt):
        return max(p["mem_mb"](wildcards, input, attempt) for p in parts)

    def runtime(wildcards, input, attempt):
        return sum(p["runtime"](wildcards, input, attempt) for p in parts)

    return {"mem_mb": mem_mb, "runtime": runtime}


def _model_job(rule: str) -> ModelJob:
    return _lookup(MODEL_JOBS, rule, " of a job holding a model")


def model_job_memory_mb(rule: str, features: dict, attempt: int = 1) -> int:
    """The memory (MB) a job of `rule` (extract, prune) asks for, from `model_job_features`."""
    m = _model_job(rule)
    mb = (m.base_mb + m.per_weight * features["weights_mb"] + m.per_attention * features["attention_mb"]
          + m.per_logits * features["logits_mb"])
    return int(math.ceil(mb * GROWTH ** (attempt - 1)))


def model_job_runtime_minutes(rule: str, features: dict, work: int = 1, attempt: int = 1) -> int:
    """The run time (minutes) a job of `rule` asks for: `work` samples (extract) or masked passes
    (prune, `prune_passes`) over the network's attention."""
    m = _model_job(rule)
    seconds = m.base_s + m.s_per_mb * features["network_mb"] * work
    return max(MIN_RUNTIME, int(math.ceil(TIME_MARGIN * seconds / 60 * GROWTH ** (attempt - 1))))


# -- Snakemake's scheduler ---------------------------------------------------------------------
def lift_default_job_rate_limit(workflow) -> bool:
    """Drop the job rate limiter of a local run whose limit is Snakemake's default; True if
    dropped. Called by the Snakefile's `onstart`, once the scheduler exists.

    Snakemake's default `--max-jobs-per-timespan 100/1s` re-arms a one-second timer at every
    pass of its scheduler, and each finished job starts one more such chain
    (snakemake/snakemake#3744): after n jobs the scheduler wakes n times a second, and in a run
    of small jobs that polling costs more CPU than some of the jobs. A local run never starts
    100 jobs a second; any other limit, and any cluster run, keep theirs."""
    limiter = getattr(getattr(workflow, "scheduler", None), "job_rate_limiter", None)
    if limiter is None or not workflow.local_exec or (limiter.max_jobs, limiter.timespan) != (100, 1):
        return False
    workflow.scheduler.job_rate_limiter = None
    return True
