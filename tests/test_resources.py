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
from oattn_lib.plan import rule_stage
from oattn_lib.store import write_store

BENCH = __import__("pathlib").Path(__file__).resolve().parents[1] / "bench"
MEASURED = pd.read_csv(BENCH / "resources.csv")
MODEL_JOBS = pd.read_csv(BENCH / "model_jobs.csv")


def _asks(row) -> tuple[int, int]:
    """(memory MB, minutes) the job of a row of bench/resources.csv asks for, by the models now."""
    if row["rule"] in resources.HEAD_JOBS:
        return (resources.head_job_memory_mb(row["rule"], row["head_mb"]),
                resources.head_job_runtime_minutes(row["rule"], row["head_mb"], int(row["work"])))
    return (resources.memory_mb(row["rule"], row["tensor_mb"], head_mb=row["head_mb"]),
            resources.runtime_minutes(row["rule"], row["tensor_mb"], int(row["work"]), head_mb=row["head_mb"]))


def _model_job_asks(row) -> tuple[int, int]:
    """(memory MB, minutes) the job of a row of bench/model_jobs.csv asks for."""
    return (resources.model_job_memory_mb(row["rule"], row),
            resources.model_job_runtime_minutes(row["rule"], row, int(row["work"])))


def test_the_record_covers_every_modelled_stage_at_small_and_llm_sizes():
    for stage in resources.MODELS:
        rows = MEASURED[MEASURED["rule"] == stage]
        assert rows["tensor_mb"].max() > 1000, f"{stage}: no measurement at 1024 tokens x 270 heads"
        assert rows["tensor_mb"].min() < 20, f"{stage}: no measurement of a small model"
    # the stages with a term in the length: measured up to 4096 tokens (one head 134 MB as float64)
    for stage, model in {**resources.MODELS, **resources.HEAD_JOBS}.items():
        if model.per_token or model.per_head:
            assert MEASURED[MEASURED["rule"] == stage]["head_mb"].max() > 100, stage
    # the jobs measuring heads: at 64-128 tokens and at 1024 (one head 8.4 MB as float64)
    for stage in resources.HEAD_JOBS:
        rows = MEASURED[MEASURED["rule"] == stage]
        assert rows["head_mb"].max() > 8 and rows["head_mb"].min() < 0.2, stage


@pytest.mark.parametrize("row", MEASURED.to_dict("records"),
                         ids=lambda r: f"{r['source']}-{r['model']}-{r['rule']}-{r['sample']}")
def test_memory_is_never_below_a_measured_peak_and_within_one_and_a_half_of_it(row):
    ask, _ = _asks(row)
    assert row["max_rss_mb"] <= ask <= 1.5 * row["max_rss_mb"], (ask, row)


@pytest.mark.parametrize("row", MEASURED.to_dict("records"),
                         ids=lambda r: f"{r['source']}-{r['model']}-{r['rule']}-{r['sample']}")
def test_run_time_asks_at_least_the_margin_over_the_measured_time(row):
    _, minutes = _asks(row)
    assert minutes * 60 >= resources.TIME_MARGIN * row["seconds"], (minutes, row)


