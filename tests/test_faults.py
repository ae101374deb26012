"""Faults and bad input: nothing lost, nothing trusted that is half-written, clear errors.

Real runs, real files, no mocks: jobs are SIGKILLed mid-training and mid-write, chunks
of stored tensors are truncated, a tiny tmpfs fills up, tensors carry NaN or are
degenerate.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from oattn_lib import store
from oattn_lib.config import complete_model
from oattn_lib.stages.data import prepare_data
from oattn_lib.stages.decompose import decompose
from oattn_lib.stages.entropy import entropy
from oattn_lib.stages.extract import attention_dataset
from oattn_lib.stages.organize import organize
from oattn_lib.stages.tables import tables
from oattn_lib.store import StoreError


# -- helpers ----------------------------------------------------------------------------------
def attention_store(path, scores, model="toy", sample=0):
    """A store in the extraction format from (layer, head, query, key) scores."""
    scores = np.asarray(scores, dtype=np.float32)
    probs = torch.softmax(torch.from_numpy(scores), -1).numpy()
    ds = attention_dataset(scores, probs, np.arange(scores.shape[2]),
                                     {"model": model, "sample": sample, "checkpoint_sha256": "0" * 64})
    store.write_store(ds, path)
    return path


def analyse(tmp_path, scores, head_top_k, network_top_k, quantity="scores"):
    """organize -> decompose -> entropy -> tables on one stored sample, through the stages."""
    att = attention_store(tmp_path / "att.zarr", scores)
    organize(att, tmp_path / "org.zarr", quantity, params={"n_iters": 2})
    decompose(att, tmp_path / "org.zarr", tmp_path / "dec.zarr", quantity,
                       figure_heads=[[0, 0], [-1, -1]], questionnaire2d_iters=2, random_tree_seeds=1)
    entropy([tmp_path / "dec.zarr"], tmp_path / "ent.zarr", head_top_k, network_top_k)
    t = [tmp_path / f for f in ("t1.csv", "t1.md", "t2.csv", "t2.md")]
    tables(tmp_path / "ent.zarr", *t, fraction=0.5)
    return (xr.open_zarr(tmp_path / "dec.zarr", consolidated=False).load(),
            xr.open_zarr(tmp_path / "ent.zarr", consolidated=False).load())


def assert_all_finite(ds):
    for name, var in ds.data_vars.items():
        if np.issubdtype(var.dtype, np.floating):
            assert np.isfinite(var.values).all(), name


# -- tensors ----------------------------------------------------------------------------------
def test_nan_or_inf_in_attention_names_model_sample_layer_and_head():
    scores = np.zeros((3, 4, 5, 5), np.float32)
    scores[1, 2, 3, 0] = np.nan
    probs = np.full_like(scores, 0.2)
    with pytest.raises(ValueError, match=r"mymodel sample 7: scores has NaN or inf at layer 1, head 2"):
        attention_dataset(scores, probs, np.arange(5), {"model": "mymodel", "sample": 7})
    probs[2, 0, 0, 0] = np.inf
    with pytest.raises(ValueError, match=r"probs has NaN or inf at layer 2, head 0"):
        attention_dataset(np.zeros_like(scores), probs, np.arange(5), {"model": "m", "sample": 0})


@pytest.mark.parametrize("case", ["constant_head", "single_head", "two_tokens", "all_constant"])
def test_degenerate_but_valid_tensors_give_finite_results(tmp_path, case):
    rng = np.random.default_rng(0)
    if case == "constant_head":
        s = rng.normal(size=(2, 3, 12, 12))
        s[1, 1] = 0.7
        tops = (16, 20)
    elif case == "single_head":
        s, tops = rng.normal(size=(1, 1, 10, 10)), (16, 20)
    elif case == "two_tokens":
        s, tops = rng.normal(size=(2, 2, 2, 2)), (4, 10)
    else:
        s, tops = np.full((2, 2, 6, 6), 3.0), (9, 10)
    dec, ent = analyse(tmp_path, s, *tops)
    assert_all_finite(dec)
    assert_all_finite(ent)
    assert ent["head_entropy"].shape == (1,) + s.shape[:2]


def test_non_square_heads_are_analysed(tmp_path):
    # queries != keys (e.g. a segment attending over memory): every stage takes it
    from oattn_lib.entropy import head_entropy, network_entropy
    from oattn_lib.paraproduct import paraproduct
    from oattn_lib.questionnaire import questionnaire2d, questionnaire3d
    x = np.random.default_rng(1).normal(size=(9, 14, 5)).astype(np.float32)
    org = questionnaire3d(x, n_iters=2)
    assert (org.tree_q.n, org.tree_k.n, org.tree_h.n) == (9, 14, 5)
    assert np.isfinite(head_entropy(x, org, top_k=20)).all()
    assert np.isfinite(network_entropy(x, org, top_k=20))
    tr, tc = questionnaire2d(x[:, :, 0], n_iters=2)
    pp = paraproduct(x[:, :, 0].astype(np.float64), tr.order, tc.order)
    assert np.isfinite(pp.relative_residual)


# -- corruption -----------------------------------------------------------------------------
def test_truncated_chunk_fails_naming_store_and_variable(tmp_path):
    att = attention_store(tmp_path / "sample0.zarr", np.random.default_rng(0).normal(size=(2, 2, 16, 16)))
    chunks = [p for p in (att / "probs").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert chunks, "the probs variable has chunk files"
    data = chunks[0].read_bytes()
    chunks[0].write_bytes(data[: len(data) // 3])
    with pytest.raises(StoreError) as err:
        organize(att, tmp_path / "org.zarr", "probs", params={"n_iters": 1})
    assert str(att) in str(err.value) and "'probs'" in str(err.value)
    assert "delete it" in str(err.value)
    assert not (tmp_path / "org.zarr").exists()


@pytest.mark.parametrize("name", ["bihaar_coarse", "trihaar_coarse", "bihaar_level_l1", "trihaar_level_l2sq"])
def test_entropy_stage_names_the_decomposed_store_and_variable_at_fault(tmp_path, name):
    # the entropy stage reads the kept coefficients and level sums lazily: a NaN or a truncated
    # chunk in any must still be an error naming the store and the variable, with no output
    dec, _ = analyse(tmp_path, np.random.default_rng(1).normal(size=(2, 3, 8, 8)), 4, 4)
    bad = dec.copy(deep=True)
    bad[name].values[(0,) * bad[name].ndim] = np.nan
    store.write_store(bad, tmp_path / "nan.zarr")
    out = tmp_path / "ent_bad.zarr"
    with pytest.raises(StoreError, match=rf"nan\.zarr: variable '{name}' contains NaN or inf"):
        entropy([tmp_path / "dec.zarr", tmp_path / "nan.zarr"], out, 4, 4)
    chunk = next(p for p in (tmp_path / "dec.zarr" / name).rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:10])
    with pytest.raises(StoreError, match=rf"dec\.zarr: variable '{name}' is unreadable.*delete it"):
        entropy([tmp_path / "dec.zarr"], out, 4, 4)
    assert not out.exists()


def test_missing_variable_and_missing_store_are_named(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        store.read_store(tmp_path / "nope.zarr")
    ds = xr.Dataset({"a": ("x", np.arange(3.0))})
    store.write_store(ds, tmp_path / "s.zarr")
    with pytest.raises(StoreError, match=r"variable 'scores' is missing"):
        store.read_store(tmp_path / "s.zarr", require=("scores",))


def test_reading_some_variables_leaves_the_others_out(tmp_path):
    ds = xr.Dataset({"scores": (("q", "k"), np.ones((2, 3))), "probs": (("q", "k"), np.full((2, 3), 0.5)),
                     "allowed": ("q", [True, False])}, coords={"token": ("q", [7, 9])})
    store.write_store(ds, tmp_path / "s.zarr")
    got = store.read_store(tmp_path / "s.zarr", require=("probs",), variables=("probs",))
    assert set(got.data_vars) == {"probs"} and got["token"].values.tolist() == [7, 9]
    assert got["probs"].values.tolist() == [[0.5] * 3] * 2
    with pytest.raises(StoreError, match=r"variable 'logits' is missing"):
        store.read_store(tmp_path / "s.zarr", require=("logits",), variables=("probs",))


def test_stale_temporaries_are_never_trusted_and_are_cleaned(tmp_path):
    # a killed writer leaves a temporary sibling; the final path does not exist
    stale = tmp_path / ".s.zarr.tmp-deadbeef"
    stale.mkdir()
    (stale / "junk").write_text("half-written")
    with pytest.raises(StoreError):
        store.read_store(tmp_path / "s.zarr")
    store.write_store(xr.Dataset({"a": ("x", np.arange(3.0))}), tmp_path / "s.zarr")
    assert not stale.exists()
    assert store.read_store(tmp_path / "s.zarr")["a"].values.tolist() == [0.0, 1.0, 2.0]


# -- disk full ------------------------------------------------------------------------------
@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_fails_cleanly_and_leaves_nothing_to_trust(tiny_tmpfs):
    big = xr.Dataset({"x": (("a", "b"), np.random.default_rng(0).normal(size=(400, 400)))})
    with pytest.raises(OSError):
        store.write_store(big, tiny_tmpfs / "big.zarr")
    assert list(tiny_tmpfs.iterdir()) == [], "no store and no temporary left behind"
    with pytest.raises(OSError):
        store.save_npz(tiny_tmpfs / "d.npz", x=np.zeros((300, 300)))
    assert list(tiny_tmpfs.iterdir()) == []
    # and the space is free again for a small write
    store.write_store(xr.Dataset({"a": ("x", np.arange(3.0))}), tiny_tmpfs / "small.zarr")


# -- data -------------------------------------------------------------------------------------
def test_missing_dataset_files_say_how_to_provide_them(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"wiki\.train\.tokens.*fetch_wikitext103"):
        prepare_data("txl", complete_model({"name": "t", "kind": "txl", "data": {"corpus": "wikitext103"}})["data"],
                     tmp_path / "d.npz", tmp_path / "m.json",
                              data_root=tmp_path)
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        prepare_data("vit", complete_model({"name": "v", "kind": "vit", "data": {"dataset": "cifar10"}})["data"],
                     tmp_path / "d.npz", tmp_path / "m.json",
                              data_root=tmp_path)
    assert not (tmp_path / "d.npz").exists() and not (tmp_path / "m.json").exists()


def test_empty_corpus_and_wrong_image_batches_are_clear_errors(tmp_path):
    import pickle

    from oattn_lib.data import text
    from oattn_lib.data.images import load_cifar10
    with pytest.raises(ValueError, match="corpus is empty"):
        text.build_text_dataset([])
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(d / name, "wb") as f:
            pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError, match=r"data_batch_1"):
        load_cifar10(tmp_path, "train")


# -- determinism ------------------------------------------------------------------------------
def test_same_seed_same_store_and_analysis_independent_of_training_seed(tmp_path):
    from oattn_lib.models.transformer_xl import TransformerXL, TXLConfig
    from oattn_lib.questionnaire import questionnaire3d
    from oattn_lib.train import train_txl
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 50, 3000))

    def trained(seed):
        model = TransformerXL(TXLConfig(n_token=50, n_layer=1, n_head=2, d_model=16, d_head=8, d_inner=32,
                                        tgt_len=16, mem_len=16), seed=0)
        return train_txl(model, tokens, tokens[:500], steps=20, batch_size=4, lr=1e-2, seed=seed,
                         progress=False)["state_hash"]

    assert trained(0) == trained(0)
    assert trained(0) != trained(1)
    x = np.random.default_rng(3).normal(size=(12, 12, 6)).astype(np.float32)
    a, b = questionnaire3d(x, seed=0), questionnaire3d(x, seed=1)
    assert a.tree_q == b.tree_q and a.tree_h == b.tree_h
    p1, p2 = attention_store(tmp_path / "a.zarr", x.T[None]), attention_store(tmp_path / "b.zarr", x.T[None])
    organize(p1, tmp_path / "o1.zarr", "scores", params={"n_iters": 1})
    organize(p2, tmp_path / "o2.zarr", "scores", params={"n_iters": 1})
    o1, o2 = (xr.open_zarr(tmp_path / f, consolidated=False).load() for f in ("o1.zarr", "o2.zarr"))
    for v in o1.data_vars:
        np.testing.assert_array_equal(o1[v].values, o2[v].values)


# -- killed runs ------------------------------------------------------------------------------
def _start(workdir: Path, config: dict, *args: str, env=None) -> subprocess.Popen:
    import yaml

    from wfutil import REPO, SNAKEMAKE
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    # what Snakemake says goes to a file that a failed wait shows (appended: one file per test)
    out = (workdir / "snakemake-output.txt").open("a")
    return subprocess.Popen(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                                         "--configfile", str(cfg), "--cores", "2", *args],
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def _kill_when(proc: subprocess.Popen, condition, timeout=600) -> None:
    t0 = time.time()
    while not condition():
        if proc.poll() is not None:
            said = Path(proc.args[proc.args.index("--directory") + 1]) / "snakemake-output.txt"
            raise AssertionError(f"the run ended (exit {proc.returncode}) before the fault could be injected; "
                                 f"Snakemake said:\n{said.read_text()[-6000:]}")
        assert time.time() - t0 < timeout, "fault window never came"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.workflow
def test_killed_mid_training_and_mid_write_then_resumed_equals_clean_run(tmp_path, clean_run):
    """txl trained and its attention extracted again on a copy of the shared tiny run, killed
    mid-training and mid-write and resumed as a user would: no checkpoint or store of a killed
    job is trusted, and the trained model and every sample's store equal the uninterrupted
    run's, bitwise."""
    import shutil

    from wfutil import TINY, snakemake
    res = tmp_path / "results"
    # the shared run without txl's model and its attention stores: the runs below train txl
    # and extract its samples again (the checkpoint and the stores a kill can leave
    # half-written); txl's data and every other job are done. The later stages read these
    # stores, the same bitwise, and run uninterrupted
    shutil.copytree(clean_run / "results", res, symlinks=True)
    shutil.copytree(clean_run / ".snakemake", tmp_path / ".snakemake", symlinks=True,
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    for part in ("model", "attention"):
        shutil.rmtree(res / "txl" / part)
    train_log = res / "logs" / "txl" / "train.log"
    train_log.unlink()  # the uninterrupted run's: the kill below waits for this run's progress
    n_samples = next(m for m in TINY["models"] if m["name"] == "txl")["extract"]["n_samples"]
    stores = [f"attention/sample{i}.zarr" for i in range(n_samples)]
    targets = [f"results/txl/{s}/zarr.json" for s in stores]
    # 1. kill in the middle of training (the first progress line is written at step 50 of 200)
    proc = _start(tmp_path, TINY, *targets)
    _kill_when(proc, lambda: train_log.exists() and "step 50/" in train_log.read_text())
    assert not (res / "txl" / "model" / "checkpoint.pt").exists()
    # 2. resume; kill again while a zarr store sits written but not yet renamed; the resume
    # reruns incomplete jobs, as the default profile does (rerun-incomplete)
    snakemake(tmp_path, TINY, "--unlock")
    proc = _start(tmp_path, TINY, "--rerun-incomplete", *targets, env={"OATTN_FAULT_PAUSE_WRITE": "2"})
    _kill_when(proc, lambda: any(res.glob("txl/*/.sample*.zarr.tmp-*")))
    half = next(res.glob("txl/*/.sample*.zarr.tmp-*"))
    # the store's root zarr.json is the output Snakemake trusts: not there until the rename
    final = half.with_name(half.name.split(".tmp-")[0][1:])
    assert not (final / "zarr.json").exists(), "nothing renamed into place"
    # 3. resume to the end, as a user would
    snakemake(tmp_path, TINY, "--unlock")
    snakemake(tmp_path, TINY, "--rerun-incomplete", *targets)
    assert not any(res.glob("txl/*/.sample*.zarr.tmp-*")), "temporaries cleaned up"
    # identical to the uninterrupted run, bitwise (same code, same inputs, same machine): the
    # model, and each store (the one killed mid-write among them) in values, coords and attrs
    clean = clean_run / "results" / "txl"
    ma = json.loads((res / "txl" / "model" / "metrics.json").read_text())
    mb = json.loads((clean / "model" / "metrics.json").read_text())
    assert ma["state_sha256"] == mb["state_sha256"]
    for name in stores:
        xr.testing.assert_identical(xr.open_zarr(res / "txl" / name, consolidated=False).load(),
                                    xr.open_zarr(clean / name, consolidated=False).load())
