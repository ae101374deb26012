"""What an analysis job asks a cluster for: memory and run time, from what the job holds.

A job of the analysis rules (organize, decompose, organize2d, stability, and entropy, figures and explorer,
which read one sample at a time) holds a few copies of one sample's network tensor (query x key
x stored heads, float32 in memory whatever the store keeps) beside the interpreter and its
libraries. Its peak resident memory is modelled as `base + factor x` the tensor's size, the size
read from the job's input stores (their largest array, counted as float32; the headers only,
nothing is loaded). The two numbers of each rule are fitted to peaks measured by Snakemake's
benchmarks (`bench/resources.py` lists them, `bench/resources.csv` records them): the default run
(64-128 tokens, where the base is most of it) and SmolLM2 at 1024 tokens (where the factor is).
The entropy job reads only the coarsest coefficients and the level sums of each sample
(docs/method.md §6.6), so its memory is the base alone. The model is held to within 1.5 times
every recorded peak and never below it
(tests/test_resources.py). Each retry after a failure (an out-of-memory kill, a time limit) asks
for `GROWTH` times the previous attempt's request.

Run time is modelled the same way, `seconds + seconds per MB x` the size, with the measured times
of one thread on a 2-core AMD EPYC, times `TIME_MARGIN` for slower or busier nodes, and never less
than `MIN_RUNTIME` minutes.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

__all__ = ["JobModel", "MODELS", "GROWTH", "TIME_MARGIN", "MIN_RUNTIME", "largest_array_mb", "memory_mb",
           "runtime_minutes"]

GROWTH = 1.5
"""Each retry asks for this many times the previous attempt's memory and time."""
TIME_MARGIN = 3.0
"""Run time requested over the modelled (measured) time."""
MIN_RUNTIME = 10
"""Minutes: no analysis job asks for less (a cluster's scheduling granularity)."""


@dataclass(frozen=True)
class JobModel:
    """Peak memory (MB) = base_mb + mb_per_mb x tensor MB; wall time (s, one thread) = base_s +
    s_per_mb x tensor MB (per sample for the rules that loop over samples)."""

    base_mb: float
    mb_per_mb: float
    base_s: float
    s_per_mb: float
    per_sample_time: bool = False


# Fitted to bench/resources.csv (see the module's docstring); a rule not listed here keeps the
# profile's default resources.
MODELS = {
    "organize": JobModel(950.0, 1.9, 30.0, 0.3, per_sample_time=True),
    "decompose": JobModel(950.0, 3.8, 30.0, 0.2, per_sample_time=True),
    "entropy": JobModel(180.0, 0.0, 20.0, 0.03, per_sample_time=True),
    "organize2d": JobModel(950.0, 0.6, 30.0, 0.25, per_sample_time=True),
    "stability": JobModel(1000.0, 3.8, 60.0, 0.6, per_sample_time=True),
    "figures": JobModel(950.0, 1.8, 30.0, 0.4),
    "explorer": JobModel(950.0, 3.5, 30.0, 0.25, per_sample_time=True),
}


def _store_dir(path: str) -> str:
    return os.path.dirname(path) if os.path.basename(path) == "zarr.json" else path


def largest_array_mb(paths) -> float:
    """The largest array of the zarr stores `paths` (a store's folder or its zarr.json; other
    paths are skipped), in MB as float32: read from the arrays' headers. 0 where none exists yet
    (a dry run plans before the inputs are written)."""
    best = 0
    for p in paths:
        root = _store_dir(str(p))
        if not os.path.isfile(os.path.join(root, "zarr.json")):
            continue
        for name in os.listdir(root):
            meta = os.path.join(root, name, "zarr.json")
            if not os.path.isfile(meta):
                continue
            try:
                with open(meta, encoding="utf-8") as fh:
                    header = json.load(fh)
            except (OSError, ValueError) as exc:
                raise ValueError(f"{meta}: not a zarr array header ({exc})") from None
            if header.get("node_type") != "array":
                continue
            shape = header.get("shape") or []
            if not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError(f"{meta}: shape {shape!r} is not a list of sizes")
            best = max(best, math.prod(shape))
    return best * 4 / 1e6


def _model(rule: str) -> JobModel:
    try:
        return MODELS[rule]
    except KeyError:
        raise ValueError(f"rule {rule!r}: no resource model; modelled: {sorted(MODELS)}") from None


def memory_mb(rule: str, tensor_mb: float, attempt: int = 1) -> int:
    """The memory (MB) a job of `rule` asks for, one sample's tensor of `tensor_mb` at a time."""
    m = _model(rule)
    return int(math.ceil((m.base_mb + m.mb_per_mb * tensor_mb) * GROWTH ** (attempt - 1)))


def runtime_minutes(rule: str, tensor_mb: float, n_samples: int = 1, attempt: int = 1) -> int:
    """The run time (minutes) a job of `rule` asks for: `n_samples` samples of `tensor_mb` each
    for the rules that analyse one sample after another."""
    m = _model(rule)
    seconds = m.base_s + m.s_per_mb * tensor_mb * (n_samples if m.per_sample_time else 1)
    return max(MIN_RUNTIME, int(math.ceil(TIME_MARGIN * seconds / 60 * GROWTH ** (attempt - 1))))
