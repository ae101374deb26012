"""Measured peak memory and wall time of the analysis jobs of finished runs, beside what
`oattn_lib.resources` asks a cluster for.

For every benchmark file of a modelled rule (`<results>/benchmarks/<model>/<rule>[_sample<k>].tsv`,
Snakemake's `benchmark:` directive: peak RSS `max_rss` in MB, wall seconds `s`; the peak is the
larger of that sample and the high-water mark the job's log ends with, `peak_mb`), the job's tensor
size is read from the headers of the model's stores (`largest_array_mb`: sample k's stores for a
per-sample job, every sample's for a job of all samples) and its work counted in samples (for
a stability_sample job, benchmark stability_sample<k>.tsv: its sample's replicates; for
theorem1, `resources.HEAD_JOBS`: the head-samples of its table, its stores those of the
samples it measured). Prints one row per job with the modelled memory and time, and
with --csv appends the measured rows to a CSV (bench/resources.csv is the record the model is
fitted to and tested against: tests/test_resources.py).

    python bench/resources.py results --source default
    python bench/resources.py results/llm --source llm --csv bench/resources.csv

With --model-jobs, the jobs that hold a model (extract, prune) instead: their features
(`oattn_lib.resources.model_job_features`: weights, attention and logits held, from the run's
config, given as in Snakemake by config.yaml and --configfile) beside the peaks, appended with
--csv to bench/model_jobs.csv:

    python bench/resources.py results/llm4k --source llm4k --model-jobs \
        --configfile workflow/presets/llm4k.yaml --csv bench/model_jobs.csv

With --fit, the numbers of `oattn_lib.resources` fitted to a record (a linear
program per rule: memory at least `FIT_FLOOR` and at most `FIT_CEILING` times every peak, the
sum of the ratios smallest; time at least every measured time, the sum of the ratios
smallest), printed as the models to put in `MODELS` and `HEAD_JOBS`, or with the model jobs'
record in `MODEL_JOBS`:

    python bench/resources.py --fit bench/resources.csv
    python bench/resources.py --fit bench/model_jobs.csv
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oattn_lib.resources import (HEAD_JOBS, MODEL_JOBS, MODELS, head_job_memory_mb, head_tokens,  # noqa: E402
                                 head_job_runtime_minutes, largest_array_mb, largest_head_mb, memory_mb,
                                 model_job_features, model_job_memory_mb, model_job_runtime_minutes,
                                 prune_passes, runtime_minutes)

_spec = importlib.util.spec_from_file_location("bench_stages", ROOT / "bench" / "stages.py")
stages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stages)

_FILE = re.compile(r"^(?P<rule>[a-z][a-z0-9_]*?)(?:_(?:sample|part)(?P<sample>\d+)|_samples(?P<first>\d+)-(?P<last>\d+))?\.tsv$")
COLUMNS = ["source", "model", "rule", "sample", "tensor_mb", "work", "max_rss_mb", "seconds", "head_mb"]
MODEL_JOB_COLUMNS = ["source", "model", "rule", "sample", "weights_mb", "attention_mb", "logits_mb", "network_mb",
                     "work", "max_rss_mb", "seconds"]


def _samples(base: Path) -> list[int]:
    return sorted(int(p.name[6:-5]) for p in (base / "attention").glob("sample*.zarr"))


def _replicated_samples(base: Path) -> list[int]:
    """The samples of a model's stability replicates (one store each)."""
    return sorted(int(p.name[6:-5]) for p in (base / "stability").glob("sample*.zarr"))


def _theorem1_samples(base: Path) -> list[int]:
    """The samples the theorem1 job measured (its table's)."""
    import pandas as pd

    return sorted(int(s) for s in pd.read_csv(base / "figures" / "theorem1.csv")["sample"].unique())


def _work(rule: str, base: Path, samples: list[int]) -> int:
    """Samples the job analysed one after another (stability: samples x replicates; theorem1: the
    head-samples of its table)."""
    if rule == "theorem1":
        import pandas as pd

        return len(pd.read_csv(base / "figures" / "theorem1.csv").groupby(["sample", "layer", "head"]))
    if rule == "stability":  # a stability_sample job: its sample's replicates
        import xarray as xr

        st = xr.open_zarr(base / "stability.zarr", consolidated=False)
        return int(len(samples) * (st.sizes["replicate"] - 1))
    return len(samples)


