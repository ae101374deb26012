"""The temperature figure and the claims table in the real workflow's tiny run: their numbers
recomputed here from the stores and tables the run wrote."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from oattn_lib import claims
from oattn_lib.paraproduct import paraproduct
from wfutil import TINY, snakemake

pytestmark = pytest.mark.workflow

MODELS = {"txl": "txl", "vit": "vit", "lm": "hf"}
N_SAMPLES = {m["name"]: m["extract"]["n_samples"] for m in TINY["models"]}


def open_store(path):
    return xr.open_zarr(path, consolidated=False).load()


def test_temperature_curves_at_tau_one_are_the_decompose_stages_or_the_masked_softmaxs(clean_run):
    res = clean_run / "results"
    n_samples = min(TINY["models"][0]["extract"]["n_samples"], 3)  # figures.temperature_samples default
    for model in MODELS:
        summary = json.loads((res / model / "figures" / "temperature.json").read_text())
        assert summary["samples"] == n_samples and summary["taus"][0] == pytest.approx(0.1)
        assert (res / model / "figures" / "temperature.png").stat().st_size > 10_000
        curves = pd.read_csv(res / model / "figures" / "temperature.csv")
        at1 = curves[curves["tau"] == 1.0].set_index(["sample", "layer", "head", "order", "seed"])["rel_residual"]
        for s in range(n_samples):
            dec = open_store(res / model / "decomposed" / f"sample{s}.zarr")
            att = open_store(res / model / "attention" / f"sample{s}.zarr")
            for j, (layer, head) in enumerate(zip(dec["fig_layer"].values, dec["fig_head_index"].values)):
                org = at1[s, layer, head, "2-D organized", -1]
                orig = at1[s, layer, head, "original", -1]
                if model != "txl":  # nothing masked: the decompose stage's own residuals
                    assert org == pytest.approx(float(dec["fig_rel_residual"].values[j]), rel=1e-12)
                    assert orig == pytest.approx(float(dec["fig_rel_residual_unorganized"].values[j]), rel=1e-12)
                    continue
                # causal: against the model's masked softmax, recomputed here with torch
                f = att["scores"].values[layer, head].astype(np.float64)
                n = f.shape[0]
                future = torch.ones(n, n, dtype=torch.bool).triu(1)
                ref = torch.softmax(torch.from_numpy(f).masked_fill(future, float("-inf")), 1).numpy()
                np.testing.assert_allclose(ref, att["probs"].values[layer, head], atol=1e-5)
                pp = paraproduct(f)
                z = np.exp(f - f.max(1, keepdims=True))
                approx = np.where(future.numpy(), 0.0, pp.approximation * z.sum(1, keepdims=True)
                                  / np.where(future.numpy(), 0.0, z).sum(1, keepdims=True))
                assert orig == pytest.approx(np.linalg.norm(ref - approx) / np.linalg.norm(ref), rel=1e-9)
        assert (summary["masked_entries"] > 0) == (model == "txl")


def test_claims_table_numbers_are_recomputed_from_the_stores_and_tables(clean_run):
    from oattn_lib.entropy import n_extreme

    res = clean_run / "results"
    got = pd.read_csv(res / "claims.csv", keep_default_na=False, na_values=[""])
    assert list(got.columns) == claims.COLUMNS
    assert set(got["verdict"]) <= {claims.HOLDS, claims.NOT_HERE, claims.INCONCLUSIVE, claims.PREMISE_NOT_MET,
                                   claims.NOT_RUN, claims.REPORTED}
    assert got["quote"].str.startswith("“").all()
    tested = got[got["p"].notna()]
    assert (tested["p_adjusted"] >= tested["p"]).all() and tested["unit"].isin(
        ["head", "sample", "random head order"] + [u for u in tested["unit"] if u.startswith("set of ")]).all()
    row = got.set_index(["key", "model", "baseline"])
    fraction = TINY["entropy"]["fraction"]
    for model, kind in MODELS.items():
        ent = open_store(res / model / "entropy.zarr")
        effect = np.log(ent["network_sparsity_random"].values / ent["network_sparsity"].values).mean()
        assert row.loc[("sparsity", model, "random trees"), "effect"] == pytest.approx(effect)
        flat = ent["head_entropy"].values.reshape(N_SAMPLES[model], -1)
        k = n_extreme(flat.shape[1], fraction)
        for key, sign in (("recurrence", 1), ("top_recurrence", -1)):
            sets = [set(np.argsort(sign * r, kind="stable")[:k]) for r in flat]
            jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2)])
            chance = row.loc[(key, model, "chance (random sets of the same size)")]
            assert chance["effect"] == pytest.approx(jac - claims.chance_jaccard(flat.shape[1], k))
            assert chance["n_units"] == N_SAMPLES[model] and chance["unit"] == "sample"
        # the approximations: per head the mean over its samples of log(uniform / organized)
        t = pd.read_csv(res / model / "figures" / "theorem1.csv")
        org = t[t["order"] == "2-D organized"]
        per_head = np.log(org["uniform_residual"] / org["residual"]).clip(-claims.CLIP, claims.CLIP) \
            .groupby([org["layer"], org["head"]]).mean()
        uni = row.loc[("paraproduct", model, "uniform attention")]
        assert uni["effect"] == pytest.approx(per_head.mean()) and uni["n_units"] == len(per_head)
        # Theorem 1's premise: the share of heads whose mean exponent of the scores is in (0, 1/2)
        alpha = org.groupby(["layer", "head"])["alpha_scores"].mean().dropna()
        meets = int(((alpha > 0) & (alpha < 0.5)).sum())
        smooth = got[(got["key"] == "smoothness") & (got["model"] == model)].iloc[0]
        assert f"{meets}/{len(alpha)} heads" in smooth["measured"]
        assert (smooth["verdict"] == claims.PREMISE_NOT_MET) == (meets == 0)
        # the bottom fraction: exactly n_extreme heads masked, ranked among the prune stage's sets
        bottom = pd.read_csv(res / model / "prune" / "bottom.csv", keep_default_na=False)
        n_units = int(bottom["n_units"].iloc[0])
        assert int(bottom["k"].iloc[0]) == n_extreme(n_units, fraction)
        b = got[(got["key"] == "pruning_bottom") & (got["model"] == model)].iloc[0]
        assert f"{n_extreme(n_units, fraction)} of {n_units}" in b["measured"]
        sign = 1.0 if bool(bottom["higher_is_better"].iloc[0]) else -1.0
        v = bottom["value"].astype(float)
        v = np.log(v) if bool(bottom["log_metric"].iloc[0]) else v
        haar, null = sign * v[bottom["set"] == "Haar entropy, lowest first"].iloc[0], sign * v[bottom["set"] == "null"]
        exact = bottom["null"].iloc[0] == "exact"
        p = (null >= haar - 1e-12).mean() if exact else (1 + (null >= haar - 1e-12).sum()) / (1 + len(null))
        assert b["p"] == pytest.approx(max(p, 1 / len(null) if exact else p))
        diff = got[(got["key"] == "diffusion") & (got["model"] == model)].iloc[0]
        assert diff["unit"] == "sample" and "Gaussian" in diff["measured"] and "layer" not in diff["measured"]
    # the causal model analysing scores: the expansions' rows under both masked rules
    txl = got[(got["model"] == "txl") & (got["key"] == "sparsity") & got["p"].notna()]
    assert (txl["masked_rule"] == "row_mean").all() and txl["other_masked_rule"].str.startswith("keep: ").all()
    assert got.loc[got["model"] == "vit", "masked_rule"].isna().all()
    cross = got[got["key"] == "table2_order"]
    assert list(cross["model"]) == ["txl vs vit", "other pairs"] and "lm" in cross["measured"].iloc[1]
    assert cross["verdict"].iloc[1] == claims.REPORTED
    md = (res / "summary.md").read_text()
    assert md.index("### the organized network is sparse") < md.index("### Table 1") and "Holm" in md


def test_report_opens_with_the_claims_table(clean_run):
    out = clean_run / "report_claims.html"
    snakemake(clean_run, TINY, "--report", str(out))
    html = out.read_text(errors="replace")
    assert claims.CLAIMS["paraproduct"].split(" (")[0] in html and "p (Holm)" in html
    assert "temperature.png" in html
