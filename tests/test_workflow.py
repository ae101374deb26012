"""The real Snakemake workflow, end to end on a tiny config, and what a change reruns.

Runs `snakemake` in a temporary directory (real training for a few steps, real
extraction, organize, decompose, entropy, tables, figures, report), then checks the
artifacts and which jobs a dry run plans after changing one parameter.
"""
from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from wfutil import TINY, planned_jobs, snakemake

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def run(clean_run):
    return clean_run


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
            # stored probs are the softmax of stored scores under the model's mask
            sc = torch.from_numpy(att["scores"].values)
            if model == "txl":  # causal, empty memory
                sc = sc.masked_fill(torch.ones(n_tok, n_tok, dtype=torch.bool).triu(1), float("-inf"))
            np.testing.assert_allclose(att["probs"].values, torch.softmax(sc, -1).numpy(), atol=1e-5)
            assert att["layer"].values.tolist() == list(range(n_layer))
            assert att["head"].values.tolist() == list(range(n_head))
            org = xr.open_zarr(res / model / "organized" / f"sample{i}.zarr", consolidated=False).load()
            assert org["tree_h"].dims == ("level_h", "unit") and org.sizes["unit"] == n_layer * n_head
            assert org["tree_q"].sizes["query"] == n_tok
            dec = xr.open_zarr(res / model / "decomposed" / f"sample{i}.zarr", consolidated=False).load()
            # by default the coarsest coefficients and the level sums, not every coefficient
            assert dec["bihaar_coarse"].dims == ("coarse2", "unit") and "bihaar" not in dec
            for v in dec.data_vars:
                assert np.isfinite(dec[v].values).all(), (model, i, v)
            # the level sums hold the whole expansion's energy: the analysed tensor's (orthonormal bases),
            # txl's masked scores set to their rows' allowed means (extract.masked: row_mean, the default)
            from oattn_lib.network import read_network

            apath = res / model / "attention" / f"sample{i}.zarr"
            x = read_network(apath, "scores" if model == "txl" else "probs").array
            assert np.sqrt(dec["trihaar_level_l2sq"].values.sum()) == pytest.approx(np.linalg.norm(x), rel=1e-4)
            if model == "txl":
                assert dec.attrs["masked"] == "row_mean" and dec.attrs["masked_filled"] == 4 * n_tok * (n_tok - 1) // 2
                raw = read_network(apath, "scores", masked="keep").array
                assert np.linalg.norm(raw) != pytest.approx(np.linalg.norm(x), rel=1e-3)
        ent = xr.open_zarr(res / model / "entropy.zarr", consolidated=False).load()
        assert ent["head_entropy"].dims == ("sample", "layer", "head")
        assert ent["head_entropy"].shape == (2, n_layer, n_head)
        assert np.isfinite(ent["head_entropy"].values).all() and (ent["head_entropy"].values > 0).all()


def test_every_store_and_the_summary_name_the_version_and_commit_of_oattn(run):
    import zarr

    import oattn_lib
    from oattn_lib.store import code_commit

    stores = sorted((run / "results").rglob("*.zarr"))
    assert len(stores) > 20
    commit = (code_commit() or "").removesuffix("-dirty")  # edits in the work tree may come and go
    for path in stores:
        attrs = zarr.open_group(path, mode="r", use_consolidated=False).attrs
        assert attrs.get("oattn_version") == oattn_lib.__version__, path
        assert attrs.get("oattn_commit", "").removesuffix("-dirty") == commit, path
    made = f"Computed by oattn {oattn_lib.__version__}"
    assert made in (run / "results" / "summary.md").read_text()
    assert made in (run / "results" / "claims.rst").read_text()   # the report's opening page


def test_training_learned_something(run):
    import json
    m = json.loads((run / "results" / "txl" / "model" / "metrics.json").read_text())
    assert m["valid_ppl"] < m["unigram_ppl"]
    v = json.loads((run / "results" / "vit" / "model" / "metrics.json").read_text())
    assert v["test_accuracy"] > 0.3  # a few epochs of a tiny model; chance is 0.1


