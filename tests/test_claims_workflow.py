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
    from sklearn.metrics import silhouette_score

    res = clean_run / "results"
    got = pd.read_csv(res / "claims.csv")
    C = claims.CLAIMS
    # every per-model claim for each model, and one row comparing the three kinds' Table 2
    assert len(got) == (len(C) - 1) * len(MODELS) + 1 and set(got["model"]) >= set(MODELS)
    assert set(got["verdict"]) <= {claims.HOLDS, claims.NOT_HERE, claims.MIXED, claims.NOT_RUN, claims.REPORTED}
    assert got["quote"].str.startswith("“").all()
    row = got.set_index(["model", "claim"])
    value, verdict = row["value"], row["verdict"]
    fraction = TINY["entropy"]["fraction"]
    for model, kind in MODELS.items():
        assert verdict[model, C["pruning"]] != claims.NOT_RUN and verdict[model, C["pruning_bottom"]] != claims.NOT_RUN
        t2 = pd.read_csv(res / model / "tables" / "table2.csv")
        ratios = [(t2["network_sparsity"] / t2[f"network_sparsity_{b}_trees"]).mean()
                  for b in ("random", "natural") if f"network_sparsity_{b}_trees" in t2]
        assert value[model, C["sparsity"]] == pytest.approx(max(ratios))
        e = open_store(res / model / "entropy.zarr")["head_entropy"].values
        flat = e.reshape(e.shape[0], -1)
        k = max(1, round(fraction * flat.shape[1]))
        for key, sign in (("recurrence", 1), ("top_recurrence", -1)):
            sets = [set(np.argsort(sign * r, kind="stable")[:k]) for r in flat]
            jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.permutations(sets, 2)])
            assert value[model, C[key]] == pytest.approx(jac)
        # Theorem 1: the organized residuals at tau = 1 of the temperature figure's heads (or every head)
        theorem1 = res / model / "figures" / "theorem1.csv"
        if theorem1.exists():
            t = pd.read_csv(theorem1)
        else:
            assert verdict[model, C["smoothness"]] == verdict[model, C["corollary1"]] == claims.NOT_RUN
            t = pd.read_csv(res / model / "figures" / "temperature.csv").rename(columns={"rel_residual": "residual"})
            t = t[t["tau"] == 1.0]
        org = t.loc[t["order"] == "2-D organized", "residual"].fillna(np.inf)
        assert value[model, C["paraproduct"]] == pytest.approx(np.median(org))
        # where the organized order stops beating the baselines: counted over every head-sample's curves
        if verdict[model, C["paraproduct"]] != claims.NOT_RUN:
            from oattn_lib.temperature import crossover_counts

            curves = pd.read_csv(res / model / "figures" / "theorem1_curves.csv")
            n = len(t.groupby(["sample", "layer", "head"]))
            c = crossover_counts(curves, "original")
            assert c["n"] == n
            text = row.loc[(model, C["paraproduct"]), "measured"]
            assert f"in {c['status'].get('beats throughout', 0)}/{n}" in text and "per head-sample" in text
        if (org >= 1).sum() >= len(org) / 2:
            assert verdict[model, C["paraproduct"]] == claims.NOT_HERE
        t3 = pd.read_csv(res / model / "tables" / "table3.csv").set_index("ranking")
        low, rnd, sd = (t3.loc["Haar entropy, lowest first", "auc"], t3.loc["random", "auc"],
                        t3.loc["random", "auc_sd"])
        sign = 1 if bool(t3["higher_is_better"].iloc[0]) else -1
        assert value[model, C["pruning"]] == pytest.approx((low - rnd) / sd * sign)
        # the metric with the bottom fraction masked, from the prune stage's curves
        curves = pd.read_csv(res / model / "prune" / "curves.csv")
        target = max(1, round(fraction * int(curves["k"].max())))  # Table 1's set size, or the grid's nearest
        at = curves[curves["k"] == min(set(curves["k"]) - {0}, key=lambda x: (abs(x - target), x))]
        metric = at[str(t3["metric"].iloc[0])]
        if str(t3["auc_of"].iloc[0]).startswith("log "):
            metric = np.log(metric)
        low, rnd = metric[at["ranking"] == "Haar entropy, lowest first"].iloc[0], metric[at["ranking"] == "random"]
        assert value[model, C["pruning_bottom"]] == pytest.approx((low - rnd.mean()) / rnd.std(ddof=1) * sign)
        # the diffusion map: each sample's heads grouped by layer
        sil = []
        for s in range(N_SAMPLES[model]):
            dec = open_store(res / model / "decomposed" / f"sample{s}.zarr")
            sil.append(silhouette_score(dec["diffusion_coords"].values, dec["unit_layer"].values))
        assert value[model, C["diffusion"]] == pytest.approx(np.median(sil), rel=1e-6)
        assert verdict[model, C["diffusion"]] != claims.NOT_RUN
        raw = t2["network_entropy"]
        assert f"raw {raw.min():.4g}–{raw.max():.4g}" in row.loc[(model, C["table2"]), "measured"]
    cross = got[got["claim"] == C["table2_order"]]
    assert len(cross) == 1 and all(m in cross["model"].iloc[0] for m in MODELS)
    md = (res / "summary.md").read_text()
    assert md.index("| claim | model | the paper says |") < md.index("### Table 1")


def test_report_opens_with_the_claims_table(clean_run):
    out = clean_run / "report_claims.html"
    snakemake(clean_run, TINY, "--report", str(out))
    html = out.read_text(errors="replace")
    assert claims.CLAIMS["paraproduct"].split(" (")[0] in html
    assert "temperature.png" in html
