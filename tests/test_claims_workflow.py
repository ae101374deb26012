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
    res = clean_run / "results"
    got = pd.read_csv(res / "claims.csv")
    assert len(got) == 4 * len(MODELS) and set(got["model"]) == set(MODELS)
    assert set(got["verdict"]) <= {claims.HOLDS, claims.NOT_HERE, claims.MIXED}  # prune ran
    value = got.set_index(["model", "claim"])["value"]
    fraction = TINY["entropy"]["fraction"]
    for model, kind in MODELS.items():
        t2 = pd.read_csv(res / model / "tables" / "table2.csv")
        ratio = (t2["network_sparsity"] / t2["network_sparsity_random_trees"]).mean()
        assert value[model, claims.CLAIMS["sparsity"]] == pytest.approx(ratio)
        e = open_store(res / model / "entropy.zarr")["head_entropy"].values
        flat = e.reshape(e.shape[0], -1)
        k = max(1, round(fraction * flat.shape[1]))
        sets = [set(np.argsort(row, kind="stable")[:k]) for row in flat]
        jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.permutations(sets, 2)])
        assert value[model, claims.CLAIMS["recurrence"]] == pytest.approx(jac)
        temp = json.loads((res / model / "figures" / "temperature.json").read_text())
        assert value[model, claims.CLAIMS["paraproduct"]] == pytest.approx(temp["at_model_tau"]["2-D organized"])
        t3 = pd.read_csv(res / model / "tables" / "table3.csv").set_index("ranking")
        low, rnd, sd = (t3.loc["Haar entropy, lowest first", "auc"], t3.loc["random", "auc"],
                        t3.loc["random", "auc_sd"])
        z = (low - rnd) / sd * (1 if kind != "txl" else -1)
        assert value[model, claims.CLAIMS["pruning"]] == pytest.approx(z)
    md = (res / "summary.md").read_text()
    assert md.index("| claim | model |") < md.index("### Table 1")


def test_report_opens_with_the_claims_table(clean_run):
    out = clean_run / "report_claims.html"
    snakemake(clean_run, TINY, "--report", str(out))
    html = out.read_text(errors="replace")
    assert claims.CLAIMS["paraproduct"].split(" (")[0] in html
    assert "temperature.png" in html
