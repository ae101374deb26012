"""The explorer: the level of detail's properties, and each model's page built from the
tiny workflow's real stores, driven in a real browser (Debian's chromium through playwright).

Every browser test reads back what the page plots (plotly's own `data` of each graph) and
compares it with the zarr stores, so a wrong head index, a transposed heatmap or a sample
selector that does not switch fails. A screenshot of every state goes to the test's tmp dir.
Causal heads: the entries the model masks must be drawn as masked (null in plotly's z) in every
view, permuted with the view, and a store holding a subset of the model's layers and heads must
be labelled by the model's own indices.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from oattn_lib.explorer.encode import allowed_of_rule, mask_rules, plan
from oattn_lib.explorer.lod import block_mean, boundary_depth, dequantise, quantise, tree_cut, uniform_cut
from oattn_lib.trees import PartitionTree


# -- level of detail (no browser) -------------------------------------------------------------
def nested_tree(n: int, seed: int) -> PartitionTree:
    """A random tree with folders of 1 to 4 children (single-child folders included), items permuted."""
    rng = np.random.default_rng(seed)
    groups, levels = np.arange(n), [np.arange(n)]
    while groups.max() > 0:
        k = groups.max() + 1
        sizes = rng.integers(1, 5, size=k)
        parent = np.repeat(np.arange(k), sizes)[:k]
        parent = np.unique(parent, return_inverse=True)[1]
        if parent.max() + 1 == k:  # make progress: merge the first two
            parent = np.r_[0, np.arange(k - 1)]
        groups = parent[groups]
        levels.append(groups)
    labels = np.stack(levels[::-1])
    return PartitionTree(labels[:, rng.permutation(n)])


def runs(values) -> list[tuple[int, int]]:
    values = np.asarray(values)
    cut = np.flatnonzero(values[1:] != values[:-1]) + 1
    edges = np.r_[0, cut, values.size]
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


@given(st.integers(2, 60), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_boundary_depth_recovers_every_level_of_the_tree(n, seed):
    t = nested_tree(n, seed)
    depth = boundary_depth(t)
    for level in range(t.n_levels):
        cuts = np.flatnonzero(depth <= level) + 1
        from_depth = list(zip(np.r_[0, cuts].tolist(), np.r_[cuts, n].tolist()))
        assert from_depth == runs(t.labels[level, t.order])


@given(st.integers(2, 70), st.integers(1, 40), st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_tree_cut_is_a_partition_into_folders_of_the_tree(n, max_folders, seed):
    t = nested_tree(n, seed)
    edges = tree_cut(boundary_depth(t), max_folders)
    assert edges[0] == 0 and edges[-1] == n and np.all(np.diff(edges) > 0)
    assert len(edges) - 1 <= max(max_folders, 1) or n <= max_folders
    folders = {seg for level in range(t.n_levels) for seg in runs(t.labels[level, t.order])}
    for seg in zip(edges[:-1].tolist(), edges[1:].tolist()):
        assert seg in folders, f"{seg} is not a folder of the tree"
    if n <= max_folders:
        assert np.array_equal(edges, np.arange(n + 1))
    depth = boundary_depth(t)
    root_children = int((depth == depth.min()).sum()) + 1
    if max_folders >= root_children:  # the root is split whenever its children fit
        assert len(edges) - 1 >= root_children


def test_uniform_cut_is_contiguous_runs_of_near_equal_size():
    e = uniform_cut(1000, 128)
    assert e[0] == 0 and e[-1] == 1000 and len(e) - 1 <= 128
    assert np.diff(e).max() - np.diff(e).min() <= 1 + np.diff(e).min()


def test_block_mean_is_the_mean_over_each_rectangle():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 13, 9))
    r, c = np.array([0, 4, 5, 13]), np.array([0, 2, 9])
    got = block_mean(x, r, c)
    for i in range(3):
        for j in range(2):
            assert np.allclose(got[:, i, j], x[:, r[i]:r[i + 1], c[j]:c[j + 1]].mean(axis=(1, 2)))
    with pytest.raises(ValueError, match="row_edges"):
        block_mean(x, np.array([0, 12]), c)


def naive_masked_means(x, allowed, r, c):
    """Mean of the allowed entries of every rectangle, one at a time; NaN where none is allowed."""
    out = np.full(x.shape[:-2] + (len(r) - 1, len(c) - 1), np.nan)
    for idx in np.ndindex(x.shape[:-2]):
        for i in range(len(r) - 1):
            for j in range(len(c) - 1):
                blk = x[idx][r[i]:r[i + 1], c[j]:c[j + 1]][allowed[idx][r[i]:r[i + 1], c[j]:c[j + 1]]]
                if blk.size:
                    out[idx + (i, j)] = blk.mean()
    return out


def test_block_mean_with_a_mask_averages_only_the_allowed_entries():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 13, 11))
    allowed = np.broadcast_to(np.tril(np.ones((13, 11), bool)), x.shape).copy()
    allowed[2] = rng.random((13, 11)) < 0.3  # not a band: padding-like holes
    r, c = np.array([0, 4, 5, 9, 13]), np.array([0, 3, 4, 11])
    got = block_mean(x, r, c, allowed)
    want = naive_masked_means(x, allowed, r, c)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 0, 2]) and np.isfinite(got[0, 1, 1])  # a block above the diagonal; one across it
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
    # a mixed block is not the mean of all its entries (the pre-mask values are not read) ...
    mixed = np.isfinite(got) & ~np.isclose(got, block_mean(x, r, c))
    assert mixed.any()
    # ... whatever they are
    np.testing.assert_allclose(block_mean(np.where(allowed, x, 1e30), r, c, allowed), got, rtol=1e-12, equal_nan=True)
    # one mask for every head broadcasts
    np.testing.assert_allclose(block_mean(x, r, c, allowed[0]), naive_masked_means(
        x, np.broadcast_to(allowed[0], x.shape), r, c), rtol=1e-12, equal_nan=True)
    with pytest.raises(ValueError, match="allowed"):
        block_mean(x, r, c, allowed[:, :12])


def test_quantise_ranges_over_the_allowed_entries_only():
    x = np.random.default_rng(4).normal(size=(2, 6, 6))
    x[0, np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] = np.nan
    x[1] = np.nan
    codes, lo, hi = quantise(x)
    ok = np.isfinite(x[0])
    assert (lo[0], hi[0]) == (x[0][ok].min(), x[0][ok].max()) and (lo[1], hi[1]) == (0.0, 0.0)
    back = dequantise(codes, lo, hi)
    assert np.all(np.abs(back[0][ok] - x[0][ok]) <= (hi[0] - lo[0]) / 510 + 1e-12)


def test_mask_rules_give_back_each_layers_mask_and_nothing_for_unmasked_layers():
    n_q, n_k = 9, 12
    d = np.arange(n_k)[None] - np.arange(n_q)[:, None]
    causal = d <= 0
    window = (d <= 3) & (d > 0)  # keys 1..3 after the query
    padding = np.broadcast_to(np.arange(n_k) < 7, (n_q, n_k))  # not a band of diagonals
    masks = np.stack([causal, np.ones((n_q, n_k), bool), window, padding, causal])
    enc = mask_rules(masks)
    assert enc["layers"][1] == -1 and enc["layers"][0] == enc["layers"][4]  # shared by identical layers
    assert len(enc["rules"]) == 3
    for layer in (0, 2, 3, 4):
        back = allowed_of_rule(enc["rules"][enc["layers"][layer]], n_q, n_k)
        assert back.shape == (n_q, n_k) and np.array_equal(back, masks[layer]), f"layer {layer}"
    assert "band" in enc["rules"][enc["layers"][0]] and "bits" in enc["rules"][enc["layers"][3]]
    assert mask_rules(np.ones((2, n_q, n_k), bool)) is None and mask_rules(None) is None


def unpack(block, shapes) -> list[np.ndarray]:
    """The values a page's quantised block stands for, one matrix per shape."""
    import base64
    import gzip

    codes = np.frombuffer(gzip.decompress(base64.b64decode(block["data"])), dtype=np.uint8) if block["data"] else []
    out, off = [], 0
    for i, (nr, nc) in enumerate(shapes):
        out.append(dequantise(codes[off:off + nr * nc].reshape(nr, nc), block["lo"][i], block["hi"][i]))
        off += nr * nc
    return out


