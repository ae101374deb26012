"""What the analysis jobs ask a cluster for (oattn_lib.resources): the model against the peaks
and times measured in real runs (bench/resources.csv), the tensor size read from store headers,
the growth on a retry, and the rules' requests in a real dry run."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import resources
from oattn_lib.store import write_store

MEASURED = pd.read_csv(__import__("pathlib").Path(__file__).resolve().parents[1] / "bench" / "resources.csv")


def test_the_record_covers_every_modelled_stage_at_small_and_llm_sizes():
    for stage in resources.MODELS:
        rows = MEASURED[MEASURED["rule"] == stage]
        assert rows["tensor_mb"].max() > 1000, f"{stage}: no measurement at 1024 tokens x 270 heads"
        assert rows["tensor_mb"].min() < 20, f"{stage}: no measurement of a small model"


@pytest.mark.parametrize("row", MEASURED.to_dict("records"),
                         ids=lambda r: f"{r['source']}-{r['model']}-{r['rule']}-{r['sample']}")
def test_memory_is_never_below_a_measured_peak_and_within_one_and_a_half_of_it(row):
    ask = resources.memory_mb(row["rule"], row["tensor_mb"])
    assert row["max_rss_mb"] <= ask <= 1.5 * row["max_rss_mb"], (ask, row)


@pytest.mark.parametrize("row", MEASURED.to_dict("records"),
                         ids=lambda r: f"{r['source']}-{r['model']}-{r['rule']}-{r['sample']}")
def test_run_time_asks_at_least_the_margin_over_the_measured_time(row):
    minutes = resources.runtime_minutes(row["rule"], row["tensor_mb"], int(row["work"]))
    assert minutes * 60 >= resources.TIME_MARGIN * row["seconds"], (minutes, row)


def test_a_retry_asks_for_more_each_time():
    first = resources.memory_mb("organize", 1132.0)
    assert resources.memory_mb("organize", 1132.0, attempt=2) == pytest.approx(resources.GROWTH * first, abs=1)
    assert resources.runtime_minutes("organize", 1132.0, attempt=3) > resources.runtime_minutes("organize", 1132.0)
    with pytest.raises(ValueError, match="no resource model"):
        resources.memory_mb("tables", 1.0)


def test_the_tensor_size_is_the_largest_array_of_the_stores_read_from_headers(tmp_path):
    a = xr.Dataset({"probs": (("layer", "head", "query", "key"), np.zeros((3, 2, 40, 30), np.float16)),
                    "token": ("query", np.arange(40))})
    b = xr.Dataset({"trihaar": (("qbasis", "kbasis", "hbasis"), np.zeros((20, 20, 6), np.float64))})
    pa, pb = write_store(a, tmp_path / "a.zarr"), write_store(b, tmp_path / "b.zarr")
    # counted as float32 entries, whatever the store's dtype; a store's zarr.json names it too
    assert resources.largest_array_mb([pa / "zarr.json", pb]) == pytest.approx(3 * 2 * 40 * 30 * 4 / 1e6)
    assert resources.largest_array_mb([pb]) == pytest.approx(20 * 20 * 6 * 4 / 1e6)
    # inputs not written yet (a dry run) and other files count nothing
    assert resources.largest_array_mb([tmp_path / "missing.zarr", tmp_path]) == 0
    (pa / "probs" / "zarr.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"probs/zarr\.json"):
        resources.largest_array_mb([pa])


@pytest.mark.workflow
def test_the_rules_ask_what_the_model_says_for_their_input_stores(clean_run, tmp_path):
    """organize and stability run again on a copy of the tiny run (and what lies between them):
    every analysis job's mem_mb and runtime, as Snakemake reports them, are the model's for the
    stores the job reads. (A dry run cannot show them: Snakemake leaves a request that reads the
    input files undecided until the job runs.)"""
    import shutil

    from wfutil import TINY, snakemake

    run = tmp_path / "run"
    shutil.copytree(clean_run, run, symlinks=True)
    proc = snakemake(run, TINY, "--forcerun", "organize", "stability", "--until", "stability")
    text = proc.stdout + proc.stderr
    jobs = re.findall(r"rule (\w+):\n(?:    .*\n)*?    wildcards: ([^\n]*)\n(?:    .*\n)*?    resources: ([^\n]*)",
                      text)
    seen = set()
    res = run / "results"
    for rule, wildcards, resline in jobs:
        stage = re.sub(r"_\d+_samples$", "", rule)
        if stage not in resources.MODELS:
            continue
        w = dict(kv.split("=", 1) for kv in wildcards.split(", "))
        got = dict(kv.split("=", 1) for kv in resline.split(", "))
        base = res / w["model"]
        samples = [int(w["sample"])] if "sample" in w else sorted(
            int(p.name[6:-5]) for p in (base / "attention").glob("sample*.zarr"))
        # no store a stage reads holds more entries than the attention tensor
        size = resources.largest_array_mb([base / "attention" / f"sample{k}.zarr" for k in samples])
        assert size > 0
        assert int(got["mem_mb"]) == resources.memory_mb(stage, size), (rule, w, got)
        assert int(got["runtime"]) >= resources.MIN_RUNTIME, (rule, w, got)
        seen.add(stage)
    assert {"organize", "decompose", "entropy", "stability"} <= seen, (seen, text[-3000:])
