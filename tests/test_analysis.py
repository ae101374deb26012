"""`oattn_lib.analyze`: the workflow's numbers from one call in a notebook. Given the tiny run's
attention, it gives the run's own heads tables, Table 1 and claims; on a user's prompts of
different lengths it draws a head in the network's organized order, writes the explorer page,
shows progress only where asked, and refuses bad settings by name before any work."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import oattn_lib
from oattn_lib.config import ConfigError
from oattn_lib.stages.summary import PROMPT_KEYS
from oattn_lib.trees import PartitionTree
from wfutil import TINY

PROMPTS = ["The cat sat on the mat.", "Organized attention finds trees in the queries, the keys and the heads.",
           "Attention is all you need."]
FAST = {"organize": {"n_iters": 1}, "decompose": {"questionnaire2d_iters": 2, "random_tree_seeds": 1},
        "claims": {"bootstrap": 200, "permutations": 199, "null_draws": 19}, "progress": False}


@pytest.fixture(scope="module")
def minilm():
    from oattn_lib.models.hf_recording import load_hf

    return load_hf("minilm")


@pytest.fixture(scope="module")
def analysis(minilm):
    return oattn_lib.analyze(minilm, PROMPTS, **FAST)


@pytest.mark.workflow
def test_the_tiny_runs_attention_gives_the_runs_own_tables(clean_run):
    """lm of the tiny run (MiniLM, 2 samples, probabilities, stability replicates): analyze on its
    attention stores, with its settings, equals the heads tables, Table 1 and the claims' effects
    the workflow wrote. The claims' corrected p-values differ: the workflow corrects over every
    model's rows."""
    res = clean_run / "results"
    model = next(m for m in TINY["models"] if m["name"] == "lm")
    samples = [xr.open_zarr(res / "lm" / "attention" / f"sample{i}.zarr", consolidated=False).load()
               for i in range(model["extract"]["n_samples"])]
    a = oattn_lib.analyze(samples, name="lm", organize=TINY["organize"], decompose=TINY["decompose"],
                          entropy=TINY["entropy"], claims=TINY["claims"], stability=model["stability"],
                          progress=False)
    rows = pd.read_parquet(res / "lm" / "heads.parquet")
    summary = pd.read_parquet(res / "lm" / "heads_summary.parquet")
    assert len(rows) == 2 * 72 and rows["paraproduct_residual"].notna().sum() == 2 * 2
    # floats within what a different torch thread count can move; ranks, sets and counts exactly
    pd.testing.assert_frame_equal(a.heads, rows, rtol=1e-6)
    pd.testing.assert_frame_equal(a.head_summary, summary, rtol=1e-6)
    assert {"entropy_replicates_low", "bottom_count_boot_high"} <= set(a.head_summary.columns)
    pd.testing.assert_frame_equal(a.table1, pd.read_csv(res / "lm" / "tables" / "table1.csv"), rtol=1e-6)
    run = pd.read_csv(res / "claims.csv").fillna({"baseline": ""})
    run = run[(run["model"] == "lm") & run["key"].isin(PROMPT_KEYS)].set_index(["key", "baseline"])
    mine = a.claims.set_index(["key", "baseline"])
    assert set(mine.index) == set(run.index) and set(mine.index.get_level_values(0)) == set(PROMPT_KEYS)
    for col in ("effect", "ci_low", "ci_high", "p"):
        np.testing.assert_allclose(mine.loc[run.index, col].to_numpy(float), run[col].to_numpy(float), rtol=1e-6)
    assert (mine.loc[run.index, "p_adjusted"].fillna(0) <= run["p_adjusted"].fillna(0) + 1e-12).all()


def test_a_head_is_drawn_in_the_networks_organized_order(analysis):
    """The middle panel is the head with its rows and columns in the query and key trees' leaf
    orders (a swapped tree or an unpermuted head fails), labelled with the tokens in that order."""
    a = analysis
    fig = a.show(2, 5, prompt=1)
    org = a.organization(1)
    oq, ok = PartitionTree(org["tree_q"].values).order, PartitionTree(org["tree_k"].values).order
    assert not np.array_equal(oq, ok)
    head = a.attention[1]["probs"].sel(layer=2, head=5).values
    raw_panel, organized_panel = (np.asarray(ax.images[0].get_array()) for ax in fig.axes[:2])
    np.testing.assert_array_equal(raw_panel, head)
    np.testing.assert_array_equal(organized_panel, head[np.ix_(oq, ok)])
    tokens = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    from oattn_lib.explorer.collect import shown_tokens
    shown = shown_tokens([str(t) for t in a.attention[1]["token_text"].values])
    assert tokens == [shown[i] for i in oq]
    assert "paraproduct residual" in fig.axes[2].get_title()
    with pytest.raises(ValueError, match="layer: 9 is not one of"):
        a.show(9, 0)
    with pytest.raises(ValueError, match="prompt: expected a sample index in 0..2"):
        a.show(0, 0, prompt=3)