def assert_means(got, want, what):
    """A level of detail's blocks as the page has them (8 bits) against masked means: equal where a
    block has an allowed entry (the page's value of a block with none is never shown)."""
    ok = np.isfinite(want)
    tol = (want[ok].max() - want[ok].min()) / 510 + 1e-6
    err = np.abs(got[ok] - want[ok]).max()
    assert err <= tol, f"{what}: differs from the masked block means by {err:.3g} (tolerance {tol:.3g})"


def test_encoded_page_data_masks_exactly_the_models_masked_entries(tmp_path):
    """A causal layer, a padding layer (no band) and an unmasked one, at the level of detail with
    every head also at full resolution: the page gets each layer's mask exactly, ranges and block
    means over the allowed entries only, the organized views' means over the permuted mask."""
    from oattn_lib.explorer.build import model_payload
    from oattn_lib.explorer.synthetic import synthetic_model
    from oattn_lib.store import read_store

    n = 24
    causal = np.tril(np.ones((n, n), bool))
    padding = causal & (np.arange(n) % 5 != 3)[None]  # causal, and keys 3, 8, ... are padding
    masks = np.stack([causal, padding, np.ones((n, n), bool)])
    b = synthetic_model(tmp_path, "dec", "txl", n, 3, 2, 1, allowed=masks, seed=5)["base"]
    pay = model_payload("dec", "txl", [b / "attention/sample0.zarr"], [b / "organized/sample0.zarr"],
                        [b / "decomposed/sample0.zarr"], b / "entropy.zarr", [], quantity="scores",
                        figure_heads=[[0, 0]], heads_2d=6, questionnaire2d_iters=1, max_side=8, data_bytes=10**7)
    assert pay["meta"]["masked"] and not pay["meta"]["plan"]["full_mode"]
    S = pay["samples"][0]
    scores = read_store(b / "attention/sample0.zarr")["scores"].transpose("layer", "head", "query", "key").values
    x = scores.astype(np.float64).reshape(6, n, n)
    # each layer's mask, exactly (not transposed), and none for the unmasked layer
    assert S["mask"]["layers"][2] == -1
    for layer in (0, 1):
        back = allowed_of_rule(S["mask"]["rules"][S["mask"]["layers"][layer]], n, n)
        assert np.array_equal(back, masks[layer]), f"layer {layer}"
    # full resolution: the 8-bit range is the allowed entries' (the pre-mask scores reach beyond it)
    assert S["full"]["units"] == list(range(6))
    full = unpack(S["full"]["raw"], [(n, n)] * 6)
    for u in range(6):
        ok = masks[u // 2]
        assert (S["full"]["raw"]["lo"][u], S["full"]["raw"]["hi"][u]) == pytest.approx((x[u][ok].min(), x[u][ok].max()))
        assert np.abs(full[u][ok] - x[u][ok]).max() <= (x[u][ok].max() - x[u][ok].min()) / 510 + 1e-6
    assert any(x[u][~masks[u // 2]].max() > x[u][masks[u // 2]].max() or
               x[u][~masks[u // 2]].min() < x[u][masks[u // 2]].min() for u in range(4)), "nothing to tell apart"
    # level of detail, token order and the two organized orders
    L = S["lod"]
    shape = lambda e: (len(e["rows"]) - 1, len(e["cols"]) - 1)  # noqa: E731
    raw = unpack(L["raw"], [shape(L["raw"])] * 6)
    org3 = unpack(L["org3d"], [shape(L["org3d"])] * 6)
    org2 = unpack(L["org2d"], [shape(L["edges2d"][str(u)]) for u in L["units2d"]])
    tq, tk = S["tree_q"]["order"], S["tree_k"]["order"]
    for u in range(6):
        a = masks[u // 2]
        views = [("raw", raw[u], np.arange(n), np.arange(n), L["raw"]),
                 ("org3d", org3[u], tq, tk, L["org3d"]),
                 ("org2d", org2[L["units2d"].index(u)], S["o2d"][str(u)]["rows"]["order"],
                  S["o2d"][str(u)]["cols"]["order"], L["edges2d"][str(u)])]
        for name, got, ro, co, e in views:
            ix = np.ix_(ro, co)
            want = block_mean(x[u][ix], e["rows"], e["cols"], a[ix])
            assert_means(got, want, f"unit {u} {name}")
            if u // 2 == 2:
                assert np.isfinite(want).all() and np.allclose(want, block_mean(x[u][ix], e["rows"], e["cols"]))
            elif name != "raw":  # the test tells the permuted mask from the unpermuted and the transposed one
                for wrong in (a, a.T):
                    other = block_mean(x[u][ix], e["rows"], e["cols"], wrong)
                    both = np.isfinite(other) & np.isfinite(want)
                    assert (np.isnan(other) != np.isnan(want)).any() or not np.allclose(other[both], want[both])
        assert np.isnan(block_mean(x[u], L["raw"]["rows"], L["raw"]["cols"], a)).any() == (u // 2 != 2)


def test_ablation_scores_land_on_the_heads_the_model_indices_name(tmp_path):
    """The prune stage's rankings name heads by the model's indices; a subset store's units are
    positions: (layer 3, head 2) of layers [1, 3] x heads [0, 2] is unit 3. A head the stores do
    not hold is an error naming the file."""
    import pandas as pd

    from oattn_lib.explorer.build import ablation_metrics

    csv = tmp_path / "rankings.csv"
    pd.DataFrame({"ranking": "gradient", "order": 0, "position": range(4), "layer": [3, 1, 3, 1],
                  "head": [2, 0, 0, 2], "score": [4.0, 1.0, 3.0, 2.0]}).to_csv(csv, index=False)
    assert ablation_metrics(csv, [1, 3], [0, 2])["ablation: gradient"].tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match=r"rankings\.csv.*layer 3, head 2"):
        ablation_metrics(csv, [1, 3], [0, 1])


def test_quantise_is_within_half_a_step_and_keeps_the_extremes():
    x = np.random.default_rng(1).normal(size=(4, 7, 5)) * np.array([1, 10, 1e-3, 0])[:, None, None]
    codes, lo, hi = quantise(x)
    back = dequantise(codes, lo, hi)
    step = (hi - lo)[:, None, None] / 255
    assert np.all(np.abs(back - x) <= step / 2 + 1e-12)
    assert np.allclose(lo, x.min(axis=(1, 2))) and np.allclose(hi, x.max(axis=(1, 2)))


def test_plan_is_full_resolution_when_it_fits_and_level_of_detail_within_the_budget():
    p = plan(64, 64, 72, 6, [0, 71], 128, 9_000_000)
    assert p.full_mode and p.size <= p.budget
    big = plan(1024, 1024, 270, 6, list(range(8)), 128, 9_000_000)
    assert not big.full_mode and big.side <= 128 and big.size <= big.budget
    assert big.side < 128  # 270 heads x 6 samples at 128 x 128 cannot fit 9 MB
    generous = plan(300, 300, 4, 2, [1, 2], 128, 50_000_000)
    assert generous.side == 128 and generous.full == {0: [1, 2], 1: [1, 2]}


# -- token text -----------------------------------------------------------------------------------
@pytest.mark.parametrize("pieces, shown", [
    # byte-level BPE (SmolLM2's stores): Ġ a space, Ċ a newline, ĉ a tab, each character a byte
    (["Base", "Ġclass", ".", "Ċ", "ĊĊ", "ĠcafÃ©", "ĉx", "<|im_start|>"],
     ["Base", "␣class", ".", "↵", "↵↵", "␣café", "⇥x", "<|im_start|>"]),
    (["Ġâ", "Ģ", "ľ"], ["␣\\xe2", "\\x80", "\\x9c"]),  # a character split over pieces: its bytes, visible
    # SentencePiece: ▁ a space, <0xNN> a byte
    (["▁named", "▁", "<0x0A>", "<0x09>", "ed", "</s>"], ["␣named", "␣", "↵", "⇥", "ed", "</s>"]),
    # WordPiece (MiniLM's stores): ## continues a word, any other piece but punctuation starts one
    (["[CLS]", "the", "st", "##mt", "\"", "*", "[SEP]", "a"], ["[CLS]", "␣the", "␣st", "mt", "\"", "*", "[SEP]", "␣a"]),
    # words of a word-level vocabulary (txl's), and text given as it is (attention files)
    (["__getattribute__", "(", "<eos>", "##", "[x]"], ["__getattribute__", "(", "<eos>", "##", "[x]"]),
    ([" named", "a\nb", "tab\t", "  ", "\x00"], ["␣named", "a↵b", "tab⇥", "␣␣", "␀"]),
])
def test_tokens_are_shown_as_text_with_visible_spaces_and_newlines(pieces, shown):
    from oattn_lib.explorer.collect import SPACE_MARK, shown_tokens

    assert SPACE_MARK == "␣"
    assert shown_tokens(pieces) == shown


# -- the pages of the tiny workflow, in chromium -------------------------------------------------
CHROMIUM = os.environ.get("OATTN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
MODELS = {"txl": ("txl", "scores"), "vit": ("vit", "probs"), "lm": ("hf", "probs")}


def test_a_sample_is_read_as_one_copy_of_its_heads(tmp_path):
    """The explorer's sample reader holds the heads once (1.1 GB at 270 heads x 1024 tokens): read
    in the store's unit-first order, not as the network tensor and its transposition beside it.
    In a fresh process the high-water mark grows by under 1.6 tensors while it reads a 32-layer
    store of 128 MB (1.42 measured, a fixed ~50 MB of it the reads' buffers and masks; 2.17 when
    it reordered a (query, key, unit) copy); each unit is the store's head."""
    import subprocess
    import sys

    code = f"""
import json
import numpy as np, xarray as xr
from oattn_lib import store
from oattn_lib.explorer.collect import read_sample

def status(key):
    return next(int(line.split()[1]) / 1024 for line in open("/proc/self/status") if line.startswith(key))

n_layer, n_head, n = 32, 4, 512
d = {str(tmp_path)!r}
x = np.random.default_rng(0).random((n_layer, n_head, n, n), dtype=np.float32)
coords = {{"layer": np.arange(n_layer), "head": np.arange(n_head), "query": np.arange(n), "key": np.arange(n)}}
causal = np.broadcast_to(np.tril(np.ones((n, n), bool)), (n_layer, n, n))
store.write_store(xr.Dataset({{"probs": (("layer", "head", "query", "key"), x),
                              "allowed": (("layer", "query", "key"), causal)}}, coords=coords), d + "/a.zarr")
heads = {{u: x[u // n_head, u % n_head].copy() for u in (0, 7, 127)}}
del x
units = n_layer * n_head
unit = {{"unit_layer": ("unit", np.repeat(np.arange(n_layer), n_head)),
        "unit_head": ("unit", np.tile(np.arange(n_head), n_layer))}}
tree = lambda m: np.stack([np.zeros(m, np.int64), np.arange(m)])
store.write_store(xr.Dataset({{"tree_q": (("level_q", "query"), tree(n)), "tree_k": (("level_k", "key"), tree(n)),
                              "tree_h": (("level_h", "unit"), tree(units)),
                              "affinity_q": (("query", "query_"), np.eye(n, dtype=np.float32)),
                              "affinity_k": (("key", "key_"), np.eye(n, dtype=np.float32)),
                              "affinity_h": (("unit", "unit_"), np.eye(units, dtype=np.float32))}}, coords=unit),
                  d + "/o.zarr")
store.write_store(xr.Dataset({{"diffusion_coords": (("unit", "component"), np.zeros((units, 2)))}}, coords=unit),
                  d + "/d.zarr")
read_sample(0, d + "/a.zarr", d + "/o.zarr", d + "/d.zarr", "probs")  # imports and caches
start = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark from here
s = read_sample(0, d + "/a.zarr", d + "/o.zarr", d + "/d.zarr", "probs")
print(json.dumps({{"grew": status("VmHWM") - start, "tensor": s.x.nbytes / 2 ** 20,
                  "same": all(bool((s.x[u] == h).all()) for u, h in heads.items())}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["same"] and got["tensor"] == 128
    assert got["tensor"] <= got["grew"] < 1.6 * got["tensor"], got


@pytest.fixture(scope="module")
def built(clean_run, tmp_path_factory):
    """Each model's page built from clean_run's stores, plus a level-of-detail page of lm (8 x 8)."""
    from wfutil import TINY
    from oattn_lib.stages.explorer import explorer, explorer_index

    out = tmp_path_factory.mktemp("explorer")
    res = clean_run / "results"
    dec = TINY["decompose"]
    pages = {}

    def build(model, name, **kw):
        kind, quantity = MODELS[model]
        base = res / model
        n = 2
        optional = {k: (base / sub if (base / sub).exists() else None) for k, sub in
                    (("table3_csv", "tables/table3.csv"), ("table4_csv", "tables/table4.csv"),
                     ("rankings_csv", "prune/rankings.csv"), ("stability_store", "stability.zarr"),
                     ("stability_csv", "tables/stability.csv"))}
        path = out / name / "explorer.html"
        explorer(model, kind, [base / f"attention/sample{i}.zarr" for i in range(n)],
                 [base / f"organized/sample{i}.zarr" for i in range(n)],
                 [base / f"decomposed/sample{i}.zarr" for i in range(n)], base / "entropy.zarr",
                 base / "tables/table1.csv", base / "tables/table2.csv", path, quantity=quantity,
                 figure_heads=dec["figure_heads"], questionnaire2d_iters=dec["questionnaire2d_iters"],
                 **{**dict(heads_2d=4, max_side=128, data_mb=9.0), **kw}, **optional)
        return path

    for model in MODELS:
        pages[model] = build(model, model)
    explorer_index(pages, out / "explorer.html", note=out / "explorer_note.rst")
    pages["lm-lod"] = build("lm", "lm-lod", max_side=8, data_mb=0.08)
    return {"pages": pages, "index": out / "explorer.html", "results": res}


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """One explorer page open in chromium; console errors are collected."""

    def __init__(self, browser, path, shots, explorer=True):
        self.pg = browser.new_page(viewport={"width": 1500, "height": 1100})
        self.errors, self.shots = [], shots
        self.pg.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.pg.on("pageerror", lambda e: self.errors.append(str(e)))
        self.pg.goto(path.as_uri())
        if explorer:
            self.pg.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)

    def js(self, expr, arg=None):
        return self.pg.evaluate(expr, arg)

    def renders(self) -> int:
        return int(self.js("document.body.dataset.rendered"))

    def after(self, action):
        """Run `action` (a user interaction) and wait until the page has rendered the new state."""
        before = self.renders()
        action()
        self.pg.wait_for_function(f"+document.body.dataset.rendered > {before}", timeout=30_000)
        self.js("window.oattn.idle()")

    def z(self, view) -> np.ndarray:
        return np.array(self.js(f"document.getElementById('{view}').data[0].z"), dtype=np.float64)

    def unit(self) -> int:
        return self.js("window.oattn.state.unit")

    def pixel(self, graph, x, y):
        """Where data point (x, y) of a plotly graph is on the screen (plotly's own axis maps)."""
        return self.js("""([id, x, y]) => { const gd = document.getElementById(id), L = gd._fullLayout;
            const b = gd.getBoundingClientRect();
            return [b.left + L.xaxis._offset + L.xaxis.l2p(x), b.top + L.yaxis._offset + L.yaxis.l2p(y)]; }""",
                       [graph, x, y])

    def click_at(self, x, y):
        """Move there, let plotly's hover (throttled) catch up, then click: as a user does."""
        self.pg.mouse.move(x, y, steps=4)
        self.pg.wait_for_timeout(150)
        self.pg.mouse.click(x, y)

    def click_grid(self, layer, head):
        self.after(lambda: self.click_at(*self.pixel("grid", head, layer)))

    def shot(self, name):
        self.pg.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)


@pytest.fixture
def open_page(browser, built, tmp_path):
    opened = []

    def open_(name):
        p = Page(browser, built["pages"][name] if name != "index" else built["index"], tmp_path,
                 explorer=name != "index")
        opened.append(p)
        return p

    yield open_
    for p in opened:
        assert p.errors == [], f"console errors: {p.errors}"
        p.pg.close()


def store_head(results, model, sample, layer, head, quantity=None):
    from oattn_lib.store import read_store

    ds = read_store(results / model / f"attention/sample{sample}.zarr")
    quantity = quantity or MODELS[model][1]
    return ds[quantity].sel(layer=layer, head=head).transpose("query", "key").values.astype(np.float64)


def store_allowed(results, model, sample, layer) -> np.ndarray:
    """The model's mask of a layer, (query, key) bool: True where its heads may attend."""
    from oattn_lib.store import read_store

    ds = read_store(results / model / f"attention/sample{sample}.zarr")
    return ds["allowed"].sel(layer=layer).transpose("query", "key").values.astype(bool)


def assert_shows(z, x, what, span=None, allowed=None):
    """The page shows x, quantised to 8 bits: within half a step of its range (or `span`, the range
    of the whole matrix x is a block of), and not its transpose. `allowed` (x's layout; None:
    every entry): the model's mask, the page must show exactly the masked entries as masked (NaN)
    and the range is the allowed entries'."""
    ok = np.ones(x.shape, bool) if allowed is None else allowed
    tol = (x[ok].max() - x[ok].min() if span is None else span) / 510 + 1e-6
    assert z.shape == x.shape, f"{what}: page shows {z.shape}, the store has {x.shape}"
    assert np.array_equal(np.isnan(z), ~ok), f"{what}: masked where the model is not, or not where it is"
    err = np.abs(z - x)[ok].max()
    assert err <= tol, f"{what}: differs from the store by {err:.3g} (tolerance {tol:.3g})"
    if x.shape[0] == x.shape[1] and not np.allclose(np.where(ok & ok.T, x, 0), np.where(ok & ok.T, x.T, 0),
                                                    atol=4 * tol):
        assert np.nanmax(np.abs(z - x.T)) > tol, f"{what}: matches the transposed head too"


@pytest.mark.workflow
@pytest.mark.parametrize("model", list(MODELS))
def test_page_loads_fast_with_no_console_errors_and_fits_the_budget(open_page, built, model):
    path = built["pages"][model]
    assert path.stat().st_size < 15e6
    p = open_page(model)
    fcp = p.js("performance.getEntriesByName('first-contentful-paint')[0].startTime")
    assert fcp < 3000, f"first paint after {fcp:.0f} ms"
    assert p.js("document.querySelectorAll('#tables table').length") >= 2
    p.shot(f"{model}-opened")


@pytest.mark.workflow
@pytest.mark.parametrize("model", list(MODELS))
def test_grid_shows_the_entropy_store_by_layer_and_head(open_page, built, model):
    from oattn_lib.store import read_store

    ent = read_store(built["results"] / model / "entropy.zarr")
    p = open_page(model)
    for metric, var in (("Haar entropy (coarsest l1)", "head_entropy"), ("l1/l2 sparsity (lower is sparser)",
                                                                          "head_sparsity")):
        p.after(lambda: p.pg.select_option("#metric", metric))
        want = ent[var].isel(sample=0).transpose("layer", "head").values
        assert np.allclose(p.z("grid"), want, rtol=1e-4), metric


@pytest.mark.workflow
@pytest.mark.parametrize("model", list(MODELS))
def test_clicking_a_head_in_the_grid_shows_that_heads_data(open_page, built, model):
    from oattn_lib.network import load_organization

    res = built["results"]
    p = open_page(model)
    n_layer, n_head = p.js("[window.oattn.data.meta.n_layer, window.oattn.data.meta.n_head]")
    for layer, head in ((n_layer - 1, 0), (0, n_head - 1)):
        p.click_grid(layer, head)
        assert p.unit() == layer * n_head + head
        p.shot(f"{model}-grid-L{layer}H{head}")
        x, a = store_head(res, model, 0, layer, head), store_allowed(res, model, 0, layer)
        assert_shows(p.z("view-raw"), x, "raw view", allowed=a)
        org, _ = load_organization(res / model / "organized/sample0.zarr")
        ix = np.ix_(org.tree_q.order, org.tree_k.order)
        assert_shows(p.z("view-org3d"), x[ix], "3-D view", allowed=a[ix])
        other = store_head(res, model, 0, (layer + 1) % n_layer, head)
        assert np.nanmax(np.abs(p.z("view-raw") - other)) > (x[a].max() - x[a].min()) / 510


@pytest.mark.workflow
@pytest.mark.parametrize("model", list(MODELS))
def test_figure_head_2d_view_and_residual_equal_the_decomposed_store(open_page, built, model):
    """The last figure head, (-1, -1), chosen from the head menu: its own 2-D organization and
    paraproduct residual as the decompose stage stored them."""
    from oattn_lib.store import read_store

    dec = read_store(built["results"] / model / "decomposed/sample0.zarr")
    p = open_page(model)
    layer, head = int(dec["fig_layer"].values[-1]), int(dec["fig_head_index"].values[-1])
    n_head = p.js("window.oattn.data.meta.n_head")
    p.after(lambda: p.pg.select_option("#head", str(layer * n_head + head)))
    o2d = p.js(f"window.oattn.data.samples[0].o2d[{layer * n_head + head}]")
    assert o2d["rows"]["order"] == dec["fig_row_order"].values[-1].tolist()
    assert o2d["cols"]["order"] == dec["fig_col_order"].values[-1].tolist()
    organized = dec["fig_exact" if MODELS[model][1] == "probs" else "fig_organized2d"].values[-1]
    a = store_allowed(built["results"], model, 0, layer)[np.ix_(o2d["rows"]["order"], o2d["cols"]["order"])]
    assert_shows(p.z("view-org2d"), organized.astype(np.float64), "2-D view", allowed=a)
    assert_shows(p.z("view-resid"), dec["fig_residual"].values[-1].astype(np.float64), "residual", allowed=a)
    p.shot(f"{model}-figure-head")


@pytest.mark.workflow
def test_clicking_a_diffusion_map_point_selects_that_head_everywhere(open_page, built):
    p = open_page("lm")
    d = np.array(p.js("window.oattn.data.samples[0].diffusion"), dtype=np.float64)[:, :2]
    px = np.array([p.pixel("dmap", *xy) for xy in d])
    dist = np.linalg.norm(px[:, None] - px[None], axis=-1) + np.eye(len(px)) * 1e9
    current = p.unit()
    isolated = [u for u in np.argsort(-dist.min(1)) if u != current][:2]
    n_head = p.js("window.oattn.data.meta.n_head")
    for u in isolated:
        assert dist[u].min() > 8, "no point of the diffusion map is far enough from the others to click"
        p.after(lambda: p.click_at(*px[u]))
        assert p.unit() == u
        shape = p.js("document.getElementById('grid').layout.shapes[0]")
        assert (round(shape["x0"] + 0.5), round(shape["y0"] + 0.5)) == (u % n_head, u // n_head)
        assert p.js("document.getElementById('head').value") == str(u)
        assert_shows(p.z("view-raw"), store_head(built["results"], "lm", 0, u // n_head, u % n_head), "raw view",
                     allowed=store_allowed(built["results"], "lm", 0, u // n_head))
        p.shot(f"dmap-selected-{u}")


@pytest.mark.workflow
@pytest.mark.parametrize("model", ["txl", "vit"])
def test_sample_selector_switches_the_data(open_page, built, model):
    res = built["results"]
    p = open_page(model)
    n_head = p.js("window.oattn.data.meta.n_head")
    layer, head = divmod(p.unit(), n_head)
    x0, x1 = (store_head(res, model, s, layer, head) for s in (0, 1))
    a0, a1 = (store_allowed(res, model, s, layer) for s in (0, 1))
    assert_shows(p.z("view-raw"), x0, "sample 0", allowed=a0)
    p.after(lambda: p.pg.select_option("#sample", "1"))
    assert_shows(p.z("view-raw"), x1, "sample 1", allowed=a1)
    assert np.nanmax(np.abs(p.z("view-raw") - x0)) > (x0[a0].max() - x0[a0].min()) / 100
    p.shot(f"{model}-sample1")


@pytest.mark.workflow
def test_table_row_click_selects_its_head_and_headers_sort(open_page, built):
    import pandas as pd

    t1 = pd.read_csv(built["results"] / "lm" / "tables/table1.csv")
    p = open_page("lm")
    n_head = p.js("window.oattn.data.meta.n_head")
    row = t1.iloc[-1]
    p.after(lambda: p.pg.locator("#table-0 tbody tr").nth(len(t1) - 1).click())
    assert p.unit() == row["layer"] * n_head + row["head"]
    p.pg.locator("#table-0 th", has_text="mean_entropy").click()
    values = [float(v) for v in p.pg.locator("#table-0 tbody tr td:last-child").all_inner_texts()]
    assert values == sorted(values)
    p.shot("table-row-selected")


def stability_truth(base, sample: int, n_head: int):
    """From the stability store alone: each head's (unit = layer * n_head + head) largest relative
    change of its Haar entropy over the sample's replicates, and its lowest and highest value
    (the reference replicate included); None where the sample has no replicates."""
    import xarray as xr

    ds = xr.open_zarr(base / "stability.zarr", consolidated=False)
    if sample not in ds["sample"].values.tolist():
        return None
    e = ds["head_entropy"].sel(sample=sample).transpose("replicate", "unit").values
    unit = ds["unit_layer"].values * n_head + ds["unit_head"].values
    ref = e[list(ds["perturbation"].values).index("none")]
    change, lo, hi = (np.empty(unit.size) for _ in range(3))
    change[unit] = (np.abs(e - ref) / np.abs(ref)).max(axis=0)
    lo[unit], hi[unit] = e.min(axis=0), e.max(axis=0)
    return change, lo, hi, len(ds["replicate"])


@pytest.mark.workflow
@pytest.mark.parametrize("model", ["txl", "lm"])
def test_the_grid_and_the_info_line_show_each_heads_spread_over_the_replicates(open_page, built, model):
    from oattn_lib.explorer.build import STABILITY_METRIC

    base = built["results"] / model
    p = open_page(model)
    n_head = p.js("window.oattn.data.meta.n_head")
    assert any(t.startswith("Stability") for t in p.js("window.oattn.data.tables.map((t) => t.title)"))
    p.after(lambda: p.pg.select_option("#metric", STABILITY_METRIC))
    shown = 0
    for pos in range(p.js("window.oattn.data.samples.length")):
        sample = p.js(f"window.oattn.data.samples[{pos}].sample")
        truth = stability_truth(base, sample, n_head)
        if pos != p.js("window.oattn.state.sample"):
            p.after(lambda: p.pg.select_option("#sample", str(pos)))
        grid = p.z("grid").reshape(-1)
        text = p.pg.locator("#entropy-range").inner_text()
        if truth is None:
            assert np.isnan(grid).all() and "no stability replicates" in text
            continue
        change, lo, hi, n_rep = truth
        assert change.max() > 0  # the sibling replicates move some head
        np.testing.assert_allclose(grid, change, rtol=1e-4, atol=1e-12)
        # the head the most moved: its range in the info line, as the page rounds it (4 digits)
        u = int(np.argmax(change))
        if u != p.unit():
            p.after(lambda: p.pg.select_option("#head", str(u)))
        text = p.pg.locator("#entropy-range").inner_text()
        got = [float(v) for v in re.findall(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text.split("):")[1])]
        np.testing.assert_allclose(got, [lo[u], hi[u]], rtol=1e-3)
        assert f"over {n_rep} replicates" in text
        shown += 1
    assert shown >= 1
    p.shot(f"{model}-stability")


@pytest.mark.workflow
def test_level_of_detail_page_averages_over_tree_folders(open_page, built):
    from oattn_lib.network import load_organization

    res = built["results"]
    p = open_page("lm-lod")
    meta = p.js("window.oattn.data.meta")
    assert not meta["plan"]["full_mode"] and meta["plan"]["side"] == 8
    full = set(meta["plan"]["full_units"]["0"])
    n_head = meta["n_head"]
    u = next(u for u in range(meta["n_layer"] * n_head) if u not in full and u not in meta["units_2d"])
    p.after(lambda: p.pg.select_option("#head", str(u)))
    x, a = store_head(res, "lm", 0, u // n_head, u % n_head), store_allowed(res, "lm", 0, u // n_head)
    er, ec = uniform_cut(x.shape[0], 8), uniform_cut(x.shape[1], 8)
    assert p.js("document.getElementById('view-raw').data[0].y") == er.tolist()
    want = block_mean(x, er, ec, a)
    assert_shows(p.z("view-raw"), want, "raw level of detail", allowed=np.isfinite(want))
    org, _ = load_organization(res / "lm" / "organized/sample0.zarr")
    r, c = tree_cut(boundary_depth(org.tree_q), 8), tree_cut(boundary_depth(org.tree_k), 8)
    ix = np.ix_(org.tree_q.order, org.tree_k.order)
    want = block_mean(x[ix], r, c, a[ix])
    assert_shows(p.z("view-org3d"), want, "3-D level of detail", allowed=np.isfinite(want))
    assert "level of detail 8" in p.js("document.getElementById('view-raw').layout.title.text")
    p.shot("lod-head")
    # a head shipped at full resolution shows every token of the folder a click zooms into
    assert full, "the budget of this page leaves room for some heads at full resolution"
    f = sorted(full)[0]
    p.after(lambda: p.pg.select_option("#head", str(f)))
    assert p.js("document.getElementById('view-org3d').data[0].y") == r.tolist()  # level of detail first
    p.after(lambda: p.click_at(*p.pixel("view-org3d", 5.5, 7.5)))
    rows, cols = (np.array(p.js(f"document.getElementById('view-org3d').data[0].{a}")) for a in "yx")
    assert np.array_equal(rows, np.arange(rows[0], rows[-1] + 1)) and rows[0] <= 7 < rows[-1] and len(rows) < 25
    assert np.array_equal(cols, np.arange(cols[0], cols[-1] + 1)) and cols[0] <= 5 < cols[-1]
    x = store_head(res, "lm", 0, f // n_head, f % n_head)[ix]
    a = store_allowed(res, "lm", 0, f // n_head)[ix]
    assert_shows(p.z("view-org3d"), x[rows[0]:rows[-1], cols[0]:cols[-1]], "zoomed full resolution",
                 span=x[a].max() - x[a].min(), allowed=a[rows[0]:rows[-1], cols[0]:cols[-1]])
    p.shot("lod-zoomed-full-resolution")
    p.after(lambda: p.pg.click("#reset-zoom"))
    assert p.js("document.getElementById('view-org3d').data[0].y") == r.tolist()


@pytest.mark.workflow
def test_index_links_every_model_page(open_page, built):
    p = open_page("index")
    hrefs = p.js("Array.from(document.querySelectorAll('#models a')).map(a => a.href)")
    assert sorted(h.rsplit("/", 2)[-2] for h in hrefs) == sorted(MODELS)
    p.pg.locator("#models a", has_text="vit").click()
    p.pg.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)


def test_gqa_grid_groups_heads_by_kv_group_and_a_click_selects_the_right_head(browser, tmp_path):
    from oattn_lib.explorer.synthetic import synthetic_model
    from oattn_lib.stages.explorer import explorer

    kv = [1, 0, 1, 0]  # columns: heads 1, 3 (group 0), then 0, 2 (group 1)
    m = synthetic_model(tmp_path / "stores", "gqa", "hf", 12, 2, 4, 2, kv_group=kv)
    b = m["base"]
    page = tmp_path / "gqa.html"
    explorer("gqa", "hf", *[[b / f"{d}/sample{i}.zarr" for i in range(2)] for d in ("attention", "organized",
                                                                                     "decomposed")],
             b / "entropy.zarr", b / "tables/table1.csv", b / "tables/table2.csv", page, quantity="probs",
             figure_heads=[[0, 0]], questionnaire2d_iters=1, heads_2d=7, max_side=128, data_mb=9.0)
    p = Page(browser, page, tmp_path)
    assert p.js("document.getElementById('grid').layout.xaxis.ticktext") == ["1·g0", "3·g0", "0·g1", "2·g1"]
    # the one head without a 2-D organization: its 2-D views say so, the list of the 7 that have
    # one wrapped inside each panel
    units_2d = p.js("window.oattn.data.meta.units_2d")
    [absent] = set(range(8)) - set(units_2d)
    p.after(lambda: p.pg.select_option("#head", str(absent)))
    for view in ("org2d", "resid"):
        note, panel, fits = p.js("""(v) => { const n = document.getElementById('absent-' + v), b = (e) => {
            const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
            return [b(n), b(n.parentElement), n.scrollWidth <= n.clientWidth && !n.hidden]; }""", view)
        assert fits and panel[0] <= note[0] < note[2] <= panel[2] and panel[1] <= note[1] < note[3] <= panel[3], \
            (view, note, panel)
        text = p.js(f"document.getElementById('absent-{view}').textContent")
        assert "not computed" in text and text.count(", ") == len(units_2d) - 1, text
    p.after(lambda: p.pg.select_option("#head", str(units_2d[0])))
    assert p.js("document.getElementById('absent-org2d').hidden")
    for col, head in ((0, 1), (3, 2)):
        p.click_grid(1, col)
        assert p.unit() == 4 + head
        assert_shows(p.z("view-raw"), store_head(b.parent, "gqa", 0, 1, head, "probs"), f"column {col}")
    p.after(lambda: p.pg.select_option("#colorby", "kv"))
    assert p.js("document.getElementById('dmap').data[0].marker.color") == kv * 2
    p.shot("gqa")
    assert p.errors == []


@pytest.mark.workflow
def test_the_workflow_pages_follow_the_config_and_the_stores(clean_run):
    """The rule passes the config's explorer and decompose settings and every sample: each page's
    embedded meta agrees with the config and the entropy store, and the index links them all."""
    import xarray as xr
    from wfutil import TINY
    from oattn_lib.explorer import read_meta
    from oattn_lib.heads2d import figure_units

    res = clean_run / "results"
    index = (res / "explorer.html").read_text()
    note = (res / "explorer_note.rst").read_text()
    for m in TINY["models"]:
        model = m["name"]
        page = res / model / "explorer.html"
        assert page.stat().st_size < 15e6
        assert f"{model}/explorer.html" in index and f"- {model}:" in note
        meta = read_meta(page)
        ent = xr.open_zarr(res / model / "entropy.zarr", consolidated=False)
        assert (meta["model"], meta["kind"], meta["quantity"]) == (model, m["kind"], m["extract"]["quantity"])
        assert meta["n_samples"] == m["extract"]["n_samples"] == ent.sizes["sample"]
        assert (meta["n_layer"], meta["n_head"]) == (ent.sizes["layer"], ent.sizes["head"])
        figs = figure_units(TINY["decompose"]["figure_heads"], meta["n_layer"], meta["n_head"])
        n_2d = min(TINY["explorer"]["heads_2d"], meta["n_layer"] * meta["n_head"])
        assert meta["heads_2d"] == TINY["explorer"]["heads_2d"] and len(meta["units_2d"]) == n_2d
        assert meta["units_2d"][:len(figs)] == figs[:n_2d]
        assert meta["questionnaire2d_iters"] == TINY["decompose"]["questionnaire2d_iters"]
        text = page.read_text()
        start = text.index("<script id='oattn-data' type='application/json'>")
        data = json.loads(text[start:].split(">", 1)[1].split("</script>", 1)[0])
        # the grid's colours are the entropy store's (sample, layer x head) values
        grid = np.array(data["metrics"]["Haar entropy (coarsest l1)"], dtype=float)
        want = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(grid.shape)
        np.testing.assert_allclose(grid, want, rtol=1e-3, atol=1e-6)
        # the prune stage ran in the tiny config: its rankings colour the grid too
        assert any(k.startswith("ablation: ") for k in data["metrics"])
        # the stability stage ran for the models with a stability section: the rule passes its
        # store (the grid metric, the ranges) and its table
        from oattn_lib.explorer.build import STABILITY_METRIC

        stable = "stability" in m
        assert (STABILITY_METRIC in data["metrics"]) == stable
        assert any(t["title"].startswith("Stability") for t in data["tables"]) == stable
        assert (data["entropy_ranges"] is not None) == stable


# -- causal heads and a subset store, in chromium ------------------------------------------------
def bpe_pieces(n: int) -> list[str]:
    """n tokens as a byte-level BPE tokenizer gives them: words after a space (Ġ) or not, a newline (Ċ)."""
    return ["Ċ" if i == 5 else ("Ġ" if i % 2 == 0 else "") + f"w{i}" for i in range(n)]


def bpe_shown(n: int) -> list[str]:
    """What the page shows of `bpe_pieces(n)`."""
    return ["↵" if i == 5 else ("␣" if i % 2 == 0 else "") + f"w{i}" for i in range(n)]


@pytest.fixture(scope="module")
def causal_pages(tmp_path_factory):
    """Pages of a synthetic decoder whose stores hold layers 1 and 3 of 4 and heads 0 and 2 of 3:
    layer 1 causal, layer 3 unmasked; pre-softmax scores (the pre-mask scores of the masked
    entries are in the store, as extract writes them). `full`: 16 tokens, every head at full
    resolution, its tokens byte-level BPE pieces (`bpe_pieces`); `lod`: 40 tokens at a level of detail
    of 8 x 8, every head also at full resolution."""
    from oattn_lib.explorer.synthetic import synthetic_model
    from oattn_lib.stages.explorer import explorer

    out = tmp_path_factory.mktemp("causal")
    pages = {}
    for name, n, max_side in (("full", 16, 128), ("lod", 40, 8)):
        allowed = np.stack([np.tril(np.ones((n, n), bool)), np.ones((n, n), bool)])
        b = synthetic_model(out / "stores", name, "txl", n, 2, 2, 2, allowed=allowed, layers=[1, 3], heads=[0, 2],
                            seed=7, tokens=bpe_pieces(n) if name == "full" else None)["base"]
        pages[name] = out / f"{name}.html"
        explorer(name, "txl", *[[b / f"{d}/sample{i}.zarr" for i in range(2)] for d in ("attention", "organized",
                                                                                          "decomposed")],
                 b / "entropy.zarr", b / "tables/table1.csv", b / "tables/table2.csv", pages[name],
                 quantity="scores", figure_heads=[[0, 0]], questionnaire2d_iters=1, heads_2d=4, max_side=max_side,
                 data_mb=9.0)
        pages[name + "_base"] = b
    return pages


def synthetic_head(base, u):
    """Scores and mask of unit u (position layer * 2 + head) of sample 0 of a causal_pages store."""
    from oattn_lib.store import read_store

    ds = read_store(base / "attention/sample0.zarr")
    x = ds["scores"].isel(layer=u // 2, head=u % 2).transpose("query", "key").values.astype(np.float64)
    return x, ds["allowed"].isel(layer=u // 2).transpose("query", "key").values.astype(bool)


def test_a_causal_heads_views_draw_its_masked_entries_as_masked(browser, causal_pages, tmp_path):
    """Every view of a causal head is null (plotly's gap, the grey background) exactly at the
    masked entries, permuted with the view's rows and columns; hover says "masked" there; the
    colour range is the allowed entries'. The unmasked layer's heads have no gap. The tokens
    (byte-level BPE pieces) show as their text, in the hover and as the axes' tick labels (16
    tokens: few enough), in each view's order."""
    p = Page(browser, causal_pages["full"], tmp_path)
    S = p.js("window.oattn.data.samples[0]")
    n = len(S["tokens"])
    shown = bpe_shown(n)
    assert S["tokens"] == S["key_tokens"] == shown
    for u in range(4):
        if u != p.unit():
            p.after(lambda: p.pg.select_option("#head", str(u)))
        x, a = synthetic_head(causal_pages["full_base"], u)
        assert a.all() == (u >= 2)
        o2 = S["o2d"][str(u)]
        orders = {"view-raw": (np.arange(n), np.arange(n)), "view-org3d": (S["tree_q"]["order"], S["tree_k"]["order"]),
                  "view-org2d": (o2["rows"]["order"], o2["cols"]["order"])}
        for view, (ro, co) in orders.items():
            ix = np.ix_(ro, co)
            assert_shows(p.z(view), x[ix], f"unit {u} {view}", allowed=a[ix])
            text = np.array(p.js(f"document.getElementById('{view}').data[0].text"))
            assert np.array_equal(np.char.find(text.astype(str), "masked") >= 0, ~a[ix]), f"unit {u} {view} hover"
            if u == 0:  # the tick labels plotly drew: each row's and column's token, in the view's order
                ticks = p.js(f"['ytick', 'xtick'].map((t) => Array.from(document.querySelectorAll("
                             f"'#{view} .' + t + ' text')).map((e) => e.textContent))")
                assert ticks == [[shown[i] for i in ro], [shown[j] for j in co]], f"{view} tick labels"
        resid = p.z("view-resid")
        assert np.array_equal(np.isnan(resid), ~a[np.ix_(o2["rows"]["order"], o2["cols"]["order"])]), "residual"
        heat = p.js("document.getElementById('view-raw').data[0]")
        assert (heat["zmin"], heat["zmax"]) == pytest.approx((x[a].min(), x[a].max()), abs=np.ptp(x[a]) / 255)
        title = p.js("document.getElementById('view-raw').layout.title.text")
        assert ("masked" in title) == (u < 2)
        if u == 0:
            p.shot("causal-head")
            # a user's hover: a masked entry (query 0, key n - 1) and an allowed one (query n - 1, key 0)
            for (q, k), want in (((0, n - 1), "masked"), ((n - 1, 0), "value")):
                p.pg.mouse.move(*p.pixel("view-raw", k + 0.5, q + 0.5), steps=4)
                p.pg.wait_for_function("(w) => { const h = document.querySelector('#view-raw .hoverlayer');"
                                       " return h && w.every((t) => h.textContent.includes(t)); }",
                                       arg=[f"query #{q} {shown[q]}", f"key #{k} {shown[k]}"], timeout=10_000)
                label = p.js("document.querySelector('#view-raw .hoverlayer').textContent")
                assert want in label and ("masked" in label) == (want == "masked"), label
    assert p.errors == []


def test_a_causal_heads_level_of_detail_averages_only_allowed_entries(browser, causal_pages, tmp_path):
    """At the level of detail a block with no allowed entry is masked and the others show the mean of
    their allowed entries, in token order and in both organized orders; a zoom to full resolution
    shows the masked entries of its window."""
    p = Page(browser, causal_pages["lod"], tmp_path)
    S = p.js("window.oattn.data.samples[0]")
    x, a = synthetic_head(causal_pages["lod_base"], 1)
    p.after(lambda: p.pg.select_option("#head", "1"))
    n = x.shape[0]
    o2 = S["o2d"]["1"]
    views = {"view-raw": (np.arange(n), np.arange(n)), "view-org3d": (S["tree_q"]["order"], S["tree_k"]["order"]),
             "view-org2d": (o2["rows"]["order"], o2["cols"]["order"])}
    for view, (ro, co) in views.items():
        r, c = (np.array(p.js(f"document.getElementById('{view}').data[0].{k}")) for k in "yx")
        assert len(r) - 1 <= 8 < n
        # rows and columns of several tokens: the axes give positions, not tokens
        assert p.js(f"document.getElementById('{view}').layout.yaxis.ticktext") is None
        ix = np.ix_(ro, co)
        want = block_mean(x[ix], r, c, a[ix])
        z = p.z(view)
        assert np.array_equal(np.isnan(z), np.isnan(want)), f"{view}: masked blocks"
        assert np.isfinite(want).any() and (np.isnan(want).any() or view != "view-raw")
        assert_means(z, want, view)
        plain = block_mean(x[ix], r, c)
        assert not np.allclose(z[np.isfinite(z)], plain[np.isfinite(z)], atol=(x.max() - x.min()) / 255), \
            f"{view}: the means of mixed blocks include the masked entries"
    p.shot("causal-lod")
    # zoom into a folder of the 3-D view: full resolution, masked entries null
    p.after(lambda: p.click_at(*p.pixel("view-org3d", 0.5, 7.5)))
    rows, cols = (np.array(p.js(f"document.getElementById('view-org3d').data[0].{k}")) for k in "yx")
    assert np.array_equal(rows, np.arange(rows[0], rows[-1] + 1)) and len(rows) < n
    ro, co = views["view-org3d"]
    win = np.ix_(np.asarray(ro)[rows[0]:rows[-1]], np.asarray(co)[cols[0]:cols[-1]])
    assert_shows(p.z("view-org3d"), x[win], "zoomed 3-D view", span=np.ptp(x[a]), allowed=a[win])
    assert (~a[win]).any() and a[win].any(), "the zoomed window has masked and allowed entries"
    p.shot("causal-lod-zoomed")
    assert p.errors == []


def test_a_subset_store_is_labelled_by_the_models_layer_and_head_indices(browser, causal_pages, tmp_path):
    """Layers 1, 3 and heads 0, 2 of the model: the grid's axes and hover, the head selector, the
    view titles, the info line, the diffusion map's hover, the notes and Table 1's row (which names
    the model's (layer 3, head 2)) all use the model's indices, never the positions 0, 1."""
    from oattn_lib.explorer import read_meta

    meta = read_meta(causal_pages["full"])
    assert (meta["layers"], meta["heads"], meta["model_layers"]) == ([1, 3], [0, 2], 4)
    p = Page(browser, causal_pages["full"], tmp_path)
    ticks = p.js("['yaxis', 'xaxis'].map((a) => document.getElementById('grid').layout[a].ticktext)")
    assert ticks == [["1", "3"], ["0", "2"]]
    hover = p.js("document.getElementById('grid').data[0].text")
    names = {(0, 0): "layer 1, head 0", (0, 1): "layer 1, head 2", (1, 0): "layer 3, head 0", (1, 1): "layer 3, head 2"}
    for (i, j), want in names.items():
        assert hover[i][j].startswith(want)
    options = p.js("Array.from(document.querySelectorAll('#head option')).map(o => [o.value, o.textContent])")
    assert [(v, t.split(" ◆")[0]) for v, t in options] == [("0", "L1 H0"), ("1", "L1 H2"), ("2", "L3 H0"),
                                                            ("3", "L3 H2")]
    dmap = p.js("document.getElementById('dmap').data[0].text")
    assert [t.split(" ·")[0] for t in dmap] == ["L1 H0", "L1 H2", "L3 H0", "L3 H2"]
    # Table 1's row names the model's layer 3, head 2: a click selects unit 3
    p.after(lambda: p.pg.locator("#table-0 tbody tr").nth(0).click())
    assert p.unit() == 3
    for view in ("view-raw", "view-org3d", "view-org2d", "view-resid"):
        assert "L3 H2" in p.js(f"document.getElementById('{view}').layout.title.text"), view
    assert "(layer 3, head 2)" in p.js("document.getElementById('info').textContent")
    shape = p.js("document.getElementById('grid').layout.shapes[0]")
    assert (round(shape["x0"] + 0.5), round(shape["y0"] + 0.5)) == (1, 1)  # the grid's cell of layer 3, head 2
    text = p.js("document.body.textContent")
    assert "layers 1, 3 of the model's 4 layers" in text
    note = p.js("document.getElementById('resolution').textContent")
    assert set(re.findall(r"L\d+ H\d+", note)) == {"L1 H0", "L1 H2", "L3 H0", "L3 H2"}
    p.shot("subset-labels")
    assert p.errors == []


def test_sample_0_is_encoded_once_where_the_plan_encodes_it_as_its_trial_did(tmp_path, monkeypatch):
    """The plan measures sample 0 by encoding it; where the page shows sample 0 the same way (the
    same level of detail, no head at full resolution) that encoding is the page's, not made
    again (at 1024 tokens it takes as long as reading the sample), and equal to a fresh one."""
    import json

    import oattn_lib.explorer.build as build
    from oattn_lib.explorer.encode import encode_sample
    from oattn_lib.explorer.synthetic import synthetic_model

    b = synthetic_model(tmp_path, "m", "txl", 40, 2, 2, 2, seed=3)["base"]
    calls = []

    def counted(s, orgs, p, i):
        calls.append((s.index, p.side))
        return encode_sample(s, orgs, p, i)

    monkeypatch.setattr(build, "encode_sample", counted)
    args = ("m", "txl", *[[b / f"{d}/sample{i}.zarr" for i in range(2)] for d in ("attention", "organized",
                                                                               "decomposed")], b / "entropy.zarr", [])
    kw = dict(quantity="scores", figure_heads=[[0, 0]], heads_2d=0, questionnaire2d_iters=1, max_side=8,
              data_bytes=10**7)
    pay = build.model_payload(*args, **kw)
    side = pay["meta"]["plan"]["side"]
    assert not pay["meta"]["plan"]["full_mode"] and pay["meta"]["plan"]["full_units"] == {"0": [], "1": []}
    assert calls.count((0, side)) == 1 and calls.count((1, side)) == 1
    # the page's sample 0 is what encoding it for the final plan gives
    measured = build._measured

    def never_reused(*a):
        f = measured(*a)
        f.encoded = lambda p: None
        return f

    monkeypatch.setattr(build, "_measured", never_reused)
    calls.clear()
    fresh = build.model_payload(*args, **kw)
    assert calls.count((0, side)) == 2  # encoded for the plan again
    for p in (pay, fresh):
        p["meta"].pop("build_seconds")
    assert json.dumps(pay, sort_keys=True) == json.dumps(fresh, sort_keys=True)
