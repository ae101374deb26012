"""The softmax-free experiment: Table 5 from its runs, and `snakemake softmax_free` on a tiny
config (one seed, a few steps) in a temporary directory."""
from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import store
from oattn_lib.softmax_free import table5


def fake_run(root, model, kind, attention, seed, value, entropy, diverged=False, paraproduct=None):
    d = root / model / attention / f"seed{seed}"
    (d / "analysis").mkdir(parents=True)
    key = "valid_ppl" if kind == "txl" else "test_accuracy"
    (d / "metrics.json").write_text(json.dumps({key: value, "attention": attention, "seed": seed, "steps": 7,
                                                "seconds_per_step": 0.5, "diverged": diverged, "history": []}))
    e = np.full((2, 2, 3), entropy, dtype=float)
    store.write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), e),
                                  "head_sparsity": (("sample", "layer", "head"), e / 2)}),
                      d / "analysis" / "entropy.zarr")
    if paraproduct is not None:
        dims = ("sample", "layer", "head")
        store.write_store(xr.Dataset({"rel_residual": (dims, np.full((1, 2, 3), paraproduct[0])),
                                      "rel_residual_unorganized": (dims, np.full((1, 2, 3), paraproduct[1]))}),
                          d / "analysis" / "paraproduct.zarr")
    return {"model": model, "kind": kind, "attention": attention, "seed": seed,
            "metrics": str(d / "metrics.json"), "analysis": str(d / "analysis")}


def test_table5_means_spreads_and_deltas(tmp_path):
    runs = [fake_run(tmp_path, "txl", "txl", "softmax", s, v, 2.0, paraproduct=(0.1, 0.3))
            for s, v in enumerate((100.0, 110.0, 120.0))]
    runs += [fake_run(tmp_path, "txl", "txl", "tensor_q", s, v, 4.0) for s, v in enumerate((130.0, 150.0, 170.0))]
    runs += [fake_run(tmp_path, "txl", "txl", "tensor_q_row", 0, float("nan"), np.nan, diverged=True)]
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
    assert row["diverged"] == 1 and np.isnan(row["mean"])
    assert soft["paraproduct_organized"] == pytest.approx(0.1)
    assert soft["paraproduct_unorganized"] == pytest.approx(0.3)
    assert np.isnan(tq["paraproduct_organized"])
    assert df.iloc[4]["delta_vs_softmax"] == pytest.approx(-0.1)
    assert df["metric"].tolist()[3] == "test accuracy"
    md = (out / "table5.md").read_text()
    assert "110 ± 10" in md and "0.1 / 0.3" in md
    assert (out / "fig8.png").stat().st_size > 10_000


def test_a_diverged_run_is_reported_not_analysed(tmp_path):
    import torch

    from oattn_lib.softmax_free import analyse_run
    ck = tmp_path / "checkpoint.pt"
    torch.save({"kind": "txl", "arch": {"n_layer": 3, "n_head": 2}, "state_dict": {}}, ck)
    (tmp_path / "metrics.json").write_text(json.dumps({"valid_ppl": float("nan"), "attention": "tensor_q_row",
                                                       "seed": 0, "diverged": True}))
    analyse_run("txl", {"name": "txl"}, None, None, ck, tmp_path / "metrics.json", tmp_path / "analysis",
                n_samples=2)
    e = store.read_store(tmp_path / "analysis" / "entropy.zarr")
    assert e["head_entropy"].shape == (2, 3, 2) and np.isnan(e["head_entropy"].values).all()
    assert not (tmp_path / "analysis" / "attention").exists()


def test_table5_needs_runs(tmp_path):
    with pytest.raises(ValueError, match="runs"):
        table5([], tmp_path / "a.csv", tmp_path / "a.md", tmp_path / "a.png")


# ------------------------------------------------------------------ the real workflow
def sf_config(**softmax_free):
    from wfutil import TINY
    cfg = copy.deepcopy(TINY)
    cfg["models"] = [m for m in cfg["models"] if m["kind"] in ("txl", "vit")]
    for m in cfg["models"]:
        m["extract"]["n_samples"] = 1
    cfg["softmax_free"] = {"variants": ["tensor_q"], "seeds": 1, "steps": 12, "n_samples": 1,
                           "paraproduct_samples": 1, **softmax_free}
    return cfg


@pytest.fixture(scope="module")
def sf_run(tmp_path_factory):
    from wfutil import snakemake
    workdir = tmp_path_factory.mktemp("softmax_free")
    snakemake(workdir, sf_config(), "softmax_free")
    return workdir