def test_prompts_of_different_lengths_share_one_page_and_table(analysis, tmp_path):
    a = analysis
    lengths = [s.sizes["query"] for s in a.attention]
    assert len(set(lengths)) == 3
    assert sorted(a.heads["sample"].unique()) == [0, 1, 2] and len(a.heads) == 3 * 72
    page = a.page(tmp_path / "page.html").read_text()
    assert "Samples of their own lengths" in page and all(f"{n} × {n}" in page for n in lengths)
    # the summary's lowest head is the one whose mean rank is lowest
    s = a.head_summary
    assert s["rank_mean"].is_monotonic_increasing
    assert a.heads.groupby(["layer", "head"])["entropy_rank"].mean().min() == s["rank_mean"].iloc[0]
    html = a._repr_html_()
    assert f"<td>{s['layer'].iloc[0]}</td>" in html and "Table 2" in html
    assert set(a.claims["key"]) <= set(PROMPT_KEYS) and a.claims["verdict"].notna().all()


def test_progress_shows_only_where_asked(minilm, capfd):
    oattn_lib.analyze(minilm, PROMPTS[:2], **FAST)
    assert "organize" not in capfd.readouterr().err
    oattn_lib.analyze(minilm, PROMPTS[:2], **{**FAST, "progress": True})
    err = capfd.readouterr().err
    assert "extract" in err and "organize" in err and "decompose" in err


def test_bad_settings_are_refused_by_name_before_any_work(minilm, monkeypatch):
    import oattn_lib.api as api

    def no_model_runs(*args, **kwargs):
        raise AssertionError("the model ran")

    monkeypatch.setattr(api, "extract", no_model_runs)
    with pytest.raises(ConfigError, match=r"organize: .*'n_iter' was unexpected"):
        oattn_lib.analyze(minilm, PROMPTS, organize={"n_iter": 2})
    with pytest.raises(ConfigError, match=r"entropy.fraction: 2"):
        oattn_lib.analyze(minilm, PROMPTS, entropy={"fraction": 2})
    with pytest.raises(ConfigError, match=r"stability.perturbations"):
        oattn_lib.analyze(minilm, PROMPTS, stability={"perturbations": ["shuffle"]})
    with pytest.raises(ValueError, match="wrap a single prompt in a list"):
        oattn_lib.analyze(minilm, "one prompt")
    ds = xr.Dataset({"probs": (("layer", "head", "query", "key"), np.zeros((1, 2, 3, 3)))})
    with pytest.raises(ValueError, match="prompts: attention was given already extracted"):
        oattn_lib.analyze([ds], PROMPTS)
    with pytest.raises(ValueError, match="quantity: the samples hold no 'scores'"):
        oattn_lib.analyze([ds], quantity="scores")


def test_the_settings_are_recorded_with_the_schemas_defaults(analysis):
    s = analysis.settings
    assert s["organize"]["n_iters"] == 1 and s["organize"]["eps"] == 1.0
    assert s["entropy"]["head_top_k"] == 400 and s["stability"] is None
    org = analysis.organization(0)
    assert json.loads(org.attrs["config"])["organize"] == s["organize"]


def test_the_python_api_pages_examples_run_as_written(tmp_path, monkeypatch):
    """The page's first example and its comparison run as typed (the TransformerLens one needs a
    run of TransformerLens: tests/test_adapters.py runs the how-to's), and give what it says."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    first = next(b for b in blocks if "oattn.analyze(\"minilm\"" in b and "import oattn_lib" in b)
    pair = next(b for b in blocks if "oattn.compare(a, b)" in b)
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(first, "python-api.md", "exec"), ns)
    assert len(ns["a"].heads) == 3 * 72 and ns["a"].heads["sample"].nunique() == 3
    exec(compile(pair, "python-api.md", "exec"), ns)
    c = ns["c"]
    assert c.heads is not None and len(c.heads) == 72 and set(c.models["unit"]) == {"sample", "head"}