def test_the_fit_of_the_record_holds_every_row_of_it(monkeypatch):
    """bench/resources.py --fit, which gave the models: what it fits to each record (the analysis
    and theorem1 jobs', the model jobs') asks at least every recorded peak and at most 1.5 times
    it, and at least the recorded time with the margin."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_resources", BENCH / "resources.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fitted = bench.fit(BENCH / "resources.csv")
    assert set(fitted) == set(resources.MODELS) | set(resources.HEAD_JOBS)
    for rule, model in fitted.items():
        monkeypatch.setitem(resources.HEAD_JOBS if rule in resources.HEAD_JOBS else resources.MODELS, rule, model)
    for row in MEASURED.to_dict("records"):
        ask, minutes = _asks(row)
        assert row["max_rss_mb"] <= ask <= 1.5 * row["max_rss_mb"], (ask, row)
        assert minutes * 60 >= resources.TIME_MARGIN * row["seconds"], (minutes, row)
    fitted = bench.fit(BENCH / "model_jobs.csv")
    assert set(fitted) == set(resources.MODEL_JOBS)
    for rule, model in fitted.items():
        monkeypatch.setitem(resources.MODEL_JOBS, rule, model)
    for row in MODEL_JOBS.to_dict("records"):
        ask, minutes = _model_job_asks(row)
        assert row["max_rss_mb"] <= ask <= 1.5 * row["max_rss_mb"], (ask, row)
        assert minutes * 60 >= resources.TIME_MARGIN * row["seconds"], (minutes, row)


@pytest.mark.parametrize("rule, copies", [("organize", 1), ("decompose", 2), ("stability", 3), ("explorer", 1)])
def test_a_tensor_beyond_the_record_is_asked_at_least_the_copies_the_job_holds(rule, copies):
    """All 270 heads of SmolLM2 at 4096 tokens are an 18 GB float32 tensor, 10 times the record's
    largest: organize holds it, decompose it and one expansion, stability it, a perturbed copy and
    that copy's bi-Haar expansion, an explorer job its heads (read unit-first: one copy, the two it
    held when it reordered the network tensor took 0.5 GB more at 1024 tokens). A fit free to trade
    the tensor's factor for the base and the length term asked decompose for 30 GB there."""
    tensor = 1132.462 * 16
    assert resources.memory_mb(rule, tensor, head_mb=134.218) >= copies * tensor