def peak_mb(results: Path, bench: Path, rec: dict) -> float:
    """A job's peak resident memory: the larger of Snakemake's sampled `max_rss` (every 30 s
    after the first 15 s, so it can miss the peak) and the whole job's high-water mark its log
    ends with (`runtime.job_usage`), where it does."""
    return stages.whole_job(results, bench, float(rec["max_rss"]))[1]


def measured(results: Path, source: str) -> list[dict]:
    rows = []
    for path in sorted((results / "benchmarks").glob("*/*.tsv")):
        m = _FILE.match(path.name)
        # a model of one job per sample: its page's plan (sample 0) and sample jobs (one sample
        # each, jobs.explorer_jobs at least the samples) ask what the explorer's model says
        rule = "explorer" if m and m["rule"] in ("explorer_plan", "explorer_samples") else m and m["rule"]
        # stability_sample<k>.tsv reads as rule stability, sample k (a sample's replicates, the
        # stability model), and a small model's batch of them (stability_sample.tsv, or
        # stability_sample_samples<i>-<j>.tsv) as its samples'; stability.tsv is the model's table,
        # which asks what the entropy model says (it reads per-sample summaries)
        table = rule == "stability" and m["sample"] is None
        if table:
            rule = "entropy"
        replicates = rule == "stability_sample"
        if replicates:
            rule = "stability"
        if rule not in MODELS and rule not in HEAD_JOBS:
            continue
        model, base = path.parent.name, results / path.parent.name
        samples = [0] if m["rule"] == "explorer_plan" else (
            [int(m["sample"])] if m["sample"] is not None else
            list(range(int(m["first"]), int(m["last"]) + 1)) if m["first"] is not None else
            _replicated_samples(base) if replicates else
            _theorem1_samples(base) if rule == "theorem1" else _samples(base))
        stores = [base / d / f"sample{k}.zarr" for k in samples for d in ("attention", "organized", "decomposed")]
        if m["rule"] == "explorer" and (base / "explorer" / "plan.json").is_file():
            stores = []  # its page job assembles the encoded samples: it reads no store
        if table:
            stores = sorted((base / "stability").glob("sample*.zarr")) + [base / "entropy.zarr"]
        with path.open() as fh:
            rec = list(csv.DictReader(fh, delimiter="\t"))[-1]
        rows.append({"source": source, "model": model, "rule": rule,
                     "sample": "all" if len(samples) > 1 else str(samples[0]),
                     "tensor_mb": round(largest_array_mb(stores), 3), "work": _work(rule, base, samples),
                     "max_rss_mb": peak_mb(results, path, rec), "seconds": float(rec["s"]),
                     "head_mb": round(largest_head_mb(stores), 3)})
    return rows


def run_config(configfile: Path | None) -> dict:
    """The run's validated config: config.yaml, with `configfile` merged over it as Snakemake does."""
    import yaml
    from snakemake.utils import update_config

    from oattn_lib.config import SCHEMA, validate_config

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    if configfile is not None:
        update_config(config, yaml.safe_load(configfile.read_text()))
    validate_config(config, str(SCHEMA))
    return config


def measured_model_jobs(results: Path, source: str, config: dict) -> list[dict]:
    """The extract and prune jobs of a finished run, with what `model_job_features` says they hold."""
    from oattn_lib.config import prune_settings

    models = {m["name"]: m for m in config["models"]}
    rows = []
    for path in sorted((results / "benchmarks").glob("*/*.tsv")):
        m = _FILE.match(path.name)
        rule = m["rule"] if m else None
        if rule not in MODEL_JOBS or path.parent.name not in models:
            continue
        model = models[path.parent.name]
        prune = prune_settings(config, model)
        f = model_job_features(rule, model, results / model["name"] / "model", prune)
        if f is None:
            continue
        work = prune_passes(prune) if rule == "prune" else (
            1 if m["sample"] is not None else int(m["last"]) - int(m["first"]) + 1 if m["first"] is not None
            else len(_samples(results / model["name"])))
        with path.open() as fh:
            rec = list(csv.DictReader(fh, delimiter="\t"))[-1]
        rows.append({"source": source, "model": model["name"], "rule": rule,
                     "sample": m["sample"] if m["sample"] is not None else "all",
                     **{k: round(v, 3) for k, v in f.items()}, "work": work,
                     "max_rss_mb": peak_mb(results, path, rec), "seconds": float(rec["s"])})
    return rows