@pytest.mark.workflow
def test_snakemake_softmax_free_builds_table5_and_figure8(sf_run):
    res = sf_run / "results" / "softmax_free"
    df = pd.read_csv(res / "table5.csv")
    assert list(zip(df["model"], df["attention"])) == [("txl", "softmax"), ("txl", "tensor_q"),
                                                       ("vit", "softmax"), ("vit", "tensor_q")]
    assert (df["seeds"] == 1).all() and (df["steps"] == 12).all() and (df["diverged"] == 0).all()
    assert np.isfinite(df["mean"]).all() and np.isfinite(df["head_entropy_median"]).all()
    assert df["paraproduct_organized"].notna().tolist() == [True, False, True, False]
    assert (res / "fig8.png").stat().st_size > 10_000
    assert (res / "table5.md").read_text().startswith("| model")
    # the tensor runs' attention maps went through the workflow's own stages unchanged
    run = res / "txl" / "tensor_q" / "seed0" / "analysis"
    att = xr.open_zarr(run / "attention" / "sample0.zarr", consolidated=False).load()
    probs = att["probs"].values
    assert np.isfinite(probs).all() and (np.triu(probs, 1) == 0).all()  # causal normalised T
    assert not np.allclose(probs.sum(-1), 1.0)  # trace-normalised, not a softmax
    assert (run / "organized" / "sample0.zarr").exists() and (run / "decomposed" / "sample0.zarr").exists()
    m = json.loads((res / "vit" / "tensor_q" / "seed0" / "metrics.json").read_text())
    assert m["steps"] == 12 and m["attention"] == "tensor_q"
    logs = {p.name for p in (sf_run / "results" / "logs" / "softmax_free").iterdir()}
    assert {"table5.log", "txl_tensor_q_seed0_train.log", "vit_softmax_seed0_analyse.log"} <= logs


@pytest.mark.workflow
def test_report_has_table5_and_it_stays_in_the_default_target(sf_run):
    from wfutil import planned_jobs, snakemake
    snakemake(sf_run, sf_config(), "--report", str(sf_run / "report.html"), "softmax_free")
    html = (sf_run / "report.html").read_text(errors="replace")
    assert "table5.md" in html and "fig8.png" in html and "Table 5" in html
    # once run, the default target keeps the experiment (so the report keeps Table 5) ...
    forced = planned_jobs(snakemake(sf_run, sf_config(), "-n", "--forceall"))
    assert forced.get("softmax_free_table") == 1 and forced.get("softmax_free_train") == 4
    # ... with nothing of it to redo
    assert not {"softmax_free_train", "softmax_free_analyse", "softmax_free_table"} & set(
        planned_jobs(snakemake(sf_run, sf_config(), "-n")))


@pytest.mark.workflow
def test_what_a_change_reruns(sf_run):
    from wfutil import planned_jobs, snakemake
    jobs = planned_jobs(snakemake(sf_run, sf_config(paraproduct_samples=0), "-n", "softmax_free"))
    assert jobs == {"softmax_free_analyse": 4, "softmax_free_table": 1, "softmax_free": 1}
    jobs = planned_jobs(snakemake(sf_run, sf_config(steps=13), "-n", "softmax_free"))
    assert jobs == {"softmax_free_train": 4, "softmax_free_analyse": 4, "softmax_free_table": 1, "softmax_free": 1}
    jobs = planned_jobs(snakemake(sf_run, sf_config(variants=["tensor_q", "tensor_k_diag"]), "-n", "softmax_free"))
    assert jobs == {"softmax_free_train": 2, "softmax_free_analyse": 2, "softmax_free_table": 1, "softmax_free": 1}


@pytest.mark.workflow
def test_enabled_flag_puts_the_experiment_in_the_default_target(tmp_path):
    from wfutil import planned_jobs, snakemake
    off = planned_jobs(snakemake(tmp_path, sf_config(), "-n"))
    on = planned_jobs(snakemake(tmp_path, sf_config(enabled=True), "-n"))
    assert "softmax_free_train" not in off
    assert on["softmax_free_train"] == 4 and on["softmax_free_table"] == 1
    assert {k: v for k, v in on.items() if not k.startswith("softmax_free")} == off


@pytest.mark.workflow
@pytest.mark.parametrize("edit, message", [
    ({"variants": ["tensor_q_tril"]}, "tensor_q_tril"),
    ({"variants": ["softmax_q"]}, "softmax_q"),
    ({"models": ["nope"]}, "softmax_free.models"),
    ({"seeds": 0}, "seeds"),
    ({"step": 3}, "step"),
])
def test_bad_softmax_free_config_stops_at_start(tmp_path, edit, message):
    from wfutil import snakemake
    proc = snakemake(tmp_path, sf_config(**edit), "-n", "softmax_free", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()
