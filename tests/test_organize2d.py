"""The organize2d stage: each sample's 2-D organizations of the heads the explorer shows in 2-D,
the figure heads' taken from the decompose stage, the others computed once (docs/method.md §5.3,
§7, §12.1); the explorer reads them."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from oattn_lib import store
from oattn_lib.heads2d import heads_for_2d, organize_head, read_organizations_2d
from oattn_lib.stages.decompose import decompose_samples
from oattn_lib.stages.entropy import entropy
from oattn_lib.stages.organize import organize_samples
from oattn_lib.stages.organize2d import organize2d_samples
from oattn_lib.trees import PartitionTree, from_padded, padded_labels, random_tree

from test_faults import attention_store

FIG = [[0, 1], [-1, -1]]
N_LAYER, N_HEAD, N = 3, 2, 24


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two samples of 3 layers x 2 heads at 24 tokens through organize, decompose, entropy and
    organize2d (4 heads in 2-D: the 2 figure heads and 2 entropy extremes)."""
    root = tmp_path_factory.mktemp("o2d")
    rng = np.random.default_rng(11)
    att = [attention_store(root / f"att{i}.zarr", rng.normal(size=(N_LAYER, N_HEAD, N, N)) * 3, sample=i)
           for i in range(2)]
    org = [root / f"org{i}.zarr" for i in range(2)]
    dec = [root / f"dec{i}.zarr" for i in range(2)]
    o2d = [root / f"o2d{i}.zarr" for i in range(2)]
    organize_samples(att, org, "probs", params={"n_iters": 2})
    decompose_samples(att, org, dec, "probs", figure_heads=FIG, questionnaire2d_iters=3, random_tree_seeds=1)
    entropy(dec, root / "ent.zarr", 20, 20)
    organize2d_samples(att, dec, root / "ent.zarr", o2d, quantity="probs", figure_heads=FIG, heads_2d=4,
                       questionnaire2d_iters=3)
    return {"root": root, "att": att, "org": org, "dec": dec, "o2d": o2d}


