"""The softmax-free experiment: its runs as models of the graph, Table 5 from their stores, and
`snakemake softmax_free` on the tiny config (one seed, a few steps) beside a completed run of
the ordinary models."""
from __future__ import annotations

import copy
import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import store
from oattn_lib.plan import rule_stage
from oattn_lib.stages.softmax_free_table import table5
from wfutil import REPO, TINY


def fake_run(root, model, kind, attention, seed, value, entropy, diverged=False, paraproduct=None):
    """The files one run leaves for the table: model/metrics.json, entropy.zarr and, for a
    softmax run, paraproduct.zarr (results/softmax_free/<model>/<attention>/seed<k>/)."""
    d = root / model / attention / f"seed{seed}"
    (d / "model").mkdir(parents=True)
    key = "valid_ppl" if kind == "txl" else "test_accuracy"
    (d / "model" / "metrics.json").write_text(json.dumps({key: value, "attention": attention, "seed": seed,
                                                          "steps": 7, "seconds_per_step": 0.5,
                                                          "diverged": diverged, "history": []}))
    e = np.full((2, 2, 3), entropy, dtype=float)
    store.write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), e),
                                  "head_sparsity": (("sample", "layer", "head"), e / 2)}), d / "entropy.zarr")
    pp = None
    if paraproduct is not None:
        dims = ("sample", "layer", "head")
        pp = d / "paraproduct.zarr"
        store.write_store(xr.Dataset({"rel_residual": (dims, np.full((1, 2, 3), paraproduct[0])),
                                      "rel_residual_unorganized": (dims, np.full((1, 2, 3), paraproduct[1]))}), pp)
    return {"model": model, "kind": kind, "attention": attention, "seed": seed,
            "metrics": str(d / "model" / "metrics.json"), "entropy": str(d / "entropy.zarr"),
            "paraproduct": str(pp) if pp else None}


def test_table5_means_spreads_and_deltas(tmp_path):
    runs = [fake_run(tmp_path, "txl", "txl", "softmax", s, v, 2.0, paraproduct=(0.1, 0.3))
            for s, v in enumerate((100.0, 110.0, 120.0))]
    runs += [fake_run(tmp_path, "txl", "txl", "tensor_q", s, v, 4.0) for s, v in enumerate((130.0, 150.0, 170.0))]
    runs += [fake_run(tmp_path, "txl", "txl", "tensor_q_row", 0, float("nan"), 9.0, diverged=True)]
    runs += [fake_run(tmp_path, "vit", "vit", "softmax", 0, 0.9, 1.0, paraproduct=(0.2, 0.2)),
             fake_run(tmp_path, "vit", "vit", "tensor_q", 0, 0.8, 1.5)]
    out = tmp_path / "t5"
    table5(runs, out / "table5.csv", out / "table5.md", out / "fig8.png")
    df = pd.read_csv(out / "table5.csv")
    assert list(zip(df["model"], df["attention"])) == [("txl", "softmax"), ("txl", "tensor_q"), ("txl", "tensor_q_row"),
                                                       ("vit", "softmax"), ("vit", "tensor_q")]
    soft, tq, row = (df.iloc[i] for i in range(3))
    assert soft["mean"] == pytest.approx(110.0) and soft["sd"] == pytest.approx(10.0)
    assert tq["mean"] == pytest.approx(150.0) and tq["delta_vs_softmax"] == pytest.approx(40.0)
    assert (tq["min"], tq["max"]) == (130.0, 170.0)
    assert soft["head_entropy_median"] == 2.0 and tq["head_sparsity_median"] == 2.0
    # a diverged run is counted, and its heads (here finite: its initial weights') left out
    assert row["diverged"] == 1 and row["seeds"] == 1 and np.isnan(row["mean"])
    assert np.isnan(row["head_entropy_median"])
    assert soft["paraproduct_organized"] == pytest.approx(0.1)
    assert soft["paraproduct_unorganized"] == pytest.approx(0.3)
    assert np.isnan(tq["paraproduct_organized"])
    assert df.iloc[4]["delta_vs_softmax"] == pytest.approx(-0.1)
    assert df["metric"].tolist()[3] == "test accuracy"
    md = (out / "table5.md").read_text()
    assert "110 ± 10" in md and "0.1 / 0.3" in md
    assert (out / "fig8.png").stat().st_size > 10_000


