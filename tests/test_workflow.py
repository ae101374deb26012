"""The real Snakemake workflow, end to end on a tiny config, and what a change reruns.

Runs `snakemake` in a temporary directory (real training for a few steps, real
extraction, organize, decompose, entropy, tables, figures, report), then checks the
artifacts and which jobs a dry run plans after changing one parameter.
"""
from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = pytest.mark.workflow

TINY = {
    "results": "results",
    "models": [
        {"name": "txl", "kind": "txl",
         "data": {"corpus": "stdlib", "min_freq": 5, "max_size": 2000, "seed": 0},
         "arch": {"n_layer": 2, "n_head": 2, "d_model": 32, "d_head": 8, "d_inner": 64,
                  "tgt_len": 24, "mem_len": 24, "dropout": 0.1, "cutoffs": [500]},
         "train": {"steps": 200, "batch_size": 16, "lr": 0.005, "warmup": 10, "seed": 0},
         "extract": {"quantity": "scores", "n_samples": 2, "seed": 0}},
        {"name": "vit", "kind": "vit",
         "data": {"dataset": "digits", "image_size": 16, "seed": 0},
         "arch": {"patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 16, "mlp_dim": 32},
         "train": {"epochs": 4, "batch_size": 32, "lr": 0.003, "seed": 0},
         "extract": {"quantity": "probs", "n_samples": 2, "seed": 0}},
        {"name": "lm", "kind": "hf", "path": "minilm", "data": {"corpus": "stdlib", "seed": 0},
         "extract": {"quantity": "probs", "n_samples": 2, "seed": 0, "max_length": 20}},
    ],
    "organize": {"n_iters": 1},
    "decompose": {"figure_heads": [[0, 0], [-1, -1]], "questionnaire2d_iters": 2, "random_tree_seeds": 1},
    "entropy": {"head_top_k": 16, "network_top_k": 10, "fraction": 0.25},
    "figures": {"entropy_samples": 2, "trihaar_samples": 2, "trihaar_top_k": 20},
}


def snakemake(workdir: Path, config: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.run(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                                       "--configfile", str(cfg), "--cores", "2", *args],
                          capture_output=True, text=True, timeout=1800)
    if check and proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    block = text.split("Job stats:")[-1]
    jobs = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("oattn_workflow")
    snakemake(workdir, TINY)
    return workdir


def test_every_store_has_named_dims_and_finite_values(run):
    res = run / "results"
    for model, n_layer, n_head, n_tok in (("txl", 2, 2, 24), ("vit", 2, 2, 17), ("lm", 6, 12, 20)):
        for i in range(2):
            att = xr.open_zarr(res / model / "attention" / f"sample{i}.zarr", consolidated=False).load()
            assert att["probs"].dims == ("layer", "head", "query", "key")
            assert att.sizes == {"layer": n_layer, "head": n_head, "query": n_tok, "key": n_tok}
            assert np.isfinite(att["scores"].values).all() and np.isfinite(att["probs"].values).all()
            np.testing.assert_allclose(att["probs"].sum("key").values, 1.0, atol=1e-5)
            assert "config" in att.attrs and len(att.attrs["checkpoint_sha256"]) == 64
            org = xr.open_zarr(res / model / "organized" / f"sample{i}.zarr", consolidated=False).load()
            assert org["tree_h"].dims == ("level_h", "unit") and org.sizes["unit"] == n_layer * n_head
            assert org["tree_q"].sizes["query"] == n_tok
            dec = xr.open_zarr(res / model / "decomposed" / f"sample{i}.zarr", consolidated=False).load()
            assert dec["bihaar"].dims == ("qbasis", "kbasis", "unit")
            for v in dec.data_vars:
                assert np.isfinite(dec[v].values).all(), (model, i, v)
            # the stored coefficients reconstruct the analysed tensor exactly (orthonormal bases)
            x = att["scores" if model == "txl" else "probs"].stack(unit=("layer", "head")).transpose("query", "key", "unit")
            assert np.linalg.norm(dec["trihaar"].values) == pytest.approx(np.linalg.norm(x.values), rel=1e-4)
        ent = xr.open_zarr(res / model / "entropy.zarr", consolidated=False).load()
        assert ent["head_entropy"].dims == ("sample", "layer", "head")
        assert ent["head_entropy"].shape == (2, n_layer, n_head)
        assert np.isfinite(ent["head_entropy"].values).all() and (ent["head_entropy"].values > 0).all()


def test_training_learned_something(run):
    import json
    m = json.loads((run / "results" / "txl" / "model" / "metrics.json").read_text())
    assert m["valid_ppl"] < m["unigram_ppl"]
    v = json.loads((run / "results" / "vit" / "model" / "metrics.json").read_text())
    assert v["test_accuracy"] > 0.3  # a few epochs of a tiny model; chance is 0.1


def test_tables_have_expected_rows(run):
    import pandas as pd
    for model, n_units in (("txl", 4), ("vit", 4), ("lm", 72)):
        t1 = pd.read_csv(run / "results" / model / "tables" / "table1.csv")
        assert list(t1["set"]) == ["top"] * 3 + ["bottom"] * 3
        assert t1["count"].str.fullmatch(r"[0-2]/2").all()
        t2 = pd.read_csv(run / "results" / model / "tables" / "table2.csv")
        assert list(t2["sample"]) == [0, 1]
        # organized trees make the network sparser than random trees do
        assert (t2["network_l1"] <= t2["network_l1_random_trees"] * 1.05).all()
    assert "Table 1" in (run / "results" / "summary.md").read_text()


def test_report_builds(run):
    snakemake(run, TINY, "--report", str(run / "report.html"))
    html = (run / "report.html").read_text(errors="replace")
    assert len(html) > 10_000
    for needle in ("fig1.png", "table2.md", "Figure 2"):
        assert needle in html


def test_logs_for_every_stage(run):
    logs = {p.name for p in (run / "results" / "logs" / "txl").iterdir()}
    for stage in ("prepare_data", "train", "extract_sample0", "organize_sample1", "decompose_sample0",
                  "entropy", "tables", "figures"):
        assert f"{stage}.log" in logs


def test_changing_entropy_top_k_reruns_only_entropy_and_after(run):
    cfg = copy.deepcopy(TINY)
    cfg["entropy"]["head_top_k"] = 9
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    assert jobs == {"entropy": 3, "tables": 3, "figures": 3, "summary": 1, "all": 1}


def test_changing_the_questionnaire_reruns_organize_and_after(run):
    cfg = copy.deepcopy(TINY)
    cfg["organize"]["n_iters"] = 2
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    assert jobs == {"organize": 6, "decompose": 6, "entropy": 3, "tables": 3, "figures": 3,
                    "summary": 1, "all": 1}


def test_unchanged_config_plans_nothing(run):
    assert planned_jobs(snakemake(run, TINY, "-n")) == {}


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["entropy"].update(head_tpo_k=3), "head_tpo_k"),
    (lambda c: c["organize"].update(n_iters="three"), "n_iters"),
    (lambda c: c["models"][0]["extract"].update(n_samples=-1), "n_samples"),
    (lambda c: c["models"][0].update(kind="lstm"), "lstm"),
    (lambda c: c["entropy"].update(head_top_k=10_000), "entropy.head_top_k"),
])
def test_bad_config_stops_at_start_naming_the_key(tmp_path, edit, message):
    cfg = copy.deepcopy(TINY)
    edit(cfg)
    proc = snakemake(tmp_path, cfg, "-n", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()