def test_tables_have_expected_rows(run):
    from sklearn.metrics import adjusted_rand_score
    for model, n_units in (("txl", 4), ("vit", 4), ("lm", 72)):
        t1 = pd.read_csv(run / "results" / model / "tables" / "table1.csv")
        assert list(t1["set"]) == ["top"] * 3 + ["bottom"] * 3
        assert t1["count"].str.fullmatch(r"[0-2]/2").all()
        t2 = pd.read_csv(run / "results" / model / "tables" / "table2.csv")
        assert list(t2["sample"]) == [0, 1]
        # organized trees make the network sparser than random trees do
        assert (t2["network_l1"] <= t2["network_l1_random_trees"] * 1.05).all()
        # the head tree against the layers, recomputed from the organized stores
        arch = pd.read_csv(run / "results" / model / "tables" / "head_tree.csv")
        trees = [xr.open_zarr(run / "results" / model / "organized" / f"sample{i}.zarr", consolidated=False)
                 for i in range(2)]
        assert len(arch) == max(t.sizes["level_h"] for t in trees) - 2
        for row in arch.itertuples():
            want = [adjusted_rand_score(t["unit_layer"].values, t["tree_h"].values[row.level])
                    for t in trees if row.level < t.sizes["level_h"] - 1]
            assert row.samples == len(want) and row.ari_layer == pytest.approx(np.mean(want))
        assert "Head tree against the architecture" in (run / "results" / model / "tables" / "table1.md").read_text()
    assert "Table 1" in (run / "results" / "summary.md").read_text()


def test_report_builds(run):
    snakemake(run, TINY, "--report", str(run / "report.html"))
    html = (run / "report.html").read_text(errors="replace")
    assert len(html) > 10_000
    for needle in ("fig1.png", "table2.md", "Figure 2"):
        assert needle in html


def test_logs_for_every_stage(run):
    # txl's samples are analysed by one job per stage (jobs.batch_max_entries), lm's one job per sample
    logs = {p.name for p in (run / "results" / "logs" / "txl").iterdir()}
    for stage in ("prepare_data", "train", "extract", "organize", "decompose", "entropy", "tables", "figures"):
        assert f"{stage}.log" in logs
    logs = {p.name for p in (run / "results" / "logs" / "lm").iterdir()}
    for stage in ("prepare_data", "extract_sample0", "organize_sample1", "decompose_sample0", "entropy"):
        assert f"{stage}.log" in logs
    # every job logs its start-up first; the batched job names each sample it analyses
    for path in (run / "results" / "logs").rglob("*.log"):
        if path.name != "kernels.log":
            first = path.read_text().splitlines()[0]
            assert " start-up " in first, f"{path}: {first}"
    organize_log = (run / "results" / "logs" / "txl" / "organize.log").read_text()
    assert "sample 1 of 2" in organize_log and "sample 2 of 2" in organize_log
    # and ends with what the whole job used (runtime.job_usage), which bench/stages.py and
    # bench/resources.py read rather than Snakemake's sampled benchmark: every benchmarked job's
    from oattn_lib.runtime import read_job_usage

    benchmarks = sorted((run / "results" / "benchmarks").rglob("*.tsv"))
    assert len(benchmarks) > 20
    for bench in benchmarks:
        log = (run / "results" / "logs" / bench.relative_to(run / "results" / "benchmarks")).with_suffix(".log")
        last = log.read_text().splitlines()[-1]
        usage = read_job_usage(log)
        assert " resources used: " in last and usage is not None, f"{log}: {last}"
        assert usage["peak_rss_mb"] > 50 and 0 < usage["cpu_s"] and 0 < usage["wall_s"], (log, usage)