def test_a_recorded_peak_is_the_larger_of_snakemakes_sample_and_the_jobs_log(tmp_path):
    """bench/resources.py records the peak the job's log ends with (runtime.job_usage, the
    kernel's high-water mark) where it is above Snakemake's sampled one (every 30 s after 15 s)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_resources", BENCH / "resources.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tsv = tmp_path / "benchmarks" / "lm" / "decompose_sample3.tsv"
    log = tmp_path / "logs" / "lm" / "decompose_sample3.log"
    log.parent.mkdir(parents=True)
    rec = {"max_rss": "3070.25", "s": "43.16"}
    assert bench.peak_mb(tmp_path, tsv, rec) == 3070.25  # no log
    log.write_text("x INFO oattn: resources used: wall 43.0 s, CPU 41.0 s, peak RSS 3412.5 MB\n")
    assert bench.peak_mb(tmp_path, tsv, rec) == 3412.5
    log.write_text("x INFO oattn: resources used: wall 43.0 s, CPU 41.0 s, peak RSS 2990.0 MB\n")
    assert bench.peak_mb(tmp_path, tsv, rec) == 3070.25


def test_a_retry_asks_for_more_each_time():
    first = resources.memory_mb("organize", 1132.0)
    assert resources.memory_mb("organize", 1132.0, attempt=2) == pytest.approx(resources.GROWTH * first, abs=1)
    # 270 heads at 4096 tokens: an hour or more, above the 10-minute floor either way
    first = resources.runtime_minutes("organize", 18119.0, head_mb=134.2)
    assert first > resources.MIN_RUNTIME
    assert resources.runtime_minutes("organize", 18119.0, attempt=3, head_mb=134.2) == pytest.approx(
        resources.GROWTH ** 2 * first, abs=3)
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
    # the heads: the leading dimensions of the query x key arrays
    assert resources.stored_heads([pa, pb]) == 3 * 2 and resources.stored_heads([pb, tmp_path / "missing"]) == 0
    # one head: the largest query x key, as float64, of the arrays whose last dimensions are those
    assert resources.largest_head_mb([pa, pb]) == pytest.approx(40 * 30 * 8 / 1e6)
    assert resources.largest_head_mb([pb]) == 0
    (pa / "probs" / "zarr.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"probs/zarr\.json"):
        resources.largest_array_mb([pa])


@pytest.mark.workflow
def test_the_rules_ask_what_the_model_says_for_their_input_stores(clean_run):
    """organize (per sample and in batches), stability (per sample and the table), prune and
    theorem1 planned again on the tiny run (and what lies between them): every analysis job's
    mem_mb and runtime, as Snakemake reports them, are the model's for the stores the job reads (a
    batch job's: its samples'). A dry run on the completed run: Snakemake evaluates a request
    that reads the input files from the stores there, the ones a real rerun's jobs would read
    (on a fresh project, whose stores are not written yet, it leaves such a request undecided
    until the job runs)."""
    from wfutil import TINY, snakemake

    run = clean_run
    proc = snakemake(run, TINY, "-n", "--forcerun", "organize", "organize_batch_txl", "organize_batch_vit",
                     "stability_sample", "stability_sample_batch_txl", "stability", "prune", "theorem1",
                     "--until", "stability", "prune", "theorem1")
    text = proc.stdout + proc.stderr
    jobs = re.findall(r"rule (\w+):\n(?:    .*\n)*?    wildcards: ([^\n]*)\n(?:    .*\n)*?    resources: ([^\n]*)",
                      text)
    # every job with its outputs: a batch job (`<stage>_batch_<model>`) has no wildcards, its
    # outputs name its model and samples
    blocks = re.findall(r"rule (\w+):\n((?:    .*\n)+)", text)
    seen, batches = set(), set()
    res = run / "results"
    for rule, block in blocks:
        # a sample's replicates: the stability model; the model's stability table reads per-sample
        # summaries as the entropy job does, and asks what the entropy model says
        stage = {"stability_sample": "stability", "stability": "entropy"}.get(rule, rule_stage(rule))
        if stage not in resources.MODELS:
            continue
        fields = dict(line.strip().split(": ", 1) for line in block.splitlines() if ": " in line)
        got = dict(kv.split("=", 1) for kv in fields["resources"].split(", "))
        model = re.search(r"results/([^/]+)/", fields["output"]).group(1)
        base = res / model
        samples = sorted(int(k) for k in re.findall(r"/sample(\d+)\.zarr", fields["output"])) or sorted(
            int(p.name[6:-5]) for p in (base / "attention").glob("sample*.zarr"))
        if rule != rule_stage(rule):
            # txl's and vit's two samples; txl replicates one (stability.samples)
            assert "wildcards" not in fields and len(samples) == (1 if stage == "stability" else 2), (rule, fields)
            batches.add(stage)
        # no store a stage reads holds more entries than the attention tensor
        size = resources.largest_array_mb([base / "attention" / f"sample{k}.zarr" for k in samples])
        head = resources.largest_head_mb([base / "attention" / f"sample{k}.zarr" for k in samples])
        assert size > 0 and head > 0
        assert int(got["mem_mb"]) == resources.memory_mb(stage, size, head_mb=head), (rule, samples, got)
        assert int(got["runtime"]) >= resources.MIN_RUNTIME, (rule, samples, got)
        assert int(got["runtime"]) == resources.runtime_minutes(stage, size, len(samples), head_mb=head) or \
            stage in ("stability", "organize2d", "entropy"), (rule, samples, got)
        seen.add(stage)
    assert {"organize", "decompose", "entropy", "stability"} <= seen, (seen, text[-3000:])
    assert {"organize", "decompose"} <= batches, batches  # txl's and vit's batch jobs, checked alike
    # the prune jobs (one per model of a kind that prunes): the model of what they hold, from the
    # weights in the run's model folders
    from oattn_lib.config import SCHEMA, prune_settings, validate_config

    cfg = {**__import__("copy").deepcopy(TINY)}
    validate_config(cfg, str(SCHEMA))
    models = {m["name"]: m for m in cfg["models"]}

    def requests(name):
        """(wildcards, resources) of each planned job of rule `name`."""
        for rule, wildcards, resline in jobs:
            if rule == name:
                yield (dict(kv.split("=", 1) for kv in wildcards.split(", ")),
                       dict(kv.split("=", 1) for kv in resline.split(", ")))

    pruned = 0
    for w, got in requests("prune"):
        m = models[w["model"]]
        f = resources.model_job_features("prune", m, res / m["name"] / "model", prune_settings(cfg, m))
        assert f is not None and f["weights_mb"] > 0, (w, f)
        assert int(got["mem_mb"]) == resources.model_job_memory_mb("prune", f), (w, got, f)
        pruned += 1
    assert pruned == len(models), text[-3000:]
    # the theorem1 jobs: one head's memory, the time of the head-samples they measure
    measured = 0
    for w, got in requests("theorem1"):
        stores = sorted((res / w["model"] / "attention").glob("sample*.zarr"))
        k = cfg["theorem1"]["samples"]
        stores = stores if k == "all" else stores[:k]
        head = resources.largest_head_mb(stores)
        n = resources.theorem1_head_samples(resources.stored_heads(stores), len(stores), cfg["theorem1"]["max_heads"])
        assert head > 0 and n > 0
        assert int(got["mem_mb"]) == resources.head_job_memory_mb("theorem1", head), (w, got)
        assert int(got["runtime"]) == resources.head_job_runtime_minutes("theorem1", head, n), (w, got)
        measured += 1
    assert measured == len(models), text[-3000:]  # every model has a theorem1 job



# -- the jobs that hold a model: extract and prune ------------------------------------------------
def test_the_model_jobs_record_covers_both_rules_from_small_models_to_4096_tokens():
    for rule in resources.MODEL_JOBS:
        rows = MODEL_JOBS[MODEL_JOBS["rule"] == rule]
        assert rows["network_mb"].min() < 1 and rows["network_mb"].max() > 1000, rule
    assert MODEL_JOBS[MODEL_JOBS["rule"] == "extract"]["network_mb"].max() > 10_000  # 4096 tokens


@pytest.mark.parametrize("row", MODEL_JOBS.to_dict("records"),
                         ids=lambda r: f"{r['source']}-{r['model']}-{r['rule']}-{r['sample']}")
def test_a_model_job_asks_at_least_its_measured_peak_and_at_most_one_and_a_half_times_it(row):
    ask, minutes = _model_job_asks(row)
    assert row["max_rss_mb"] <= ask <= 1.5 * row["max_rss_mb"], (ask, row)
    assert minutes * 60 >= resources.TIME_MARGIN * row["seconds"], (minutes, row)


def test_parameters_are_counted_from_safetensors_headers_whatever_the_dtype(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.zeros(7)}, str(tmp_path / "model.safetensors"))
    torch.save({"w": torch.zeros(100)}, tmp_path / "checkpoint.pt")
    (tmp_path / "notes.txt").write_text("x" * 4000)
    assert resources.parameter_count([tmp_path / "model.safetensors"]) == 15 + 7
    # a directory's weight files, a checkpoint counted as float32 bytes, other files nothing
    pt = (tmp_path / "checkpoint.pt").stat().st_size // 4
    assert resources.parameter_count([tmp_path]) == 22 + pt
    assert resources.parameter_count([tmp_path / "missing"]) == 0


TRUNCATED_HEADER = b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}'.ljust(64)


@pytest.mark.parametrize("content, match", [(b"\xff" * 8 + b" " * 64, "no JSON header"),
                                            (b"\x05\0\0\0\0\0\0\0{not" + b" " * 64, "not JSON"),
                                            (b"\x11\0\0\0\0\0\0\0" + b'{"a":{"shape":3}}',
                                             "array 'a': dtype None is not a safetensors dtype"),
                                            (b"\x01\0", "no JSON header"),
                                            # a header whose tensors the file does not hold: truncated
                                            (b"\x40\0\0\0\0\0\0\0" + TRUNCATED_HEADER, "truncated")])
def test_a_malformed_safetensors_header_is_an_error_naming_the_file(tmp_path, content, match):
    # an absurd length is refused before anything of that size is read
    f = tmp_path / "bad.safetensors"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=rf"bad\.safetensors: .*{match}"):
        resources.parameter_count([f])


def test_model_job_features_follow_the_config(tmp_path):
    import torch
    from safetensors.torch import save_file

    from oattn_lib.config import complete_model

    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    save_file({"w": torch.zeros(1000, 250)}, str(model_dir / "model.safetensors"))
    (model_dir / "config.json").write_text('{"num_hidden_layers": 4, "num_attention_heads": 3, "vocab_size": 500}')
    (model_dir / "vocab.txt").write_text("[PAD]\n")
    m = complete_model({"name": "lm", "kind": "hf", "path": str(model_dir),
                        "extract": {"max_length": 100, "n_samples": 1}, "prune": {"held_out": {"hf_windows": 2}}})
    f = resources.model_job_features("extract", m, tmp_path / "results-model")
    # 250,000 float32 parameters; one layer's 3 heads x 100^2 of 4 layers
    assert f == pytest.approx({"weights_mb": 1.0, "attention_mb": 0.12, "logits_mb": 0.0, "network_mb": 0.48})
    half = resources.model_job_features("extract", {**m, "extract": {**m["extract"], "compute_dtype": "bfloat16"}},
                                        tmp_path / "results-model")
    assert half["weights_mb"] == pytest.approx(0.5)
    p = resources.model_job_features("prune", m, tmp_path / "results-model", m["prune"])
    # the gradient pass holds every layer's attention; 2 windows x 100 tokens x 500 logits
    assert p == pytest.approx({"weights_mb": 1.0, "attention_mb": 0.48, "logits_mb": 0.4, "network_mb": 0.48})
    assert resources.model_job_memory_mb("prune", p) > resources.model_job_memory_mb("extract", f)
    # twice the tokens: four times the attention; the budget caps the logits
    long = {**m, "extract": {**m["extract"], "max_length": 200}}
    assert resources.model_job_features("extract", long, tmp_path)["attention_mb"] == pytest.approx(0.48)
    huge = {**m, "prune": {"held_out": {"hf_windows": 10**6}}}
    assert resources.model_job_features("prune", huge, tmp_path, huge["prune"])["logits_mb"] == resources.EVAL_BUDGET_MB
    # a hub id: nothing to read before the job, so the profile's default
    assert resources.model_job_features("extract", {**m, "path": "someone/some-model"}, tmp_path) is None


def test_prune_passes_count_rankings_mask_sizes_and_windows():
    # 5 rankings + 3 random orders, masks 0-100% in steps of 0.2, 4 held-out windows
    assert resources.prune_passes({"fraction_step": 0.2, "random_seeds": 3, "held_out": {"hf_windows": 4}}) == 192
    assert resources.prune_passes({"fraction_step": 0.1, "random_seeds": 5, "held_out": {"hf_windows": 1}}) == 110
    # the bottom test's null: every set of 2 of 16 heads (120), or the random sets of 27 of 270
    txl = {"kind": "txl", "arch": {"n_layer": 4, "n_head": 4}}
    assert resources.prune_passes({"fraction_step": 0.1, "random_seeds": 5}, txl, 0.1) == 110 + 120
    big = {"kind": "txl", "arch": {"n_layer": 30, "n_head": 9}}
    assert resources.prune_passes({"fraction_step": 0.2, "random_seeds": 3, "held_out": {"hf_windows": 4},
                                   "bottom_random_sets": 19}, big, 0.1) == 192 + 19 * 4
    assert resources.prune_passes({"fraction_step": 0.2, "random_seeds": 3, "held_out": {"hf_windows": 4}}) == 192
    first = resources.model_job_runtime_minutes("prune", {"network_mb": 1132.0}, 192)
    assert resources.model_job_runtime_minutes("prune", {"network_mb": 1132.0}, 192, attempt=2) > first
    with pytest.raises(ValueError, match="no resource model"):
        resources.model_job_memory_mb("train", {"weights_mb": 1.0, "attention_mb": 0, "logits_mb": 0})


def test_a_chained_job_asks_the_most_memory_and_the_sum_of_the_times():
    parts = [{"mem_mb": lambda w, i, a, m=m: m * a, "runtime": lambda w, i, a, t=t: t} for m, t in ((100, 5), (300, 7))]
    both = resources.chained(parts)
    assert both["mem_mb"](None, None, 2) == 600 and both["runtime"](None, None, 1) == 12


@pytest.mark.parametrize("max_jobs, timespan, local, lifted", [(100, 1.0, True, True), (100, 1.0, False, False),
                                                               (10, 1.0, True, False), (100, 120.0, True, False)])
def test_only_snakemakes_default_job_rate_limit_is_lifted_and_only_locally(max_jobs, timespan, local, lifted):
    from types import SimpleNamespace

    limiter = SimpleNamespace(max_jobs=max_jobs, timespan=timespan)
    workflow = SimpleNamespace(scheduler=SimpleNamespace(job_rate_limiter=limiter), local_exec=local)
    assert resources.lift_default_job_rate_limit(workflow) is lifted
    assert workflow.scheduler.job_rate_limiter is (None if lifted else limiter)
    # no limiter (a dry run) stays none
    workflow.scheduler.job_rate_limiter = None
    assert resources.lift_default_job_rate_limit(workflow) is False
