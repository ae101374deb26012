"""The Python API (`oattn_lib.api`): its example runs and prints what the stages compute, its
results equal the stages' and the engine's on the same tensor, labels follow the input's
coordinates, and bad input is an error naming the argument."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import oattn_lib
from oattn_lib.config import SCHEMA
from oattn_lib.entropy import head_entropy, head_sparsity, network_entropy, network_sparsity
from oattn_lib.paraproduct import paraproduct
from oattn_lib.questionnaire import Organization
from oattn_lib.trees import PartitionTree

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "api_tour.py"
PROMPTS = ["The cat sat on the mat.", "Organized attention finds trees in the queries, the keys and the heads.",
           "Attention is all you need."]  # the example's


def schema_defaults(section: str) -> dict:
    props = yaml.safe_load(SCHEMA.read_text())["properties"][section]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


@pytest.fixture(scope="module")
def minilm():
    from oattn_lib.models.hf_recording import load_hf

    return load_hf("minilm")


@pytest.fixture(scope="module")
def subset(minilm):
    """Three prompts of different lengths, layers 1 and 3, heads 0, 2 and 5 only: labels that are not
    positions."""
    return oattn_lib.extract(minilm, ["Trees of queries.", "A somewhat longer prompt, with a comma.", "Hi."],
                             layers=[3, 1], heads=[5, 0, 2])


@pytest.fixture(scope="module")
def organized(subset):
    return oattn_lib.organize(subset[1], "probs", n_iters=2, device="cpu")


def network(ds: xr.Dataset, quantity="probs") -> np.ndarray:
    """(query, key, unit) float32, units layer-major: the engine's layout."""
    return np.ascontiguousarray(ds[quantity].stack(unit=("layer", "head")).transpose("query", "key", "unit").values)


def organization_of(org: xr.Dataset) -> Organization:
    return Organization(*(PartitionTree(org[f"tree_{a}"].values) for a in "qkh"),
                        *(org[f"affinity_{a}"].values.astype(np.float64) for a in "qkh"))


