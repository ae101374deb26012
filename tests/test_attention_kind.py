"""Kind `attention` (oattn_lib.models.kinds.attention, oattn_lib.data.attention_files): attention
computed elsewhere, read from .npy, .npz, .safetensors and zarr files, copied exactly into
attention stores, checked at start-up, and analysed end to end by the real workflow."""
import copy
import json
import os
import re

import numpy as np
import pytest
import xarray as xr
import zarr
from wfutil import REPO, TINY, snakemake

from oattn_lib import store
from oattn_lib.config import SCHEMA, ConfigError, complete_model, validate_config
from oattn_lib.data import attention_files as af
from oattn_lib.models import adapter
from oattn_lib.models.kinds.attention import attention_hash
from oattn_lib.stages.extract import extract_samples

L, H = 2, 4


def attention(rng, n_q: int, n_k: int, n_layers: int = L, n_heads: int = H):
    """(scores, probs, allowed) of one sample: random logits, a causal mask whose queries are
    the last n_q of n_k positions (rectangular when n_q < n_k), its masked softmax."""
    scores = rng.normal(size=(n_layers, n_heads, n_q, n_k)).astype(np.float32)
    allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    probs = af.masked_softmax(scores, allowed).astype(np.float32)
    return scores, probs, allowed


def write_zarr(path, arrays: dict, dims: dict | None = None):
    group = zarr.open_group(str(path), mode="w")
    for name, a in arrays.items():
        kw = {"dimension_names": dims[name]} if dims and name in dims else {}
        group.create_array(name, data=a, **kw)


def write(fmt: str, path, arrays: dict):
    """The arrays in one file of format `fmt` (npy: its `probs` alone)."""
    if fmt == "npy":
        np.save(path, arrays["probs"])
    elif fmt == "npz":
        np.savez(path, **arrays)
    elif fmt == "safetensors":
        from safetensors.numpy import save_file

        # text tokens go in the metadata (a safetensors file holds numbers only)
        text = arrays.pop("tokens") if arrays.get("tokens", np.zeros(0)).dtype.kind == "U" else None
        save_file({k: np.ascontiguousarray(v.astype(np.uint8) if v.dtype == bool else v) for k, v in arrays.items()},
                  str(path), metadata=None if text is None else {"tokens": json.dumps(text.tolist())})
    elif fmt == "zarr":
        write_zarr(path, arrays)
    return path


def model_entry(path, n: int, **extract):
    return complete_model({"name": "ext", "kind": "attention", "path": str(path),
                           "extract": {"n_samples": n, **extract}},
                          entropy={"head_top_k": 4, "network_top_k": 4})


def extract_all(model, tmp_path) -> list[xr.Dataset]:
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"kind": "attention"}))
    n = model["extract"]["n_samples"]
    outs = [tmp_path / "out" / f"sample{i}.zarr" for i in range(n)]
    extract_samples("attention", model, None, meta, None, outs, list(range(n)), device="cpu", config_slice=model)
    return [store.read_store(o) for o in outs]


@pytest.mark.parametrize("fmt", ["npz", "npy", "safetensors", "zarr"])
def test_a_file_of_samples_is_stored_exactly_as_given(fmt, tmp_path):
    rng = np.random.default_rng(0)
    scores, probs, allowed = zip(*(attention(rng, 5, 7) for _ in range(3)))
    arrays = {"probs": np.stack(probs), "scores": np.stack(scores), "allowed": np.stack(allowed),
              "tokens": np.array([[f"w{s}.{j}" for j in range(5)] for s in range(3)]),
              "kv_group": np.array([0, 0, 1, 1])}
    src = write(fmt, tmp_path / f"att.{fmt}", dict(arrays))
    model = model_entry(src, 3)
    kind = adapter(model)
    assert kind.n_candidates(model) == 3 and kind.n_units(model) == (L, H) and kind.n_tokens(model) is None
    stored = extract_all(model, tmp_path)
    for i, ds in enumerate(stored):
        assert ds["probs"].dims == ("layer", "head", "query", "key") and ds.sizes["query"] == 5
        np.testing.assert_array_equal(ds["probs"].values, probs[i])
        assert ds.attrs["sample"] == i and ds.attrs["source_index"] == i
        assert ds.attrs["checkpoint_sha256"] == (attention_hash([src]) if fmt == "zarr" else store.file_sha256(src))
        if fmt == "npy":  # probs alone: no scores, no mask, no tokens
            assert "scores" not in ds and ds["allowed"].values.all()
            assert "token_text" not in ds.attrs and list(ds["kv_group"].values) == [0, 1, 2, 3]
            continue
        np.testing.assert_array_equal(ds["scores"].values, scores[i])
        np.testing.assert_array_equal(ds["allowed"].values, np.broadcast_to(allowed[i], (L, 5, 7)))
        assert json.loads(ds.attrs["token_text"]) == [f"w{i}.{j}" for j in range(5)]
        assert list(ds["kv_group"].values) == [0, 0, 1, 1] and ds.attrs["model_kv_heads"] == 2