def test_the_heads_are_the_figure_heads_then_the_entropy_extremes(run):
    ent = store.read_store(run["root"] / "ent.zarr")
    mean = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(2, -1).mean(0)
    want = heads_for_2d([1, 5], mean, 4)
    assert want[:2] == [1, 5] and len(want) == 4
    for path in run["o2d"]:
        orgs, not_run = read_organizations_2d(path)
        assert list(orgs) == want and not_run is None
        ds = store.read_store(path)
        assert ds["unit2d_layer"].values.tolist() == [u // N_HEAD for u in want]
        assert ds["unit2d_head"].values.tolist() == [u % N_HEAD for u in want]


def test_figure_heads_are_the_decompose_stages_and_the_others_the_questionnaires(run):
    for i in range(2):
        orgs, _ = read_organizations_2d(run["o2d"][i])
        dec = store.read_store(run["dec"][i])
        scores = store.read_store(run["att"][i])["scores"].transpose("layer", "head", "query", "key").values
        for j, u in enumerate([1, 5]):  # the figure heads: decompose's trees, residual and norms
            assert orgs[u].tree_r.order.tolist() == dec["fig_row_order"].values[j].tolist()
            assert orgs[u].tree_c.order.tolist() == dec["fig_col_order"].values[j].tolist()
            np.testing.assert_array_equal(orgs[u].residual, dec["fig_residual"].values[j].astype(np.float64))
            assert orgs[u].relative_residual == dec["fig_rel_residual"].values[j]
        for u in list(orgs)[2:]:  # the others: this sample's own head, organized here
            fresh = organize_head(scores[u // N_HEAD, u % N_HEAD].astype(np.float32), 3)
            np.testing.assert_array_equal(orgs[u].tree_r.labels, fresh.tree_r.labels)
            np.testing.assert_array_equal(orgs[u].tree_c.labels, fresh.tree_c.labels)
            np.testing.assert_allclose(orgs[u].residual, fresh.residual, rtol=1e-6, atol=1e-7)
            assert orgs[u].relative_residual == pytest.approx(fresh.relative_residual, rel=1e-12)


def test_the_stage_organizes_only_the_heads_decompose_did_not(run, tmp_path, caplog):
    import logging

    from oattn_lib.stages.organize2d import organize2d
    with caplog.at_level(logging.INFO, logger="oattn"):
        organize2d(run["att"][0], run["dec"][0], run["root"] / "ent.zarr", tmp_path / "o.zarr", quantity="probs",
                   figure_heads=FIG, heads_2d=4, questionnaire2d_iters=3)
    assert "4 heads (2 computed, 2 the decompose stage's figure heads)" in caplog.text


def test_a_page_from_the_stores_is_the_page_made_without_them(run, tmp_path):
    """The explorer reads the stores, or (a notebook, no stores) makes the organizations by the
    same code: the two pages' data are the same."""
    from oattn_lib.explorer.build import model_payload
    common = dict(quantity="probs", figure_heads=FIG, heads_2d=4, questionnaire2d_iters=3, max_side=8,
                  data_bytes=10**7)
    args = ("toy", "txl", run["att"], run["org"], run["dec"], run["root"] / "ent.zarr", [])
    a = model_payload(*args, organized2d_stores=run["o2d"], **common)
    b = model_payload(*args, **common)
    for p in (a, b):
        p["meta"].pop("build_seconds")
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    assert a["meta"]["units_2d"] == list(read_organizations_2d(run["o2d"][0])[0])
    # a store of other heads (a stale one: 3 heads in 2-D, not 4) is named, not shown
    from oattn_lib.stages.organize2d import organize2d
    stale = tmp_path / "o2d1.zarr"
    organize2d(run["att"][1], run["dec"][1], run["root"] / "ent.zarr", stale, quantity="probs", figure_heads=FIG,
               heads_2d=3, questionnaire2d_iters=3)
    with pytest.raises(ValueError, match=r"o2d1\.zarr: organizes heads .* the store is stale"):
        model_payload(*args, organized2d_stores=[run["o2d"][0], stale], **common)


def test_padded_labels_round_trip_trees_of_different_depths():
    rng = np.random.default_rng(2)
    trees = [random_tree(9, rng), PartitionTree(np.stack([np.zeros(9, np.int64), np.arange(9)])), random_tree(9, rng)]
    pad = padded_labels(trees, 9)
    assert pad.shape == (3, max(t.n_levels for t in trees), 9) and (pad[1, 2:] == -1).all()
    for t, row in zip(trees, pad):
        np.testing.assert_array_equal(from_padded(row).labels, t.labels)
    assert padded_labels([], 5).shape == (0, 1, 5)
    with pytest.raises(ValueError, match="a tree of 9 items among trees of 8"):
        padded_labels(trees, 8)


def test_a_count_that_differs_names_the_stage_and_every_count(tmp_path):
    from oattn_lib.stages.decompose import decompose_samples as dec
    with pytest.raises(ValueError, match=r"organize2d: 2 attention stores, 1 decomposed stores and 2 outputs; "
                                         r"expected one of each per sample"):
        organize2d_samples(["a", "b"], ["c"], "e", ["o", "p"], quantity="probs", figure_heads=FIG, heads_2d=1,
                           questionnaire2d_iters=1)
    with pytest.raises(ValueError, match=r"decompose: 1 attention stores, 1 organized stores and 2 outputs"):
        dec(["a"], ["b"], ["o", "p"], "probs", figure_heads=FIG, questionnaire2d_iters=1, random_tree_seeds=1)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("max_side", [8, 64])
def test_a_page_from_per_sample_jobs_is_the_page_made_in_one_process(run, tmp_path, max_side):
    """A model of one job per sample: its page planned (explorer_plan), its samples encoded by jobs
    of their own (explorer_samples, one sample each here), assembled by the page job; the same data
    as the page made in one process, at the level of detail (max_side 8 < 24 tokens) and at full
    resolution."""
    from oattn_lib.explorer.build import model_payload
    from oattn_lib.stages.explorer import explorer
    from oattn_lib.plan import explorer_parts
    from oattn_lib.stages.explorer_samples import explorer_plan, explorer_samples

    common = dict(quantity="probs", figure_heads=FIG, heads_2d=4, questionnaire2d_iters=3, max_side=max_side)
    t1, t2 = tmp_path / "table1.csv", tmp_path / "table2.csv"
    t1.write_text("layer,head,top\n0,1,2\n")
    t2.write_text("sample,network_entropy\n0,1.5\n1,1.25\n")
    whole = model_payload("toy", "txl", run["att"], run["org"], run["dec"], run["root"] / "ent.zarr", [],
                          organized2d_stores=run["o2d"], data_bytes=10**7, **common)
    plan_json = tmp_path / "plan.json"
    pp = explorer_plan("toy", run["att"], run["org"][0], run["dec"][0], run["root"] / "ent.zarr", run["o2d"][0],
                       plan_json, data_mb=10.0, **common)
    parts = explorer_parts(2, 10)
    assert parts == [[0], [1]]
    files = [tmp_path / f"part{k}.json.gz" for k in range(2)]
    # the parts in reverse order: each job reads only its own samples' stores and the plan
    for k in (1, 0):
        pick = lambda key: [run[key][i] for i in parts[k]]  # noqa: E731
        explorer_samples("toy", parts[k], plan_json, pick("att"), pick("org"), pick("dec"), pick("o2d"), files[k],
                         quantity="probs")
    assert pp["plan"]["full_mode"] == (max_side >= 24)
    pages = {}
    for name, kw in (("jobs", {"page_plan": plan_json, "page_samples": files}),
                     ("stores", {"organized2d_stores": run["o2d"]})):
        out = tmp_path / f"{name}.html"
        explorer("toy", "txl", run["att"] if name == "stores" else [], run["org"] if name == "stores" else [],
                 run["dec"] if name == "stores" else [], run["root"] / "ent.zarr", t1, t2, out,
                 data_mb=10.0, **common, **kw)
        pages[name] = out.read_text()
    from oattn_lib.explorer.page import read_meta

    metas = {k: read_meta(tmp_path / f"{k}.html") for k in pages}
    for m in metas.values():
        m.pop("build_seconds")
    assert metas["jobs"] == metas["stores"]
    assert metas["jobs"]["units_2d"] == whole["meta"]["units_2d"]
    # the same page but for the build times it states
    strip = lambda t: re.sub(r"(?i)built in [\d.]+ s \([\d.]+ s", "", re.sub(r'"build_seconds":\{[^}]*\}', "", t))  # noqa: E731
    assert strip(pages["jobs"]) == strip(pages["stores"])
    # the page job refuses a plan made for other settings, and a file that is not an encoded sample
    with pytest.raises(ValueError, match=r"plan\.json: planned for heads_2d=4.*stale"):
        explorer("toy", "txl", [], [], [], run["root"] / "ent.zarr", t1, t2, tmp_path / "x.html",
                 data_mb=10.0, page_plan=plan_json, page_samples=files, **{**common, "heads_2d": 3})
    files[1].write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"part1\.json\.gz: not a part of an explorer page"):
        explorer("toy", "txl", [], [], [], run["root"] / "ent.zarr", t1, t2, tmp_path / "x.html",
                 data_mb=10.0, page_plan=plan_json, page_samples=files, **common)
    assert not (tmp_path / "x.html").exists()


def test_explorer_parts_are_consecutive_samples_in_at_most_the_jobs_asked():
    from oattn_lib.plan import explorer_parts

    assert explorer_parts(10, 10) == [[i] for i in range(10)]
    assert explorer_parts(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert explorer_parts(3, 10) == [[0], [1], [2]]
    big = explorer_parts(10_000, 10)
    assert len(big) == 10 and sum(big, []) == list(range(10_000))
    with pytest.raises(ValueError, match="max_jobs"):
        explorer_parts(5, 0)


def test_a_page_of_the_first_samples_shows_theirs_and_says_how_many_of_all(run, tmp_path):
    """explorer.max_samples = 1 of 2: the page's data are sample 0's (its encoding, its row of
    every metric), the same by the plan-and-parts jobs as in one process; the page says "the
    first 1 of 2 samples"; stores for another count, or a plan for another max_samples, are
    refused."""
    from oattn_lib.explorer.page import read_meta
    from oattn_lib.stages.explorer import explorer
    from oattn_lib.stages.explorer_samples import explorer_plan, explorer_samples

    ent = store.read_store(run["root"] / "ent.zarr")
    first = ent["head_entropy"].isel(sample=0).transpose("layer", "head").values.reshape(-1)
    assert not np.allclose(first, ent["head_entropy"].isel(sample=1).transpose("layer", "head").values.reshape(-1))
    common = dict(quantity="probs", figure_heads=FIG, heads_2d=4, questionnaire2d_iters=3, max_side=64)
    t1, t2 = tmp_path / "table1.csv", tmp_path / "table2.csv"
    t1.write_text("layer,head,top\n0,1,2\n")
    t2.write_text("sample,network_entropy\n0,1.5\n1,1.25\n")
    plan_json, part = tmp_path / "plan.json", tmp_path / "part0.json.gz"
    pp = explorer_plan("toy", run["att"][:1], run["org"][0], run["dec"][0], run["root"] / "ent.zarr", run["o2d"][0],
                       plan_json, data_mb=10.0, max_samples=1, **common)
    assert (pp["n_samples"], pp["n_samples_total"], len(pp["lengths"])) == (1, 2, 1)
    explorer_samples("toy", [0], plan_json, run["att"][:1], run["org"][:1], run["dec"][:1], run["o2d"][:1], part,
                     quantity="probs")
    metas = {}
    for name, kw in (("jobs", {"page_plan": plan_json, "page_samples": [part]}),
                     ("stores", {"organized2d_stores": run["o2d"][:1]})):
        out = tmp_path / f"{name}.html"
        stores = {k: run[k][:1] if name == "stores" else [] for k in ("att", "org", "dec")}
        explorer("toy", "txl", stores["att"], stores["org"], stores["dec"], run["root"] / "ent.zarr", t1, t2, out,
                 data_mb=10.0, max_samples=1, **common, **kw)
        assert "the first 1 of 2 samples" in out.read_text()
        metas[name] = read_meta(out)
        metas[name].pop("build_seconds")
    assert metas["jobs"] == metas["stores"]
    assert (metas["jobs"]["n_samples"], metas["jobs"]["n_samples_total"]) == (1, 2)
    text = (tmp_path / "jobs.html").read_text()
    start = text.index("<script id='oattn-data' type='application/json'>")
    data = json.loads(text[text.index(">", start) + 1:text.index("</script>", start)])
    rows = data["metrics"]["Haar entropy (coarsest l1)"]
    assert len(rows) == 1 and len(data["samples"]) == 1 and data["samples"][0]["sample"] == 0
    assert np.allclose(rows[0], first, rtol=1e-3)
    # two stores for a page of one sample; a plan of one sample for a page of both
    with pytest.raises(ValueError, match=r"ent\.zarr: 2 samples, of which the page shows 1 \(explorer\.max_samples 1\)"
                                         r"; the explorer was given 2"):
        explorer("toy", "txl", run["att"], run["org"], run["dec"], run["root"] / "ent.zarr", t1, t2,
                 tmp_path / "x.html", data_mb=10.0, max_samples=1, organized2d_stores=run["o2d"], **common)
    with pytest.raises(ValueError, match=r"plan\.json: .*1 samples shown.*max_samples=5: the plan is stale"):
        explorer("toy", "txl", [], [], [], run["root"] / "ent.zarr", t1, t2, tmp_path / "x.html",
                 data_mb=10.0, max_samples=5, page_plan=plan_json, page_samples=[part], **common)
    assert not (tmp_path / "x.html").exists()