# -- the example -----------------------------------------------------------------------------------
def test_the_example_runs_and_prints_what_the_stages_compute(tmp_path, minilm):
    from oattn_lib.explorer import read_meta
    from oattn_lib.stages.decompose import decompose
    from oattn_lib.stages.entropy import entropy
    from oattn_lib.stages.organize import organize
    from oattn_lib.store import read_store, write_store

    page = tmp_path / "tour" / "page.html"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    proc = subprocess.run([sys.executable, str(EXAMPLE), str(page)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = dict(re.findall(r"^(\w+(?:\[\d+\])?) = (.+)$", proc.stdout, flags=re.MULTILINE))

    tok = minilm[1]
    assert [int(printed[f"tokens[{i}]"]) for i in range(3)] == [len(tok(p)["input_ids"]) for p in PROMPTS]
    # the same sample through the workflow's stages, from stores
    sample = oattn_lib.extract(minilm, PROMPTS[1:2])[0]
    att = write_store(sample.drop_vars("token_text"), tmp_path / "attention.zarr") / "zarr.json"
    org, dec, ent = (tmp_path / f"{n}.zarr" / "zarr.json" for n in ("organized", "decomposed", "entropy"))
    organize(att, org, "probs", params=schema_defaults("organize"), device="cpu")
    layer, head = int(printed["lowest_entropy_layer"]), int(printed["lowest_entropy_head"])
    decompose(att, org, dec, "probs", figure_heads=[[layer, head]],
              questionnaire2d_iters=schema_defaults("decompose")["questionnaire2d_iters"], random_tree_seeds=1)
    k = schema_defaults("entropy")
    entropy([dec], ent, k["head_top_k"], k["network_top_k"])
    e, d = read_store(ent), read_store(dec)
    got = e["head_entropy"].isel(sample=0)
    assert float(got.sel(layer=layer, head=head)) == float(got.min())  # the example's lowest head is the stage's
    assert float(printed["lowest_head_entropy"]) == pytest.approx(float(got.min()), rel=1e-9)
    assert float(printed["network_entropy"]) == pytest.approx(float(e["network_entropy"][0]), rel=1e-9)
    assert float(printed["network_sparsity"]) == pytest.approx(float(e["network_sparsity"][0]), rel=1e-9)
    assert float(printed["relative_residual"]) == pytest.approx(float(d["fig_rel_residual"][0]), rel=1e-9)
    assert float(printed["relative_residual_original"]) == pytest.approx(
        float(d["fig_rel_residual_unorganized"][0]), rel=1e-9)
    # the page: the sample's tokens and heads
    meta = read_meta(Path(printed["page"]))
    assert Path(printed["page"]) == page and meta["n_query"] == int(printed["tokens[1]"])
    assert (meta["layers"], meta["heads"], meta["quantity"]) == (list(range(6)), list(range(12)), "probs")


# -- extraction ----------------------------------------------------------------------------------
def test_prompts_of_different_lengths_keep_their_own_tokens(subset, minilm):
    from oattn_lib.models.hf_recording import hf_attention

    net, tok = minilm
    lengths = [d.sizes["query"] for d in subset]
    assert lengths == [len(tok(p)["input_ids"]) for p in ("Trees of queries.", "A somewhat longer prompt, with a "
                                                          "comma.", "Hi.")]
    assert len(set(lengths)) == 3
    for ds in subset:
        assert ds.sizes["key"] == ds.sizes["query"] and bool(ds["allowed"].all())  # unpadded: nothing masked
        assert ds["layer"].values.tolist() == [1, 3] and ds["head"].values.tolist() == [0, 2, 5]
        assert list(ds["token_text"].values) == tok.convert_ids_to_tokens(ds["token"].values.tolist())
        # the recording attention of models.hf_recording, by its other entry point
        ref = hf_attention(net, tok, [ds.attrs["prompt"]])
        for q in ("scores", "probs"):
            want = ref[q][0].numpy()[np.ix_([1, 3], [0, 2, 5])]
            np.testing.assert_array_equal(ds[q].transpose("layer", "head", "query", "key").values, want)


def test_a_chat_template_wraps_each_prompt(minilm):
    net, tok = minilm
    with pytest.raises(ValueError, match="^chat: .*no chat template"):
        oattn_lib.extract(minilm, ["hello"], chat=True)
    tok.chat_template = "{% for m in messages %}[CLS] user: {{ m['content'] }} [SEP]{% endfor %}" \
                        "{% if add_generation_prompt %} bot:{% endif %}"
    try:
        (ds,) = oattn_lib.extract(minilm, ["hello there"], chat=True, layers=[0])
    finally:
        tok.chat_template = None
    assert ds.attrs["text"] == "[CLS] user: hello there [SEP] bot:"
    assert ds["token"].values.tolist() == tok(ds.attrs["text"], add_special_tokens=False)["input_ids"]


# -- organize ------------------------------------------------------------------------------------
def test_organize_is_the_organize_stage(tmp_path, subset, organized):
    from oattn_lib.stages.organize import organize
    from oattn_lib.store import read_store, write_store

    att = write_store(subset[1].drop_vars("token_text"), tmp_path / "a.zarr") / "zarr.json"
    out = tmp_path / "o.zarr" / "zarr.json"
    organize(att, out, "probs", params={**schema_defaults("organize"), "n_iters": 2}, device="cpu")
    stage = read_store(out)
    for v in ("tree_q", "tree_k", "tree_h", "affinity_q", "affinity_k", "affinity_h"):
        np.testing.assert_array_equal(organized[v].values, stage[v].values, err_msg=v)
    for c in ("unit_layer", "unit_head", "query", "key"):
        np.testing.assert_array_equal(organized[c].values, stage[c].values, err_msg=c)
    assert organized["unit_layer"].values.tolist() == [1, 1, 1, 3, 3, 3]
    assert organized["unit_head"].values.tolist() == [0, 2, 5] * 2
    assert organized.attrs["quantity"] == "probs"


def test_organize_reads_dims_by_name(subset, organized):
    da = subset[1]["probs"]
    again = oattn_lib.organize(da.transpose("key", "head", "query", "layer"), n_iters=2, device="cpu")
    xr.testing.assert_identical(again.drop_attrs(), organized.drop_attrs())
    flat = da.stack(unit=("layer", "head")).transpose("unit", "key", "query")
    flat = flat.drop_vars(["unit", "layer", "head"]).assign_coords(
        unit_layer=("unit", [1, 1, 1, 3, 3, 3]), unit_head=("unit", [0, 2, 5] * 2))
    np.testing.assert_array_equal(oattn_lib.organize(flat, n_iters=2, device="cpu")["tree_h"].values,
                                  organized["tree_h"].values)


# -- entropies -----------------------------------------------------------------------------------
def test_entropies_are_the_engines_on_the_query_key_head_tensor(subset, organized):
    ds = subset[1]
    got = oattn_lib.entropies(ds, organized)
    x, org = network(ds), organization_of(organized)
    k = min(schema_defaults("entropy")["head_top_k"], x.shape[0] * x.shape[1])
    assert got.attrs["head_top_k"] == k and got.attrs["quantity"] == "probs"
    want = {"head_entropy": head_entropy(x, org, k), "head_sparsity": head_sparsity(x, org)}
    # unit u of the engine's tensor is (layer, head) = units[u]: each value sits at its own labels
    units = [(1, 0), (1, 2), (1, 5), (3, 0), (3, 2), (3, 5)]
    assert got["head_entropy"].dims == ("layer", "head")
    assert got["layer"].values.tolist() == [1, 3] and got["head"].values.tolist() == [0, 2, 5]
    for name, values in want.items():
        for u, (layer, head) in enumerate(units):
            assert float(got[name].sel(layer=layer, head=head)) == pytest.approx(values[u], rel=1e-12), name
    k3 = min(schema_defaults("entropy")["network_top_k"], x.size)
    assert float(got["network_entropy"]) == pytest.approx(network_entropy(x, org, k3), rel=1e-12)
    assert float(got["network_sparsity"]) == pytest.approx(network_sparsity(x, org), rel=1e-12)


def test_entropies_honour_dims_and_detect_a_mismatch(subset, organized):
    ds = subset[1]
    got = oattn_lib.entropies(ds, organized)
    # the same labelled array in another dim order: the same numbers
    same = oattn_lib.entropies(ds["probs"].transpose("head", "key", "layer", "query"), organized)
    xr.testing.assert_allclose(same, got, rtol=1e-12)
    # query and key swapped (a transposed head labelled as the original): other numbers
    swapped = ds["probs"].rename(query="key", key="query")
    other = oattn_lib.entropies(swapped, organized)
    assert not np.allclose(other["head_entropy"].values, got["head_entropy"].values)
    # heads in another order than the organization's units: detected
    with pytest.raises(ValueError, match="^organization: .*unit_head"):
        oattn_lib.entropies(ds.isel(head=[2, 0, 1]), organized)
    # another sample's organization: detected
    with pytest.raises(ValueError, match="^organization: "):
        oattn_lib.entropies(subset[0], organized)


# -- the paraproduct ------------------------------------------------------------------------------
def test_paraproduct_residual_with_the_networks_trees(subset, organized):
    ds = subset[1]
    got = oattn_lib.paraproduct_residual(ds, 3, 2, organization=organized)
    g = ds["scores"].sel(layer=3, head=2).transpose("query", "key").values.astype(np.float64)
    org = organization_of(organized)
    want = paraproduct(g, row_order=org.tree_q.order, col_order=org.tree_k.order)
    assert float(got["relative_residual"]) == want.relative_residual
    assert float(got["relative_residual_original"]) == paraproduct(g).relative_residual
    np.testing.assert_array_equal(got["residual"].values, want.residual)
    # labelled: each entry keeps its own (query, key) position
    assert got["query"].values.tolist() == org.tree_q.order.tolist()
    exact = got["exact"].sel(query=0, key=1)
    assert float(exact) == pytest.approx(float(ds["probs"].sel(layer=3, head=2, query=0, key=1)), rel=1e-5)
    hot = oattn_lib.paraproduct_residual(ds, 3, 2, organization=organized, tau=2.0)
    assert float(hot["relative_residual"]) == paraproduct(2.0 * g, row_order=org.tree_q.order,
                                                          col_order=org.tree_k.order).relative_residual


# -- bad input -----------------------------------------------------------------------------------
def test_stability_replicates_each_sample_with_the_organizations_own_parameters(subset, organized):
    from oattn_lib.stability import stability_summary

    ds = subset[1]
    stab = oattn_lib.stability_replicates(ds, organized, replicates=2, perturbations=["ulp", "relabel", "sibling"],
                               paraproduct=False, device="cpu")
    assert stab.sizes["sample"] == 1 and list(stab["perturbation"].values) == ["none", "ulp", "ulp", "relabel",
                                                                              "relabel", "sibling", "sibling"]
    # the replicates organize again as the organization was organized (n_iters=2, not the default)
    assert json.loads(stab.attrs["config"])["organize"]["n_iters"] == 2
    # replicate 0 is the analysis of `entropies` on the same organization, head by head
    ent = oattn_lib.entropies(ds, organized)
    ref = stab.isel(sample=0, replicate=0)
    by_unit = ent["head_entropy"].sel(layer=xr.DataArray(ref["unit_layer"].values, dims="unit"),
                                      head=xr.DataArray(ref["unit_head"].values, dims="unit")).values
    np.testing.assert_allclose(ref["head_entropy"].values, by_unit, rtol=1e-9)
    np.testing.assert_allclose(float(ref["network_entropy"]), float(ent["network_entropy"]), rtol=1e-9)
    # renaming the items organizes again to the same trees: the numbers are the reference's
    rel = stab.isel(sample=0, replicate=[3, 4])
    assert rel["same_tree_q"].all() and rel["same_tree_k"].all() and rel["same_tree_h"].all()
    np.testing.assert_allclose(rel["head_entropy"].values, np.broadcast_to(ref["head_entropy"].values, (2, 6)),
                               rtol=1e-9)
    table = stability_summary(stab)
    assert set(table["perturbation"]) == {"ulp", "relabel", "sibling"}
    ulp = table[(table["measure"] == "network_entropy") & (table["perturbation"] == "ulp")]
    assert float(ulp["spread_max"].iloc[0]) < 1e-4


def test_bad_input_is_an_error_naming_the_argument(subset, organized, minilm, tmp_path):
    ds = subset[1]
    nan = ds.copy(deep=True)
    nan["probs"][0, 1, 2, 3] = np.nan
    cases = [
        ("prompts", lambda: oattn_lib.extract(minilm, "one prompt")),
        ("prompts", lambda: oattn_lib.extract(minilm, ["ok", 3])),
        ("layers", lambda: oattn_lib.extract(minilm, ["ok"], layers=[6])),
        ("heads", lambda: oattn_lib.extract(minilm, ["ok"], heads=[-1])),
        ("max_length", lambda: oattn_lib.extract(minilm, ["ok"], max_length=0)),
        ("model", lambda: oattn_lib.extract(42, ["ok"])),
        ("attention", lambda: oattn_lib.organize(ds["probs"].isel(layer=0))),
        ("attention", lambda: oattn_lib.organize(nan)),
        ("attention", lambda: oattn_lib.organize(ds.values)),
        ("quantity", lambda: oattn_lib.organize(ds, "logits")),
        ("n_iters", lambda: oattn_lib.organize(ds, n_iters=0)),
        ("params", lambda: oattn_lib.organize(ds, alhpa=1.0)),
        ("head_top_k", lambda: oattn_lib.entropies(ds, organized, head_top_k=0)),
        ("organization", lambda: oattn_lib.entropies(ds, {"tree_q": 1})),
        ("layer", lambda: oattn_lib.paraproduct_residual(ds, 2, 0)),
        ("head", lambda: oattn_lib.paraproduct_residual(ds, 1, 1)),
        ("tau", lambda: oattn_lib.paraproduct_residual(ds, 1, 0, tau=0.0)),
        ("attention", lambda: oattn_lib.explorer_page(subset[:2], [organized, organized], tmp_path / "p.html")),
        ("perturbations", lambda: oattn_lib.stability_replicates(ds, organized, perturbations=["noise"])),
        ("paraproduct", lambda: oattn_lib.stability_replicates(ds.drop_vars("scores"), organized, paraproduct=True)),
        ("replicates", lambda: oattn_lib.stability_replicates(ds, organized, replicates=0)),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=f"^{name}: "):
            call()


# -- the package ---------------------------------------------------------------------------------
def test_the_api_is_exported_lazily():
    code = ("import sys, json, oattn_lib; before = 'torch' in sys.modules; "
            "from oattn_lib import organize, entropies; "
            "print(json.dumps([before, sorted(oattn_lib.__all__), 'extract' in dir(oattn_lib), organize.__module__]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, names, listed, module = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before is False and listed and module == "oattn_lib.api"
    assert names == sorted(["extract", "organize", "entropies", "paraproduct_residual", "stability_replicates",
                            "explorer_page", "analyze", "Analysis", "compare", "Comparison", "from_transformer_lens",
                            "from_nnsight"])
    for name in names:
        obj = getattr(oattn_lib, name)
        doc = obj.__doc__
        if isinstance(obj, type):  # a result class: what it holds
            assert "Attributes\n    ----------" in doc, name
        else:
            assert "Parameters\n    ----------" in doc and "Returns\n    -------" in doc, name


def test_a_causal_models_masked_scores_follow_the_workflows_rule(tmp_path):
    """Scores of a causal model, organized by the API and by the organize stage on the same store:
    by default both set the masked entries per row to the mean of the allowed ones (the
    workflow's extract.masked), `masked="keep"` analyses them as computed in both, and the two
    rules give different trees' affinities; entropies follow the organization's rule."""
    from oattn_lib.stages.organize import organize
    from oattn_lib.store import read_store, write_store

    rng = np.random.default_rng(3)
    n = 10
    scores = rng.normal(size=(2, 3, n, n)).astype(np.float32)
    allowed = np.tril(np.ones((n, n), bool))
    z = np.where(allowed, scores, -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ds = xr.Dataset({"scores": (("layer", "head", "query", "key"), scores),
                     "probs": (("layer", "head", "query", "key"), p.astype(np.float32)),
                     "allowed": (("layer", "query", "key"), np.broadcast_to(allowed, (2, n, n)).copy())},
                    coords={"layer": [0, 1], "head": [0, 1, 2], "query": np.arange(n), "key": np.arange(n)})
    att = write_store(ds, tmp_path / "a.zarr") / "zarr.json"
    params = {**schema_defaults("organize"), "n_iters": 1}
    got = {}
    for rule in ("row_mean", "keep"):
        out = tmp_path / f"{rule}.zarr" / "zarr.json"
        organize(att, out, "scores", params=params, device="cpu", masked=rule)
        stage = read_store(out)
        api = oattn_lib.organize(ds, "scores", n_iters=1, device="cpu",
                                 **({} if rule == "row_mean" else {"masked": "keep"}))
        for v in ("tree_q", "tree_k", "tree_h", "affinity_q", "affinity_k", "affinity_h"):
            np.testing.assert_array_equal(api[v].values, stage[v].values, err_msg=(rule, v))
        got[rule] = api
    assert not np.array_equal(got["row_mean"]["affinity_q"].values, got["keep"]["affinity_q"].values)
    # the entropies of each organization read the tensor under its own rule
    kept = oattn_lib.entropies(ds, got["keep"], quantity="scores")
    assert kept["head_entropy"].values.tolist() == oattn_lib.entropies(ds, got["keep"], quantity="scores",
                                                                      masked="keep")["head_entropy"].values.tolist()
    assert not np.allclose(kept["head_entropy"].values,
                           oattn_lib.entropies(ds, got["keep"], quantity="scores", masked="row_mean")["head_entropy"].values)