def test_table5_needs_runs(tmp_path):
    with pytest.raises(ValueError, match="runs"):
        table5([], tmp_path / "a.csv", tmp_path / "a.md", tmp_path / "a.png")


def test_a_diverged_run_keeps_its_initial_weights(tmp_path, monkeypatch):
    """The graph plans a run's extraction before training: a run whose training diverged must
    still leave finite weights, its initial ones, and say so."""
    import torch

    from oattn_lib.models.checkpoint import build_model, load_checkpoint
    from oattn_lib import train as trainlib
    from oattn_lib.stages import softmax_free_train as stage
    from oattn_lib.train import state_hash

    arch = {"n_layer": 1, "n_head": 2, "d_model": 8, "d_head": 4, "d_inner": 16, "tgt_len": 6, "mem_len": 6,
            "dropout": 0.0, "dropatt": 0.0, "cutoffs": [], "div_val": 1, "attention": "softmax"}
    store.save_npz(tmp_path / "d.npz", **{s: np.arange(200) % 10 for s in ("train", "valid", "test")})
    (tmp_path / "meta.json").write_text(json.dumps({"vocab": [str(i) for i in range(10)]}))

    def blow_up(model, *args, **kwargs):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        return {"valid_ppl": float("nan"), "unigram_ppl": 10.0,
                "history": [{"step": 1, "loss": float("nan"), "lr": 1.0, "elapsed": 0.1}]}

    monkeypatch.setattr(trainlib, "train_txl", blow_up)
    stage.train_run("txl", arch, {"steps": 3, "batch_size": 2, "lr": 1.0, "warmup": 0}, {"corpus": "stdlib"},
                    tmp_path / "d.npz", tmp_path / "meta.json", "tensor_q_row", 4, 3,
                    tmp_path / "checkpoint.pt", tmp_path / "metrics.json", device="cpu")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["diverged"] is True and metrics["weights"] == "initial"
    ck = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ck["arch"]["attention"] == "tensor_q_row"
    assert all(torch.isfinite(v).all() for v in ck["state_dict"].values())
    torch.manual_seed(4)
    assert state_hash(ck["state_dict"]) == state_hash(build_model("txl", ck["arch"], n_token=10).state_dict())