def main_model_jobs(args) -> None:
    rows = measured_model_jobs(args.results, args.source, run_config(args.configfile))
    print(f"{'model':10s} {'rule':8s} {'sample':>6s} {'weights':>8s} {'attn':>8s} {'logits':>7s} {'peak MB':>8s} "
          f"{'asks MB':>8s} {'ratio':>6s} {'wall s':>7s} {'asks min':>8s}")
    for r in rows:
        ask = model_job_memory_mb(r["rule"], r)
        print(f"{r['model']:10s} {r['rule']:8s} {r['sample']:>6s} {r['weights_mb']:8.1f} {r['attention_mb']:8.1f} "
              f"{r['logits_mb']:7.1f} {r['max_rss_mb']:8.0f} {ask:8d} {ask / r['max_rss_mb']:6.2f} "
              f"{r['seconds']:7.1f} {model_job_runtime_minutes(r['rule'], r, r['work']):8d}")
    _append(args.csv, rows, MODEL_JOB_COLUMNS)


def _append(path: Path | None, rows: list[dict], columns: list[str]) -> None:
    if path is None:
        return
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        if new:
            w.writeheader()
        w.writerows(rows)


# --fit: a model's memory between these multiples of every recorded peak (the test holds 1 and 1.5:
# the margins keep a rerun's slightly higher peak and the rounding up inside them)
FIT_FLOOR, FIT_CEILING = 1.03, 1.45
# the memory terms fitted per rule (others: base, tensor and tokens); figures also holds one head's
# tokens x tokens (the temperature figure's paraproduct)
# (stability, measured at two lengths only, and entropy, which reads per-level sums: no length term)
FIT_MEMORY = {"figures": ("base_mb", "mb_per_mb", "per_token", "per_head"), "theorem1": ("base_mb", "per_token"),
              "stability": ("base_mb", "mb_per_mb"), "entropy": ("base_mb",)}
# the copies of the network tensor a job holds at once, whatever else the record would allow: the
# factor of the tensor is at least this, so that a tensor 10 times the record's largest is not
# asked for below what the code holds (organize: the tensor; decompose: the tensor and one
# expansion; stability: the tensor, a perturbed copy and its bi-Haar expansion; an explorer job:
# the tensor and its heads reordered unit-first)
FIT_TENSOR_COPIES = {"organize": 1.0, "decompose": 2.0, "stability": 3.0, "explorer": 1.0}


def _fit_columns(features: dict, names, targets, lo: float, hi: float | None, rule: str = "",
                 at_least: dict | None = None) -> dict:
    """Nonnegative coefficients c of `names` (each at least `at_least`'s where it names it) with
    lo <= (sum c_n features[n]) / targets <= hi, the sum of those ratios smallest (scipy's
    linprog); ValueError naming the rule and the columns if none exist."""
    import numpy as np
    from scipy.optimize import linprog

    a = np.stack([np.asarray(features[n], dtype=float) for n in names], axis=1)
    t = np.asarray(targets, dtype=float)
    a_ub, b_ub = -a, -lo * t
    if hi is not None:
        a_ub, b_ub = np.r_[a_ub, a], np.r_[b_ub, hi * t]
    res = linprog((a / t[:, None]).sum(axis=0), A_ub=a_ub, b_ub=b_ub,
                  bounds=[((at_least or {}).get(n, 0.0), None) for n in names])
    if not res.success:
        raise ValueError(f"{rule}: no {list(names)} within {lo}-{hi} of the record: {res.message}")
    return dict(zip(names, res.x))


def _round_up(x: float) -> float:
    """x rounded up to 3 significant digits (a model never falls below its fit)."""
    if x <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return float(f"{math.ceil(x / step - 1e-9) * step:.12g}")