def test_the_reading_stages_run_without_torch_or_numba(run):
    """Every job's last line names the heavy libraries it had loaded by its end. The stages that
    only read stores (entropy, tables, stability, summary and every explorer job) ran without
    torch and numba, about 2 s of imports per job; the engine's stages ran with both."""
    loaded = {}
    for path in (run / "results" / "logs").rglob("*.log"):
        m = re.search(r" resources used: .*; loaded: (.*)$", path.read_text().splitlines()[-1])
        assert m, path
        loaded[str(path.relative_to(run / "results" / "logs").with_suffix(""))] = set(m.group(1).split(", "))
    reading = {name: libs for name, libs in loaded.items()
               if re.fullmatch(r"(\w+/)?(entropy|tables|stability|summary|explorer\w*)", name)}
    assert {"summary", "explorer_index", "lm/explorer_plan", "lm/explorer_samples_part0", "txl/explorer",
            "txl/stability", "lm/tables", "txl/entropy"} <= set(reading), sorted(loaded)
    assert all(not libs & {"torch", "numba"} for libs in reading.values()), reading
    for name in ("txl/organize", "lm/decompose_sample0", "vit/organize2d"):
        assert {"torch", "numba"} <= loaded[name], (name, loaded[name])


def test_jobs_after_the_kernels_compile_none(run):
    """Rule `kernels` compiled the numba kernels before the jobs that run them: no organize,
    decompose or organize2d job compiled one (each logs what it loaded and compiled at exit)."""
    import json
    report = json.loads((run / "results" / "kernels" / "numba.json").read_text())
    assert set(report["kernels"]) >= {"emd._l1_accumulate", "sweep._haar_up", "sweep._means_kernel"}
    logs = sorted((run / "results" / "logs").rglob("organize*.log")) + sorted(
        (run / "results" / "logs").rglob("decompose*.log"))
    assert len(logs) == 3 * (2 + 2)  # per stage: txl and vit one job each, lm one per sample
    for path in logs:
        counts = re.findall(r"numba kernels: (\d+) loaded from the cache, (\d+) compiled", path.read_text())
        assert counts and int(counts[-1][0]) > 0 and int(counts[-1][1]) == 0, f"{path}: {counts}"


def test_changing_entropy_top_k_reruns_only_entropy_and_after(run):
    cfg = copy.deepcopy(TINY)
    cfg["entropy"]["head_top_k"] = 9
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    # stability: the replicates' entropies (txl and lm have a stability section; txl's one
    # replicated sample in its batch's job, lm's two a stability_sample job each)
    # lm (one job per sample): its page planned again and its 2 samples encoded again, one job each
    assert jobs == {"entropy": 3, "organize2d_batch_txl": 1, "organize2d_batch_vit": 1, "organize2d": 2,
                    "stability_sample_batch_txl": 1, "stability_sample": 2, "stability": 2, "tables": 3,
                    "heads": 3, "figures": 3, "prune": 3, "explorer_plan": 1, "explorer_samples": 2, "explorer": 3,
                    "explorer_index": 1, "summary": 1, "all": 1, "masked_other_batch_txl": 1}


def test_changing_the_questionnaire_reruns_organize_and_after(run):
    cfg = copy.deepcopy(TINY)
    cfg["organize"]["n_iters"] = 2
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    # txl and vit: one job for both samples; lm: one per sample
    assert jobs == {"organize_batch_txl": 1, "organize_batch_vit": 1, "organize": 2, "decompose_batch_txl": 1,
                    "decompose_batch_vit": 1, "decompose": 2, "entropy": 3, "organize2d_batch_txl": 1,
                    "organize2d_batch_vit": 1, "organize2d": 2, "stability_sample_batch_txl": 1, "stability_sample": 2,
                    "stability": 2, "tables": 3, "heads": 3, "figures": 3, "prune": 3,
                    "explorer_plan": 1, "explorer_samples": 2, "explorer": 3, "explorer_index": 1, "summary": 1,
                    "all": 1, "masked_other_batch_txl": 1}   # txl's expansions under the other masked rule too


def test_changing_a_stability_section_reruns_that_models_stability_and_what_reads_it(run):
    cfg = copy.deepcopy(TINY)
    cfg["models"][0]["stability"]["replicates"] = 3
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    # its one replicated sample's replicates, its Tables 1-2 and heads tables (ranges), the explorer
    # that shows them, and the claims
    assert jobs == {"stability_sample_batch_txl": 1, "stability": 1, "tables": 1, "heads": 1, "explorer": 1,
                    "explorer_index": 1, "summary": 1, "all": 1}