def test_a_directory_of_samples_of_their_own_lengths(tmp_path):
    """One file per sample, in name order, of different (and rectangular) lengths, in four formats;
    per-layer masks, integer tokens and scores without probs (stored as their masked softmax)."""
    rng = np.random.default_rng(1)
    d = tmp_path / "att"
    d.mkdir()
    shapes = [(6, 6), (4, 9), (8, 8), (3, 5)]
    given = []
    for i, ((q, k), fmt) in enumerate(zip(shapes, ["npz", "safetensors", "zarr", "npz"])):
        scores, probs, allowed = attention(rng, q, k)
        layer_mask = np.stack([allowed, allowed & (np.arange(k)[None, :] >= k - q - 1 + np.arange(q)[:, None] - 2)])
        arrays = {"scores": scores, "probs": af.masked_softmax(scores, layer_mask[:, None]).astype(np.float32),
                  "allowed": layer_mask, "tokens": np.arange(q) + 100 * i}
        write(fmt, d / f"s{i}.{fmt}", arrays)
        given.append(arrays)
    (d / "notes.txt").write_text("not attention")
    model = model_entry(d, 4)
    assert adapter(model).n_candidates(model) == 4 and adapter(model).n_tokens(model) is None
    # each sample's extract job reads its own file (a zarr store: its every file)
    assert adapter(model).input_files(model) == [] and adapter(model).sample_files(model, [0]) == [str(d / "s0.npz")]
    assert adapter(model).max_tokens(model) == 9
    zarr_files = adapter(model).sample_files(model, [2])
    assert zarr_files and all(f.startswith(str(d / "s2.zarr")) for f in zarr_files)
    for ds, arrays, (q, k) in zip(extract_all(model, tmp_path), given, shapes):
        assert (ds.sizes["query"], ds.sizes["key"]) == (q, k)
        np.testing.assert_array_equal(ds["probs"].values, arrays["probs"])
        np.testing.assert_array_equal(ds["scores"].values, arrays["scores"])
        np.testing.assert_array_equal(ds["allowed"].values, arrays["allowed"])
        np.testing.assert_array_equal(ds["token"].values, arrays["tokens"])


def test_scores_alone_become_their_masked_softmax_and_an_oattn_store_reads_back(tmp_path):
    rng = np.random.default_rng(2)
    scores, probs, allowed = attention(rng, 6, 6)
    src = write("npz", tmp_path / "s.npz", {"scores": scores, "allowed": allowed})
    [ds] = extract_all(model_entry(src, 1, quantity="scores"), tmp_path)
    np.testing.assert_allclose(ds["probs"].values, probs, atol=1e-7)
    assert (ds["probs"].values[..., ~allowed] == 0).all()
    # the store oattn wrote is itself an attention source (its token, allowed and kv_group read back)
    again = tmp_path / "again"
    again.mkdir()
    [back] = extract_all(model_entry(tmp_path / "out" / "sample0.zarr", 1, quantity="scores"), again)
    for name in ("scores", "probs", "allowed", "token", "kv_group"):
        np.testing.assert_array_equal(back[name].values, ds[name].values)


def test_xarray_dimension_names_put_the_axes_in_order(tmp_path):
    """A zarr store whose arrays name their dimensions in another order (key before query) is read
    by the names, not the positions."""
    rng = np.random.default_rng(3)
    scores, probs, allowed = attention(rng, 4, 7)
    path = tmp_path / "x.zarr"
    write_zarr(path, {"probs": probs.transpose(3, 0, 1, 2), "allowed": allowed.T},
               {"probs": ["key", "layer", "head", "query"], "allowed": ["key", "query"]})
    [ds] = extract_all(model_entry(path, 1), tmp_path)
    np.testing.assert_array_equal(ds["probs"].values, probs)
    np.testing.assert_array_equal(ds["allowed"].values[0], allowed)