def fit(record: Path) -> dict:
    """{rule: JobModel or HeadJob} fitted to the rows of `record` (module docstring, --fit)."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from oattn_lib.resources import HeadJob

    rows = pd.read_csv(record)
    fitted = {}
    if "weights_mb" in rows:  # bench/model_jobs.csv: the jobs that hold a model
        from oattn_lib.resources import ModelJob

        for rule in MODEL_JOBS:
            r = rows[rows["rule"] == rule]
            if r.empty:
                continue
            mem = _fit_columns({"base_mb": np.ones(len(r)), "per_weight": r["weights_mb"],
                                "per_attention": r["attention_mb"], "per_logits": r["logits_mb"]},
                               ("base_mb", "per_weight", "per_attention", "per_logits"), r["max_rss_mb"],
                               FIT_FLOOR, FIT_CEILING, rule)
            t = _fit_columns({"base_s": np.ones(len(r)),
                              "s_per_mb": r["network_mb"].to_numpy(float) * r["work"].to_numpy(float)},
                             ("base_s", "s_per_mb"), r["seconds"], 1.0, None, rule)
            fitted[rule] = ModelJob(**{k: _round_up(v) for k, v in {**mem, **t}.items()})
        return fitted
    for rule in [*MODELS, *HEAD_JOBS]:
        r = rows[rows["rule"] == rule]
        if r.empty:
            continue
        head, tensor = r["head_mb"].to_numpy(float), r["tensor_mb"].to_numpy(float)
        tokens, work = np.array([head_tokens(h) for h in head]), r["work"].to_numpy(float)
        names = FIT_MEMORY.get(rule, ("base_mb", "mb_per_mb", "per_token"))
        mem = _fit_columns({"base_mb": np.ones(len(r)), "mb_per_mb": tensor, "per_token": tokens, "per_head": head},
                           names, r["max_rss_mb"], FIT_FLOOR, FIT_CEILING, rule,
                           {"mb_per_mb": FIT_TENSOR_COPIES.get(rule, 0.0)})
        mem = {k: _round_up(v) for k, v in mem.items()}
        if rule in HEAD_JOBS:
            t = _fit_columns({"base_s": np.ones(len(r)), "s_per_head": work,
                              "s_per_mb_token": work * head * tokens / 1024}, ("base_s", "s_per_head", "s_per_mb_token"),
                             r["seconds"], 1.0, None, rule)
            fields = {"per_head": 0.0, **mem, **{k: _round_up(v) for k, v in t.items()}}
            fitted[rule] = HeadJob(**{f.name: fields.get(f.name, 0.0) for f in dataclasses.fields(HeadJob)})
        else:
            old = MODELS[rule]
            n = work if old.per_sample_time else 1.0
            t = _fit_columns({"base_s": np.ones(len(r)), "s_per_mb": tensor * n, "s_per_mb_token": tensor * n * tokens / 1024},
                             ("base_s", "s_per_mb", "s_per_mb_token"), r["seconds"], 1.0, None, rule)
            fitted[rule] = dataclasses.replace(old, **{"per_head": 0.0, **mem, **{k: _round_up(v) for k, v in t.items()}})
    return fitted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="?", help="a finished run's results folder")
    ap.add_argument("--fit", type=Path, metavar="RECORD", help="fit the models to this record (bench/resources.csv)")
    ap.add_argument("--source", help="a label for the run (default, llm, ...)")
    ap.add_argument("--csv", type=Path, help="append the measured rows to this CSV")
    ap.add_argument("--model-jobs", action="store_true", help="the extract and prune jobs instead")
    ap.add_argument("--configfile", type=Path, help="the run's --configfile (with --model-jobs)")
    args = ap.parse_args()
    if args.fit:
        for rule, model in fit(args.fit).items():
            print(f"{rule!r}: {model!r},")
        return
    if args.results is None or args.source is None:
        ap.error("a results folder and --source are needed (or --fit RECORD)")
    if args.model_jobs:
        main_model_jobs(args)
        return
    rows = measured(args.results, args.source)
    print(f"{'model':10s} {'rule':10s} {'sample':>6s} {'tensor MB':>10s} {'work':>5s} {'peak MB':>8s} "
          f"{'asks MB':>8s} {'ratio':>6s} {'wall s':>7s} {'asks min':>8s}")
    for r in rows:
        if r["rule"] in HEAD_JOBS:
            ask = head_job_memory_mb(r["rule"], r["head_mb"])
            minutes = head_job_runtime_minutes(r["rule"], r["head_mb"], r["work"])
        else:
            ask = memory_mb(r["rule"], r["tensor_mb"], head_mb=r["head_mb"])
            minutes = runtime_minutes(r["rule"], r["tensor_mb"], r["work"], head_mb=r["head_mb"])
        print(f"{r['model']:10s} {r['rule']:10s} {r['sample']:>6s} {r['tensor_mb']:10.1f} {r['work']:5d} "
              f"{r['max_rss_mb']:8.0f} {ask:8d} {ask / r['max_rss_mb']:6.2f} {r['seconds']:7.1f} {minutes:8d}")
    _append(args.csv, rows, COLUMNS)


if __name__ == "__main__":
    main()