def test_the_bootstrap_or_fewer_replicated_samples_rerun_no_replicate(run):
    """A sample's replicates read neither the bootstrap nor which samples are replicated: changing
    those reruns the model's stability table and what reads it, never a stability_sample job."""
    cfg = copy.deepcopy(TINY)
    cfg["models"][0]["stability"]["bootstrap"] = 150
    assert planned_jobs(snakemake(run, cfg, "-n")) == {"stability": 1, "tables": 1, "heads": 1, "explorer": 1,
                                                        "explorer_index": 1, "summary": 1, "all": 1}
    cfg = copy.deepcopy(TINY)
    lm = next(m for m in cfg["models"] if m["name"] == "lm")
    lm["stability"]["samples"] = 1  # of its 2, both replicated in the run
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    assert jobs.get("stability") == 1 and not [r for r in jobs if r.startswith("stability_sample")], jobs


def test_a_small_models_batches_are_cut_and_each_writes_its_own_samples(run, tmp_path):
    """jobs.batch_max_samples 1: each sample of txl and vit (batched) gets a job per stage of its
    own, `<stage>_batch_<model>_samples<i>_<i>`, and the job of sample 1 writes sample 1 (the
    attention the one job for both samples wrote), not its batch's first sample as sample 0."""
    import shutil

    cfg = copy.deepcopy(TINY)
    cfg["jobs"] = {"batch_max_samples": 1}
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    for stage in ("extract", "organize", "decompose", "organize2d"):
        for model in ("txl", "vit"):
            assert [jobs.get(f"{stage}_batch_{model}_samples{i}_{i}") for i in (0, 1)] == [1, 1], jobs
            assert f"{stage}_batch_{model}" not in jobs
    assert "train" not in jobs and jobs.get("extract") is None  # lm: one job per sample, as it was
    work = tmp_path / "batches"
    shutil.copytree(run / "results", work / "results")
    shutil.copytree(run / ".snakemake", work / ".snakemake", ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    target = "results/vit/attention/sample1.zarr/zarr.json"
    proc = snakemake(work, cfg, target)
    assert re.findall(r"rule (\w+):", proc.stdout + proc.stderr) == ["extract_batch_vit_samples1_1"]
    before = xr.open_zarr(run / "results/vit/attention/sample1.zarr", consolidated=False).load()
    after = xr.open_zarr(work / "results/vit/attention/sample1.zarr", consolidated=False).load()
    assert (after.attrs["sample"], after.attrs["source_index"]) == (1, before.attrs["source_index"])
    np.testing.assert_array_equal(after["probs"].values, before["probs"].values)
    assert "vit sample 1" in (work / "results/logs/vit/extract_samples1-1.log").read_text()


def test_one_job_per_sample_again_reruns_the_per_sample_stages_only(run):
    """jobs.batch_max_entries off: the batched models' (txl, vit) samples are extracted, organized
    and decomposed again one job per sample (a job's inputs are recorded per job), and what reads
    them after; lm, analysed per sample already, and training are left alone."""
    cfg = copy.deepcopy(TINY)
    cfg["jobs"] = {"batch_max_entries": 0}
    jobs = planned_jobs(snakemake(run, cfg, "-n"))
    assert {r: jobs.get(r) for r in ("extract", "organize", "decompose", "entropy")} == {
        "extract": 4, "organize": 4, "decompose": 4, "entropy": 2}
    # the other masked rule's analysis is one job per model whatever the batching
    assert not any("_batch_" in r for r in jobs if not r.startswith("masked_other")) and "train" not in jobs
    # their pages now planned and encoded by jobs of their own (2 samples, 2 jobs each)
    assert (jobs.get("explorer_plan"), jobs.get("explorer_samples")) == (2, 4)


def test_unchanged_config_plans_nothing(run):
    assert planned_jobs(snakemake(run, TINY, "-n")) == {}


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["entropy"].update(head_tpo_k=3), "head_tpo_k"),
    (lambda c: c["organize"].update(n_iters="three"), "n_iters"),
    (lambda c: c["models"][0]["extract"].update(n_samples=-1), "n_samples"),
    (lambda c: c["models"][0].update(kind="lstm"), "lstm"),
    (lambda c: c["entropy"].update(head_top_k=10_000), "entropy.head_top_k"),
    (lambda c: c["models"][2].update(path="/nonexistent/model"), "models[2].path: '/nonexistent/model'"),
])
def test_bad_config_stops_at_start_naming_the_key(tmp_path, edit, message):
    cfg = copy.deepcopy(TINY)
    edit(cfg)
    proc = snakemake(tmp_path, cfg, "-n", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("model", [m["name"] for m in TINY["models"]])
def test_stores_equal_the_engine_run_on_the_stored_inputs(run, model):
    """Each analysis store is what the engine's public functions give on the stored inputs:
    the organization is the questionnaire of this sample's tensor, the coefficients are its
    expansion in this sample's trees (not another sample's, not another orthonormal basis),
    the entropies are head_entropy / network_entropy of the same."""
    from oattn_lib.entropy import coarsest, head_entropy, head_sparsity, network_entropy, network_sparsity
    from oattn_lib.haar import bihaar, haar_basis, trihaar
    from oattn_lib.questionnaire import questionnaire3d
    from oattn_lib.network import load_organization, read_network

    res = run / "results" / model
    cfg = next(m for m in TINY["models"] if m["name"] == model)
    quantity = cfg["extract"]["quantity"]
    ent = xr.open_zarr(res / "entropy.zarr", consolidated=False).load()
    for i in range(cfg["extract"]["n_samples"]):
        net = read_network(res / "attention" / f"sample{i}.zarr", quantity)
        X = net.array
        org, _ = load_organization(res / "organized" / f"sample{i}.zarr")
        fresh = questionnaire3d(X, **TINY["organize"])
        for axis in ("q", "k", "h"):
            np.testing.assert_array_equal(getattr(org, f"tree_{axis}").labels,
                                          getattr(fresh, f"tree_{axis}").labels, err_msg=f"{model} {i} {axis}")
        dec = xr.open_zarr(res / "decomposed" / f"sample{i}.zarr", consolidated=False).load()
        c2, c3 = np.asarray(bihaar(X, org.tree_q, org.tree_k)), np.asarray(trihaar(X, org.tree_q, org.tree_k, org.tree_h))
        tol = {"rtol": 1e-4, "atol": 1e-5 * np.abs(X).max()}
        # the kept coefficients are this expansion's at the stored indices, which are its coarsest
        np.testing.assert_allclose(dec["bihaar_coarse"].values, c2.reshape(-1, c2.shape[2])[dec["coarse2_index"].values],
                                   **tol)
        np.testing.assert_allclose(dec["trihaar_coarse"].values, c3.ravel()[dec["coarse3_index"].values], **tol)
        (_, sq, lq), (_, sk, lk), (_, sh, lh) = (haar_basis(t) for t in (org.tree_q, org.tree_k, org.tree_h))
        assert dec["coarse2_index"].values.tolist() == coarsest([sq, sk], [lq, lk], dec.sizes["coarse2"]).tolist()
        assert dec["coarse3_index"].values.tolist() == coarsest([sq, sk, sh], [lq, lk, lh], dec.sizes["coarse3"]).tolist()
        np.testing.assert_allclose(dec["bihaar_level_l1"].sum(("qlevel", "klevel")).values, np.abs(c2).sum((0, 1)),
                                   rtol=1e-4)
        np.testing.assert_allclose(dec["trihaar_level_l2sq"].values.sum(), (c3.astype(np.float64) ** 2).sum(), rtol=1e-4)
        grid = ent.sel(sample=i).stack(unit=("layer", "head"))
        stored = grid.sel(unit=list(zip(net.unit_layer, net.unit_head)))
        np.testing.assert_allclose(stored["head_entropy"].values,
                                   head_entropy(X, org, TINY["entropy"]["head_top_k"]), rtol=1e-5)
        np.testing.assert_allclose(stored["head_sparsity"].values, head_sparsity(X, org), rtol=1e-5)
        assert ent["network_entropy"].values[i] == pytest.approx(
            network_entropy(X, org, TINY["entropy"]["network_top_k"]), rel=1e-5)
        assert ent["network_sparsity"].values[i] == pytest.approx(network_sparsity(X, org), rel=1e-5)
        # the organized trees beat random trees on the sparsity the paper reports
        assert ent["network_l1"].values[i] < ent["network_l1_random"].values[i]
        # the natural-order baseline is the expansion on balanced trees over the tokens and heads as
        # they come (not a permutation of them), and the scale-free entropy divides by ||X||_F
        from oattn_lib.entropy import l1_over_l2
        from oattn_lib.trees import balanced_tree

        cn = np.asarray(trihaar(X.astype(np.float64), *(balanced_tree(np.arange(n)) for n in X.shape)))
        assert ent["network_sparsity_natural"].values[i] == pytest.approx(float(l1_over_l2(cn.reshape(-1), 0)),
                                                                         rel=1e-4)
        assert ent["network_l1_natural"].values[i] == pytest.approx(np.abs(cn).sum(), rel=1e-4)
        assert ent["network_l2"].values[i] == pytest.approx(np.linalg.norm(X.astype(np.float64)), rel=1e-5)
        t2 = pd.read_csv(res / "tables" / "table2.csv")
        assert t2["network_entropy_scale_free"][i] == pytest.approx(
            ent["network_entropy"].values[i] / np.linalg.norm(X.astype(np.float64)), rel=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_organize_and_decompose_on_cuda_give_the_cpu_results(run, tmp_path):
    """device: cuda runs the engine on the GPU (the workflow passes `device`); trees are the same
    and coefficients equal to float32 rounding."""
    from oattn_lib.stages.decompose import decompose
    from oattn_lib.stages.organize import organize
    res = run / "results" / "vit"
    att = res / "attention" / "sample0.zarr"
    organize(att, tmp_path / "org.zarr", "probs", params=TINY["organize"], device="cuda")
    cpu = xr.open_zarr(res / "organized" / "sample0.zarr", consolidated=False)
    gpu = xr.open_zarr(tmp_path / "org.zarr", consolidated=False)
    for t in ("tree_q", "tree_k", "tree_h"):
        np.testing.assert_array_equal(gpu[t].values, cpu[t].values)
    dec = TINY["decompose"]
    decompose(att, res / "organized" / "sample0.zarr", tmp_path / "dec.zarr", "probs", device="cuda",
              figure_heads=dec["figure_heads"], questionnaire2d_iters=dec["questionnaire2d_iters"],
              random_tree_seeds=dec["random_tree_seeds"])
    a = xr.open_zarr(tmp_path / "dec.zarr", consolidated=False)
    b = xr.open_zarr(res / "decomposed" / "sample0.zarr", consolidated=False)
    np.testing.assert_allclose(a["trihaar_coarse"].values, b["trihaar_coarse"].values, atol=1e-5)
    np.testing.assert_allclose(a["bihaar_level_l2sq"].values, b["bihaar_level_l2sq"].values, rtol=1e-5)


def test_theorem1_measures_the_first_samples_it_is_given(run, tmp_path):
    """theorem1.samples k (the default run's 3): the theorem1 job of a model reads the first k
    samples' attention, and its table holds those samples, every head of each; `all` (the tiny
    run's) every sample."""
    import shutil

    target = "results/txl/figures/theorem1.csv"
    whole = pd.read_csv(run / target)
    assert sorted(whole["sample"].unique()) == [0, 1]
    cfg = copy.deepcopy(TINY)
    cfg["theorem1"] = {**cfg.get("theorem1", {}), "samples": 1}
    work = tmp_path / "theorem1"
    shutil.copytree(run / "results", work / "results")
    shutil.copytree(run / ".snakemake", work / ".snakemake", ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    proc = snakemake(work, cfg, target)
    assert re.findall(r"rule (\w+):", proc.stdout + proc.stderr) == ["theorem1"]
    first = pd.read_csv(work / target)
    assert sorted(first["sample"].unique()) == [0]
    heads = lambda t: sorted(set(zip(t["layer"], t["head"])))  # noqa: E731
    assert heads(first) == heads(whole[whole["sample"] == 0])