def test_values_are_checked_a_block_at_a_time(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    probs = np.stack([attention(rng, 8, 8)[1] for _ in range(3)])
    probs[2, 1, 3, 5, 0] = np.nan
    for fmt in ("npz", "npy", "safetensors", "zarr"):
        src = write(fmt, tmp_path / f"bad.{fmt}", {"probs": probs})
        monkeypatch.setattr(af, "_BLOCK_BYTES", 8 * 8 * 4)  # one head at a time
        with pytest.raises(af.AttentionFileError, match=rf"bad.{fmt}: probs has NaN or inf at sample 2, layer 1, "
                                                        r"head 3, query 5, key 0"):
            af.check_values(af.describe(src))
    neg = np.abs(probs[0]) * -1.0
    neg[np.isnan(neg)] = 0
    with pytest.raises(af.AttentionFileError, match="a negative probability"):
        af.check_values(af.describe(write("npz", tmp_path / "neg.npz", {"probs": neg})))


# -- start-up: a bad source stops `snakemake -n` with one line naming the file -----------------------
def _bad_sources(root):
    rng = np.random.default_rng(5)
    _, probs, allowed = attention(rng, 6, 6)
    (root / "empty").mkdir()
    nan = probs.copy()
    nan[0, 0, 1, 1] = np.inf
    np.savez(root / "nan.npz", probs=nan)
    np.savez(root / "rank3.npz", probs=probs[0])
    np.savez(root / "mask.npz", probs=probs, allowed=allowed[:5])
    np.savez(root / "probs_only.npz", probs=probs)
    np.savez(root / "ints.npz", probs=(probs > 0.5).astype(np.int64))
    return {"missing": (root / "missing.npz", {}, "no such file or directory"),
            "empty": (root / "empty", {}, "holds no attention file"),
            "nan": (root / "nan.npz", {}, "probs has NaN or inf at layer 0, head 0, query 1, key 1"),
            "rank": (root / "rank3.npz", {}, r"probs: rank 3, shape \(4, 6, 6\)"),
            "mask": (root / "mask.npz", {}, r"allowed: shape \(5, 6\) does not fit"),
            "dtype": (root / "ints.npz", {}, "dtype int64 is not floating point"),
            "scores": (root / "probs_only.npz", {"quantity": "scores"}, r"extract.quantity: scores, but .* holds no "
                                                                         r"'scores'")}


@pytest.mark.workflow
@pytest.mark.parametrize("case", ["missing", "empty", "nan", "rank", "mask", "dtype", "scores"])
def test_a_bad_source_is_refused_at_start_up_naming_the_file(case, tmp_path):
    path, extract, message = _bad_sources(tmp_path)[case]
    cfg = {**TINY, "models": [{"name": "ext", "kind": "attention", "path": str(path),
                               "extract": {"n_samples": 1, **extract}}]}
    proc = snakemake(tmp_path, cfg, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    line = next(x for x in out.splitlines() if "models[0]" in x)
    assert str(path) in line and re.search(message, line), line
    assert not (tmp_path / "results").exists()
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        model_entry(path, 1, **extract)


@pytest.mark.workflow
def test_too_many_samples_are_refused_naming_the_count(tmp_path):
    rng = np.random.default_rng(6)
    np.savez(tmp_path / "one.npz", probs=attention(rng, 4, 4)[1])
    with pytest.raises(ConfigError, match=r"extract.n_samples: 2 samples requested .* hold 1"):
        model_entry(tmp_path / "one.npz", 2)


def test_an_entry_without_extract_takes_every_sample_and_the_quantity_the_files_hold(tmp_path):
    rng = np.random.default_rng(7)
    scores, probs, _ = zip(*(attention(rng, 4, 4) for _ in range(3)))
    np.savez(tmp_path / "both.npz", probs=np.stack(probs), scores=np.stack(scores))
    np.savez(tmp_path / "probs.npz", probs=np.stack(probs[:2]))
    np.save(tmp_path / "scores.npy", np.stack(scores[:2]))
    sections = {"entropy": {"head_top_k": 4, "network_top_k": 4}}
    schema_default = complete_model({"name": "t", "kind": "txl"})["extract"]
    for file, n, quantity, extra in (("both.npz", 3, "scores", {}), ("probs.npz", 2, "probs", {}),
                                     ("scores.npy", 2, "scores", {"quantity_in_file": "scores"})):
        entry = {"name": "ext", "kind": "attention", "path": str(tmp_path / file), **extra}
        ex = complete_model(entry, **sections)["extract"]
        assert ex == {**schema_default, "n_samples": n, "quantity": quantity}, file
        # the workflow's own validation completes the same section
        config = {"models": [copy.deepcopy(entry)], **copy.deepcopy(sections)}
        validate_config(config, str(SCHEMA))
        assert config["models"][0]["extract"] == ex
    # a section given wins, its absent keys the schema's defaults as for any kind
    given = complete_model({"name": "ext", "kind": "attention", "path": str(tmp_path / "both.npz"),
                            "extract": {"n_samples": 1}}, **sections)["extract"]
    assert given == {**schema_default, "n_samples": 1, "quantity": "probs"}
    # other kinds still need the section given; unreadable files name the path
    with pytest.raises(ConfigError, match=r"models\[0\]: 'extract' is a required property"):
        validate_config({"models": [{"name": "t", "kind": "txl"}]}, str(SCHEMA))
    with pytest.raises(ConfigError, match=r"models\[0\]\.path: .*missing\.npz"):
        complete_model({"name": "ext", "kind": "attention", "path": str(tmp_path / "missing.npz")}, **sections)


# -- the docs' recipe, through the real workflow -----------------------------------------------
RECIPE_PAGE = REPO / "docs" / "how-to" / "attention.md"


def readme_numpy_recipe() -> str:
    """The numpy recipe of the page on attention computed elsewhere, as a reader copies it."""
    from doc_pages import code_blocks

    blocks = [body for _, _, body in code_blocks(RECIPE_PAGE.read_text(encoding="utf-8"), "python")]
    return next(b for b in blocks if "np.savez" in b)


def workflow_config(path, n: int, name: str = "ext", **extract) -> dict:
    return {**TINY, "models": [{"name": name, "kind": "attention", "path": str(path),
                                "extract": {"n_samples": n, "quantity": "probs", **extract}}]}


def job_stats(dry_run: str) -> str:
    """The 'Job stats' table of a dry run's output."""
    return dry_run.split("Job stats:")[-1]


def two_models_config(work) -> dict:
    """The tiny config with `attention_run`'s two models: `ext` (the docs' files under
    work/attention) and `probs` (work/probs)."""
    cfg = workflow_config(work / "attention", 4)
    cfg["models"] += workflow_config(work / "probs", 2, name="probs")["models"]
    return cfg


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    """One run of the tiny workflow on two models of kind attention: `ext`, the docs' numpy
    recipe run as written plus one rectangular sample (scores given), and `probs`, probabilities
    alone in .npy files of two lengths. Each model's samples are small enough to run every stage
    as one job for all of them (the tiny config's jobs.batch_max_entries)."""
    work = tmp_path_factory.mktemp("attention_workflow")
    (work / "attention").mkdir()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        exec(compile(readme_numpy_recipe(), str(RECIPE_PAGE), "exec"), {})
    finally:
        os.chdir(cwd)
    rng = np.random.default_rng(7)
    scores, probs, allowed = attention(rng, 7, 10, 2, 4)
    np.savez(work / "attention" / "sample999.npz", probs=probs, scores=scores, allowed=allowed)
    (work / "probs").mkdir()
    rng = np.random.default_rng(8)
    for i, n in enumerate([10, 13]):
        np.save(work / "probs" / f"s{i}.npy", attention(rng, n, n, 2, 3)[1])
    cfg = two_models_config(work)
    dry = job_stats(snakemake(work, cfg, "-n").stdout)
    assert "prune" not in dry
    # samples of their own lengths are planned for the longest (16 x 16 tokens x 8 heads here):
    # under the tiny config's jobs.batch_max_entries, one job per stage for all four
    assert re.search(r"^extract_batch_ext\s+1$", dry, re.M) and re.search(r"^extract_batch_probs\s+1$", dry, re.M), dry
    snakemake(work, cfg)
    return work


def summary_section(md: str, name: str) -> str:
    """Model `name`'s section of summary.md (from its heading to the next model's)."""
    return md.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


def explorer_meta(page_path) -> dict:
    page = page_path.read_text()
    return json.loads(re.search(r"<script id='oattn-meta' type='application/json'>(.*?)</script>", page).group(1))


@pytest.mark.workflow
def test_the_readme_recipe_runs_end_to_end_with_samples_of_their_own_lengths(attention_run):
    res = attention_run / "results" / "ext"
    lengths = [(12, 12), (16, 16), (9, 9), (7, 10)]
    for i, (q, k) in enumerate(lengths):
        att = store.read_store(res / "attention" / f"sample{i}.zarr")
        assert (att.sizes["query"], att.sizes["key"]) == (q, k)
        org = store.read_store(res / "organized" / f"sample{i}.zarr")
        # every query and key is a leaf of its tree, once
        assert sorted(org["tree_q"].values[-1]) == list(range(q)) and sorted(org["tree_k"].values[-1]) == list(range(k))
        assert org["affinity_q"].shape == (q, q) and org["affinity_k"].shape == (k, k)
    assert json.loads(store.read_store(res / "attention" / "sample0.zarr").attrs["token_text"])[:2] == ["tok0", "tok1"]
    ent = store.read_store(res / "entropy.zarr")
    assert ent.sizes["sample"] == 4 and np.isfinite(ent["head_entropy"].values).all()
    assert len((res / "tables" / "table2.csv").read_text().strip().splitlines()) == 1 + 4
    assert not (res / "prune").exists() and not (res / "tables" / "table3.md").exists()
    assert "skipped" not in json.loads((res / "figures" / "temperature.json").read_text())  # scores given
    md = summary_section((attention_run / "results" / "summary.md").read_text(), "ext")
    assert "prune: not run: kind attention holds no model to mask" in md and "Theorem 1 (temperature" not in md
    claims = (attention_run / "results" / "claims.csv").read_text()
    assert "kind attention holds no model to mask" in claims
    meta = explorer_meta(res / "explorer.html")
    assert meta["lengths"] == [list(n) for n in lengths] and (meta["n_query"], meta["n_key"]) == (16, 16)
    assert meta["units_2d"]  # scores given: the heads' own 2-D organizations


@pytest.mark.workflow
def test_editing_an_attention_file_reruns_its_own_samples_only(attention_run, tmp_path):
    path = attention_run / "attention" / "sample000.npz"
    before = path.read_bytes()
    first = dict(np.load(path))
    first["probs"][1] = first["allowed"] / first["allowed"].sum(-1, keepdims=True)  # layer 1 uniform
    try:
        np.savez(path, **first)
        out = snakemake(attention_run, two_models_config(attention_run), "-n").stdout
    finally:
        path.write_bytes(before)
    # the edited model's extraction and what follows it; not the other model's, nor the data
    jobs = job_stats(out)
    assert re.search(r"^extract_batch_ext\s+1$", jobs, re.M) and re.search(r"^organize_batch_ext\s+1$", jobs, re.M), jobs
    assert not re.search(r"^prepare_data\s+\d+$", jobs, re.M)
    assert not re.search(r"output: \S*results/probs/", out), out[-3000:]
    # one job per sample: each extract job reads its own sample's file and no other (the sample
    # files in name order), so that an edit reruns that sample's analysis alone
    cfg = {**workflow_config(attention_run / "attention", 4), "jobs": {"batch_max_entries": 0}}
    plan = snakemake(tmp_path, cfg, "-n", *[f"results/ext/attention/sample{i}.zarr/zarr.json" for i in range(4)]).stdout
    files = sorted((attention_run / "attention").glob("*.npz"))
    reads = {int(m.group(2)): m.group(1).split(", ")
             for m in re.finditer(r"rule extract:\n\s+input: (.*)\n\s+output: \S*/attention/sample(\d+)\.zarr", plan)}
    assert sorted(reads) == [0, 1, 2, 3], plan[-3000:]
    for i, inputs in reads.items():
        assert [f for f in inputs if f.endswith(".npz") and "/attention/" in f] == [str(files[i])], (i, inputs)


@pytest.mark.workflow
def test_probabilities_alone_skip_what_needs_scores_and_say_why(attention_run, tmp_path):
    res = attention_run / "results"
    assert "scores" not in store.read_store(res / "probs" / "attention" / "sample1.zarr")
    temp = json.loads((res / "probs" / "figures" / "temperature.json").read_text())
    assert "holds no pre-softmax scores" in temp["skipped"]
    md = summary_section((res / "summary.md").read_text(), "probs")
    assert "Theorem 1 (temperature figure, paraproduct): not run:" in md
    assert "prune: not run: kind attention holds no model to mask" in md
    meta = explorer_meta(res / "probs" / "explorer.html")
    assert meta["units_2d"] == [] and "no pre-softmax scores" in meta["units_2d_note"]
    # and scores cannot be asked for
    proc = snakemake(tmp_path, workflow_config(attention_run / "probs", 2, quantity="scores"), "-n", check=False)
    assert proc.returncode and "extract.quantity: scores" in proc.stdout + proc.stderr