# ------------------------------------------------------------------ the runs as models
def validated(cfg):
    from oattn_lib.config import validate_config
    cfg = copy.deepcopy(cfg)
    validate_config(cfg, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return cfg


def sf_config(**softmax_free):
    """The tiny config (every model as clean_run ran it) with a one-seed experiment."""
    cfg = copy.deepcopy(TINY)
    cfg["softmax_free"] = {"variants": ["tensor_q"], "seeds": 1, "steps": 12, "n_samples": 1,
                           "paraproduct_samples": 1, **softmax_free}
    return cfg


def test_runs_are_models_named_by_their_directory():
    from oattn_lib.softmax_free import run_models
    cfg = validated(sf_config(variants=["tensor_q", "tensor_k_diag"], seeds=2, n_samples=3, steps=5))
    runs = run_models(cfg)
    assert list(runs) == [f"softmax_free/{m}/{a}/seed{s}" for m in ("txl", "vit")
                          for a in ("softmax", "tensor_q", "tensor_k_diag") for s in (0, 1)]
    base = {m["name"]: m for m in cfg["models"]}
    for name, run in runs.items():
        _, model, attention, seed = name.split("/")
        b = base[model]
        assert run["name"] == name and run["kind"] == b["kind"] and run["data"] == b["data"]
        assert run["arch"] == {**b["arch"], "attention": attention}
        assert run["train"] == {**b["train"], "seed": int(seed[4:])}
        # every run of a model extracts the same samples, its own number of them, stored and analysed as the
        # base model's (its masked-entries rule included)
        assert run["extract"] == {"n_samples": 3, "quantity": "probs",
                                  **{k: b["extract"][k] for k in ("seed", "dtype", "layers", "heads", "masked")}}
        assert run["softmax_free"] == {"attention": attention, "model": model, "seed": int(seed[4:]), "steps": 5}
        # canonical like the validated config, so rule params compare by value
        assert list(run) == sorted(run) and list(run["arch"]) == sorted(run["arch"])
    assert run_models(validated(sf_config(models=["vit"]))).keys() == {"softmax_free/vit/softmax/seed0",
                                                                      "softmax_free/vit/tensor_q/seed0"}


def test_selecting_a_model_the_experiment_cannot_train_is_a_config_error():
    from oattn_lib.config import ConfigError
    from oattn_lib.config import check_config
    with pytest.raises(ConfigError, match=r"softmax_free.models: \['lm'\].*allowed: \['txl', 'vit'\]"):
        check_config(validated(sf_config(models=["txl", "lm"])))


def test_training_never_runs_the_table_code():
    """Code fingerprints: editing Table 5's or the figures' code reruns the table, never the
    trainings; editing the trainer reruns the trainings."""
    from oattn_lib.fingerprint import module_closure
    closure = {s: set(module_closure(REPO / "scripts" / f"softmax_free_{s}.py", REPO))
               for s in ("train", "paraproduct", "table")}
    assert not {"oattn_lib.softmax_free", "oattn_lib.plots", "oattn_lib.questionnaire"} & closure["train"]
    assert {"oattn_lib.train", "oattn_lib.tensor_attention"} <= closure["train"]
    assert {"oattn_lib.softmax_free", "oattn_lib.plots"} <= closure["table"]
    assert "oattn_lib.questionnaire" in closure["paraproduct"] and "oattn_lib.plots" not in closure["paraproduct"]


# ------------------------------------------------------------------ the real workflow
def job_models(proc) -> set[str]:
    """The `model` wildcard of every job a dry run plans."""
    return set(re.findall(r"wildcards: model=([^,\s]+)", proc.stdout + proc.stderr))


@pytest.mark.workflow
def test_a_dry_run_plans_every_sample_of_every_run_as_its_own_job(tmp_path):
    from wfutil import by_stage, planned_jobs, snakemake
    cfg = sf_config(seeds=2, n_samples=3, variants=["tensor_q", "tensor_k"])
    runs = 2 * 3 * 2  # models x (softmax + 2 variants) x seeds
    common = {"prepare_data": 2, "softmax_free_train": runs, "entropy": runs, "softmax_free_paraproduct": 2 * 2,
              "softmax_free_table": 1, "softmax_free": 1, "kernels": 1}
    # the runs are tiny: one job per stage for the 3 samples of each (jobs.batch_max_entries) ...
    proc = snakemake(tmp_path, cfg, "-n", "softmax_free")
    planned = planned_jobs(proc)
    assert by_stage(planned) == {**common, "extract": runs, "organize": runs, "decompose": runs}
    assert planned["extract_batch_softmax_free_vit_tensor_q_seed1"] == 1
    assert job_models(proc) == {"txl", "vit"} | {f"softmax_free/{m}/{a}/seed{s}" for m in ("txl", "vit")
                                                 for a in ("softmax", "tensor_q", "tensor_k") for s in (0, 1)}
    # ... and one job per sample without batching
    cfg["jobs"] = {"batch_max_entries": 0}
    proc = snakemake(tmp_path, cfg, "-n", "softmax_free")
    assert planned_jobs(proc) == {**common, "extract": 3 * runs, "organize": 3 * runs, "decompose": 3 * runs}


@pytest.fixture(scope="module")
def sf_run(clean_run, tmp_path_factory):
    """clean_run's project (the tiny config, run to the end), then `snakemake softmax_free`."""
    from wfutil import snakemake
    workdir = tmp_path_factory.mktemp("softmax_free")
    shutil.copytree(clean_run / "results", workdir / "results")
    shutil.copytree(clean_run / ".snakemake", workdir / ".snakemake",
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    proc = snakemake(workdir, sf_config(), "softmax_free")
    return workdir, proc


# the slow tier (CI): sf_run trains and analyses four runs; make test keeps their plans (the dry runs
# below), Table 5 (test_table5_means_spreads_and_deltas), the training (test_a_diverged_run_keeps_its_initial_weights)
@pytest.mark.slow
@pytest.mark.workflow
def test_snakemake_softmax_free_builds_table5_and_figure8(sf_run):
    workdir, proc = sf_run
    # nothing of the ordinary models ran again: they only lend their datasets
    assert {rule_stage(r) for r in re.findall(r"\(Rule: (\w+)\)", proc.stdout + proc.stderr)} == {
        "softmax_free_train", "extract", "organize", "decompose", "entropy", "softmax_free_paraproduct",
        "softmax_free_table", "softmax_free"}
    assert all(m.startswith("softmax_free/") for m in job_models(proc))
    res = workdir / "results" / "softmax_free"
    df = pd.read_csv(res / "table5.csv")
    assert list(zip(df["model"], df["attention"])) == [("txl", "softmax"), ("txl", "tensor_q"),
                                                       ("vit", "softmax"), ("vit", "tensor_q")]
    assert (df["seeds"] == 1).all() and (df["steps"] == 12).all() and (df["diverged"] == 0).all()
    assert np.isfinite(df["mean"]).all() and np.isfinite(df["head_entropy_median"]).all()
    assert df["paraproduct_organized"].notna().tolist() == [True, False, True, False]
    assert (res / "fig8.png").stat().st_size > 10_000
    assert (res / "table5.md").read_text().startswith("| model")
    # a tensor run laid out as any model, its maps made by the ordinary stages
    run = res / "txl" / "tensor_q" / "seed0"
    att = xr.open_zarr(run / "attention" / "sample0.zarr", consolidated=False).load()
    probs = att["probs"].values
    assert np.isfinite(probs).all() and (np.triu(probs, 1) == 0).all()  # causal normalised T
    assert not np.allclose(probs.sum(-1), 1.0)  # trace-normalised, not a softmax
    assert att.attrs["code"].startswith("extract:")
    assert json.loads(att.attrs["config"])["arch"]["attention"] == "tensor_q"
    assert (run / "organized" / "sample0.zarr").exists() and (run / "decomposed" / "sample0.zarr").exists()
    m = json.loads((res / "vit" / "tensor_q" / "seed0" / "model" / "metrics.json").read_text())
    assert m["steps"] == 12 and m["attention"] == "tensor_q"
    # the softmax and tensor runs of a model saw the same inputs
    for model in ("txl", "vit"):
        idx = {xr.open_zarr(res / model / a / "seed0" / "attention" / "sample0.zarr",
                            consolidated=False).attrs["source_index"] for a in ("softmax", "tensor_q")}
        assert len(idx) == 1
    # one log and one benchmark per job (a tiny run's sample in one job per stage: extract.log, ...)
    logs = workdir / "results" / "logs"
    assert (logs / "softmax_free" / "table5.log").exists()
    for name in ("train", "extract", "organize", "decompose", "entropy"):
        assert (logs / "softmax_free" / "txl" / "tensor_q" / "seed0" / f"{name}.log").exists(), name
        assert (workdir / "results" / "benchmarks" / "softmax_free" / "vit" / "softmax" / "seed0"
                / f"{name}.tsv").exists(), name
    assert (logs / "softmax_free" / "vit" / "softmax" / "seed0" / "paraproduct.log").exists()


@pytest.mark.slow  # sf_run
@pytest.mark.workflow
def test_table5_is_its_runs_stores_summarised(sf_run):
    workdir, _ = sf_run
    res = workdir / "results" / "softmax_free"
    df = pd.read_csv(res / "table5.csv").set_index(["model", "attention"])
    for (model, attention), row in df.iterrows():
        run = res / model / attention / "seed0"
        metrics = json.loads((run / "model" / "metrics.json").read_text())
        assert row["mean"] == pytest.approx(metrics["valid_ppl" if model == "txl" else "test_accuracy"])
        assert row["s_per_step"] == pytest.approx(metrics["seconds_per_step"])
        ent = xr.open_zarr(run / "entropy.zarr", consolidated=False)
        assert ent.attrs["code"].startswith("entropy:")  # the ordinary entropy stage's store
        assert row["head_entropy_median"] == pytest.approx(float(np.nanmedian(ent["head_entropy"].values)))
        assert row["head_sparsity_median"] == pytest.approx(float(np.nanmedian(ent["head_sparsity"].values)))
        if attention == "softmax":
            pp = xr.open_zarr(run / "paraproduct.zarr", consolidated=False)
            assert pp.sizes["sample"] == 1 and pp.sizes["layer"] == 2 and pp.sizes["head"] == 2
            assert row["paraproduct_organized"] == pytest.approx(float(np.median(pp["rel_residual"].values)))
            assert row["paraproduct_unorganized"] == pytest.approx(
                float(np.median(pp["rel_residual_unorganized"].values)))
        else:
            assert not (run / "paraproduct.zarr").exists()


@pytest.mark.slow  # sf_run
@pytest.mark.workflow
def test_report_has_table5_and_it_stays_in_the_default_target(sf_run):
    from wfutil import planned_jobs, snakemake
    workdir, _ = sf_run
    snakemake(workdir, sf_config(), "--report", str(workdir / "report.html"), "softmax_free")
    html = (workdir / "report.html").read_text(errors="replace")
    assert "table5.md" in html and "fig8.png" in html and "Table 5" in html
    # once run, the default target keeps the experiment (so the report keeps Table 5) ...
    forced = planned_jobs(snakemake(workdir, sf_config(), "-n", "--forceall"))
    assert forced.get("softmax_free_table") == 1 and forced.get("softmax_free_train") == 4
    # ... with nothing to redo, of it or of the ordinary models
    assert planned_jobs(snakemake(workdir, sf_config(), "-n")) == {}


@pytest.mark.slow  # sf_run
@pytest.mark.workflow
def test_what_a_change_reruns(sf_run):
    from wfutil import by_stage, planned_jobs, snakemake
    workdir, _ = sf_run

    def plan(**edit):
        proc = snakemake(workdir, sf_config(enabled=True, **edit), "-n")
        # the default target: the experiment's runs only, never the ordinary models again
        assert all(m.startswith("softmax_free/") for m in job_models(proc)), job_models(proc)
        return by_stage(planned_jobs(proc))

    table = {"softmax_free_table": 1, "all": 1}
    assert plan(paraproduct_samples=0) == table
    assert plan(quantity="scores") == {"organize": 4, "decompose": 4, "entropy": 4, **table}
    assert plan(steps=13) == {"softmax_free_train": 4, "extract": 4, "organize": 4, "decompose": 4, "entropy": 4,
                              "softmax_free_paraproduct": 2, **table}
    assert plan(variants=["tensor_q", "tensor_k_diag"]) == {
        "softmax_free_train": 2, "extract": 2, "organize": 2, "decompose": 2, "entropy": 2, **table}
    # the workflow's own analysis settings reach the runs through the ordinary rules
    cfg = sf_config(enabled=True)
    cfg["entropy"] = {**cfg["entropy"], "head_top_k": 8}
    jobs = by_stage(planned_jobs(snakemake(workdir, cfg, "-n")))
    assert jobs["entropy"] == 3 + 4 and jobs["softmax_free_table"] == 1


@pytest.mark.workflow
def test_enabled_flag_puts_the_experiment_in_the_default_target(tmp_path):
    from wfutil import by_stage, planned_jobs, snakemake
    off = by_stage(planned_jobs(snakemake(tmp_path, sf_config(), "-n")))
    on = by_stage(planned_jobs(snakemake(tmp_path, sf_config(enabled=True), "-n")))
    assert "softmax_free_train" not in off
    runs = {"softmax_free_train": 4, "extract": 4, "organize": 4, "decompose": 4, "entropy": 4,
            "softmax_free_paraproduct": 2, "softmax_free_table": 1}
    assert on == {k: off.get(k, 0) + runs.get(k, 0) for k in off.keys() | runs.keys()}


BAD_CONFIGS = [
    ({"variants": ["tensor_q_tril"]}, "tensor_q_tril"),
    ({"variants": ["softmax_q"]}, "softmax_q"),
    ({"models": ["nope"]}, "softmax_free.models"),
    ({"models": ["lm"]}, "softmax_free.models"),
    ({"seeds": 0}, "seeds"),
    ({"step": 3}, "step"),
]


@pytest.mark.parametrize("edit, message", BAD_CONFIGS)
def test_bad_softmax_free_config_is_one_line_naming_the_key(edit, message):
    """The start-up validation the Snakefile runs before anything (validate_config, its disk check
    left to the Snakefile as there), on each bad experiment section."""
    from oattn_lib.config import ConfigError, validate_config
    with pytest.raises(ConfigError) as err:
        validate_config(sf_config(**edit), str(REPO / "workflow" / "schemas" / "config.schema.yaml"), check_disk=False)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.workflow
def test_bad_softmax_free_config_stops_snakemake_at_start(tmp_path):
    """One of the bad sections above through the real Snakefile (its other cases are the same
    validation): `snakemake softmax_free` stops before planning, naming the key, writing nothing."""
    from wfutil import snakemake
    edit, message = BAD_CONFIGS[3]
    proc = snakemake(tmp_path, sf_config(**edit), "-n", "softmax_free", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()
