"""Stage `summary`: one Markdown page opening with the paper's claims as measured (one table),
then every model's training metrics and tables."""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store
from ..claims import (
    CLAIMS,
    NOT_RUN,
    ORGANIZED,
    REPORTED,
    claim_key,
    claims_markdown,
    claims_records,
    claims_rst,
    corollary1_claim,
    diffusion_claim,
    layer_silhouette_test,
    paper_number,
    paraproduct_claim,
    pruning_bottom_claim,
    pruning_claim,
    recurrence_claim,
    smoothness_claim,
    sparsity_claim,
    stability_text,
    table2_claim,
    table2_order_claim,
)
from ..stability import FIG_MEASURES, REFERENCE, bottom_sets, mean_pair_jaccard, replicate_sets
from ..entropy import extreme_heads, jaccard_stability, n_extreme
from ..models import adapter_for
from ..temperature import crossover_counts

log = logging.getLogger("oattn")

__all__ = ["bottom_fraction_point", "diffusion_silhouettes", "model_claims", "prune_not_run", "replicate_verdicts",
           "residual_table", "summary"]

LOWEST_FIRST, RANDOM = "Haar entropy, lowest first", "random"
"""Table 3's names of the ranking the paper proposes and of the random orders."""
NO_THEOREM1 = "no theorem1 table (every-head Theorem 1 measures not computed)"
DIFFUSION_SEED = 0
"""The seed of the layer-label shuffles of the diffusion claim (sample i: default_rng([seed, i]))."""


def residual_table(theorem1_csv=None, temperature_csv=None) -> tuple[pd.DataFrame | None, str]:
    """The per head-sample table of Theorem 1's claims (docs/method.md §13) and where it comes from.

    A DataFrame with columns sample, layer, head, order ("2-D organized", "original", "random"),
    seed (random orders: one row per seed, else -1) and residual, the relative residual of the
    paraproduct at tau = 1: the every-head `theorem1_csv` where one was computed (with its other
    columns: corollary1_residual, alpha_softmax, alpha_residual), else the temperature figure's
    curves (`temperature_csv`, its figure heads, rows at tau = 1). (None, "") without either.
    """
    if theorem1_csv is not None:
        return pd.read_csv(theorem1_csv), "every head"
    if temperature_csv is None:
        return None, ""
    t = pd.read_csv(temperature_csv)
    t = t[np.isclose(t["tau"].to_numpy(dtype=float), 1.0)].rename(columns={"rel_residual": "residual"})
    return (t[["sample", "layer", "head", "order", "seed", "residual"]].reset_index(drop=True),
            "the temperature figure's heads")


def diffusion_silhouettes(decomposed_stores, seed: int = DIFFUSION_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Per decomposed store (one sample each): the silhouette of its heads grouped by layer in the
    diffusion coordinates and its permutation p-value (`claims.layer_silhouette_test`)."""
    sil, pval = [], []
    for i, path in enumerate(decomposed_stores):
        ds = store.read_store(path, require=("diffusion_coords",), lazy=True)
        x = ds["diffusion_coords"].transpose("unit", "component").values
        s, p = layer_silhouette_test(x, ds["unit_layer"].values, rng=np.random.default_rng([seed, i]))
        sil.append(s)
        pval.append(p)
    return np.asarray(sil, dtype=float), np.asarray(pval, dtype=float)


def bottom_fraction_point(curves_csv, metric: str, log_metric: bool, fraction: float) -> dict:
    """The prune stage's curves at the bottom `fraction` of heads masked: the metric (its log where
    Table 3's areas are of the log) lowest entropy first and per random order, at the mask size of
    the curves' grid nearest `entropy.n_extreme(n_units, fraction)` (Table 1's bottom set)."""
    c = pd.read_csv(curves_csv)
    if metric not in c.columns:
        raise ValueError(f"{curves_csv}: no column {metric!r} (has {list(c.columns)})")
    n_units = int(c["k"].max())
    target = n_extreme(n_units, fraction)
    k = min((int(x) for x in c["k"].unique() if x > 0), key=lambda x: (abs(x - target), x))
    at = c[c["k"] == k]
    low, rnd = (at.loc[at["ranking"] == r, metric].to_numpy(dtype=float) for r in (LOWEST_FIRST, RANDOM))
    if log_metric:
        low, rnd = np.log(low), np.log(rnd)
    note = "" if k == target else f" (the grid's nearest to the bottom {fraction:.0%}, {target} heads)"
    return {"low": float(low[0]), "random": rnd, "k": k, "n_units": n_units, "note": note}


def head_crossover_text(curves: pd.DataFrame) -> str:
    """Where each head-sample's organized residual curve stops beating the original order's and the
    random orders' (`temperature.crossover_counts`), in words; "" for a table with no curve."""
    if curves.empty:
        return ""
    lo, hi = float(curves["tau"].min()), float(curves["tau"].max())
    parts = []
    for b, label in (("original", "the original order"), ("random", "the random orders")):
        c = crossover_counts(curves, b)
        if not c["n"]:
            continue
        st = c["status"]
        stops = (f", stops at median τ = {np.median(c['tau']):.3g} in {st['stops beating']}"
                 if st.get("stops beating") else "")
        parts.append(f"below {label} over all of τ in [{lo:.3g}, {hi:.3g}] in {st.get('beats throughout', 0)}/{c['n']}"
                     f"{stops}, never in {st.get('never beats', 0)}, only above some τ in "
                     f"{st.get('starts beating', 0)}")
    return "per head-sample, the organized residual is " + "; ".join(parts) if parts else ""


def model_claims(name: str, kind: str, entropy_store, table1_csv, table2_csv, temperature_json,
                 table3_csv=None, fraction: float = 0.1, stability_store=None, *, temperature_csv=None,
                 theorem1_csv=None, curves_csv=None, decomposed_stores=(), theorem1_curves_csv=None) -> list:
    """Every per-model claim (docs/method.md §13), from the model's stores, tables and figures.

    The Jaccard indices of the bottom and top sets are recomputed from the entropy store (as
    Table 1's note); the sparsity ratios and the network entropies come from Table 2; Theorem 1's
    residuals from `residual_table` (the every-head `theorem1_csv`, else the temperature figure's
    `temperature_csv`), the crossovers per head-sample from `theorem1_curves_csv` where given, else the
    figure heads' from the `temperature_json`; the pruning areas from Table 3
    and the metric at the bottom `fraction` from the prune stage's `curves_csv` (None: prune not
    run, for the reason `prune_not_run`); the layer silhouettes from the `decomposed_stores`. A
    temperature JSON with `skipped` (the reason: no pre-softmax scores) makes Theorem 1's claims
    not run. With a `stability_store`, the sparsity, recurrence and paraproduct claims are decided
    again in every replicate analysis (`replicate_verdicts`) and say whether their verdict survives.
    """
    ent = store.read_store(entropy_store, require=("head_entropy",), finite=("head_entropy",))
    e = ent["head_entropy"].transpose("sample", "layer", "head").values
    n_s = e.shape[0]
    flat = e.reshape(n_s, -1)
    k = extreme_heads(flat, fraction)["k"]
    t1 = pd.read_csv(table1_csv)
    t2 = pd.read_csv(table2_csv)
    temp = json.loads(Path(temperature_json).read_text())
    skipped = temp.get("skipped")
    cross = "" if skipped else "; ".join(f"organized is {temp['crossover'][b]['text']}" for b in ("original", "random"))
    if theorem1_curves_csv is not None and not skipped:
        cross = head_crossover_text(pd.read_csv(theorem1_curves_csv)) or cross
    residuals, source = residual_table(theorem1_csv, temperature_csv)
    para_not_run = skipped if theorem1_csv is None else None
    if residuals is None and not para_not_run:
        para_not_run = "no residual table (neither the temperature figure's curves nor a theorem1 table)"
    elif residuals is not None and residuals.empty and not para_not_run:
        para_not_run = "the residual table is empty"

    def theorem1(*columns):
        """Why a claim on the theorem1 table's `columns` is not run (None: it is)."""
        if theorem1_csv is None or not set(columns) <= set(residuals.columns):
            return NO_THEOREM1
        return para_not_run

    metric, higher, auc_low, auc_rand, auc_sd, bottom = "held-out metric", True, None, None, None, {}
    if table3_csv is not None:
        t3 = pd.read_csv(table3_csv).set_index("ranking")
        auc_low, auc_rand = float(t3.loc[LOWEST_FIRST, "auc"]), float(t3.loc[RANDOM, "auc"])
        auc_sd = float(t3.loc[RANDOM, "auc_sd"])
        # what the areas are of (log perplexity, accuracy, cosine similarity) as the prune stage measured
        auc_of, higher = str(t3["auc_of"].iloc[0]), bool(t3["higher_is_better"].iloc[0])
        metric = f"held-out {auc_of}"
        if curves_csv is not None:
            bottom = bottom_fraction_point(curves_csv, str(t3["metric"].iloc[0]), auc_of.startswith("log "), fraction)
    sparsity, random = t2["network_sparsity"].to_numpy(), t2["network_sparsity_random_trees"].to_numpy()
    natural = t2["network_sparsity_natural_trees"].to_numpy() if "network_sparsity_natural_trees" in t2 else None
    scale_free = t2["network_entropy_scale_free"].to_numpy() if "network_entropy_scale_free" in t2 else None
    if decomposed_stores:
        sil, pval = diffusion_silhouettes(decomposed_stores)
        diffusion = diffusion_claim(name, kind, sil, pval, paper=paper_number("diffusion", kind))
    else:
        diffusion = diffusion_claim(name, kind, [], [], paper=paper_number("diffusion", kind),
                                    not_run="no decomposed stores given")
    claims = [sparsity_claim(name, sparsity, random, natural, paper=paper_number("sparsity", kind))]
    for which, key in (("bottom", "recurrence"), ("top", "top_recurrence")):
        jac = jaccard_stability(flat, fraction, which)
        off = jac[~np.eye(n_s, dtype=bool)]
        rows = t1[t1["set"] == which].sort_values("rank")
        counts = [((int(r.layer), int(r.head)), int(str(r.count).split("/")[0])) for r in rows.itertuples()]
        claims.append(recurrence_claim(name, float(off.mean()) if off.size else float("nan"), flat.shape[1], k,
                                       counts, n_s, paper=paper_number(key, kind), which=which))
    claims += [
        paraproduct_claim(name, residuals, cross, paper=paper_number("paraproduct", kind), not_run=para_not_run,
                          source=source),
        smoothness_claim(name, residuals, paper=paper_number("smoothness", kind), not_run=theorem1("alpha_softmax", "alpha_residual")),
        corollary1_claim(name, residuals, paper=paper_number("corollary1", kind),
                         not_run=theorem1("corollary1_residual"), source=source),
        pruning_claim(name, auc_low, auc_rand, auc_sd, higher, metric=metric, paper=paper_number("pruning", kind),
                      not_run=prune_not_run(kind)),
        pruning_bottom_claim(name, bottom.get("low"), bottom.get("random"), bottom.get("k", 0),
                             bottom.get("n_units", 0), higher, metric=metric,
                             paper=paper_number("pruning_bottom", kind),
                             not_run=prune_not_run(kind) if table3_csv is None else "no curves given",
                             note=bottom.get("note", "")),
        table2_claim(name, t2["network_entropy"].to_numpy(), scale_free, paper=paper_number("table2", kind)),
        diffusion,
    ]
    if stability_store is None:
        return claims
    reps = replicate_verdicts(stability_store, flat, sparsity, random, fraction, residuals, para_not_run,
                              natural=natural, kind=kind, silhouettes=sil if decomposed_stores else None,
                              pvalues=pval if decomposed_stores else None)
    out = []
    for c in claims:
        key = claim_key(c.claim)
        if c.verdict in (NOT_RUN, REPORTED):
            out.append(c)
        elif reps.get(key):
            out.append(replace(c, stability=stability_text(c.verdict, reps[key])))
        else:
            out.append(replace(c, stability="not replicated: one ablation run" if key.startswith("pruning")
                               else "not replicated"))
    return out


# the theorem1 table's columns a replicate changes: by the ratio of the figure head's replicate value
# to its reference (residuals) or by their difference (exponents)
_SCALED = {"residual": "paraproduct_residual", "corollary1_residual": "corollary1_residual"}
_SHIFTED = {"alpha_softmax": "alpha_softmax", "alpha_residual": "alpha_residual"}


def _replicate_table(residuals: pd.DataFrame, fig: dict, figs: list, r: int, r0: int) -> pd.DataFrame | None:
    """The residual table of replicate r: each replicated (sample, figure head)'s organized rows
    with their residuals scaled and their exponents shifted by the head's change from the
    reference r0 (`fig`: measure -> (sample, replicate, fig_head)). None where the replicate has
    no paraproduct (sibling)."""
    if not np.isfinite(fig["paraproduct_residual"][:, r]).all():
        return None
    out = residuals.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        for column, measure in (_SCALED | _SHIFTED).items():
            if column not in out or measure not in fig:
                continue
            v = out[column].to_numpy(dtype=float).copy()
            for i, j, at in figs:
                rep, ref = fig[measure][i, r, j], fig[measure][i, r0, j]
                v[at] = v[at] * (rep / ref) if column in _SCALED else v[at] + (rep - ref)
            out[column] = v
    return out


def replicate_verdicts(stability_store, entropies: np.ndarray, sparsity, random, fraction: float, residuals,
                       skipped, natural=None, *, kind: str | None = None, silhouettes=None,
                       pvalues=None) -> dict[str, list[str]]:
    """The verdicts of the claims in each replicate analysis of a stability store (docs/method.md
    §14.4): replicate r has, for each sample with replicates, its replicate r and, for every other
    sample, the reference. Decided again: sparsity and recurrence (bottom and top; entropies:
    (samples, units); the network sparsity and its random-tree and natural-order values per sample,
    from Table 2); the paraproduct, Corollary 1 and smoothness claims (from the residual table
    `residual_table`; None or `skipped`: none of them), each replicated sample's figure heads'
    organized rows scaled (residuals) or shifted (exponents) by the head's change in the replicate;
    and, with the model's `kind` and the reference `silhouettes` and `pvalues` per sample, the
    diffusion claim, from each replicated sample's replicate diffusion coordinates."""
    stab = store.read_store(stability_store, require=("head_entropy", "sparsity_ratio"))
    pert = stab["perturbation"].values
    reps = np.flatnonzero(pert != REFERENCE)
    r0 = int(np.flatnonzero(pert == REFERENCE)[0])
    sets, _ = replicate_sets(stab, entropies)
    jac = {}
    for which in ("bottom", "top"):
        member = bottom_sets(sets, fraction, which)
        jac[which] = mean_pair_jaccard(member) if entropies.shape[0] > 1 else np.full(sets.shape[0], np.nan)
    n_units, k = entropies.shape[1], int(bottom_sets(sets[:1], fraction)[0, 0].sum())
    ratio_rep = stab["sparsity_ratio"].transpose("sample", "replicate").values
    rows = stab["sample"].values
    out = {"sparsity": [], "recurrence": [], "top_recurrence": [], "paraproduct": [], "corollary1": [],
           "smoothness": [], "diffusion": []}
    figs, fig = None, {}
    if not skipped and residuals is not None and "paraproduct_residual" in stab:
        fig = {m: stab[m].transpose("sample", "replicate", "fig_head").values for m in FIG_MEASURES if m in stab}
        organized = (residuals["order"] == ORGANIZED).to_numpy()
        # the table's rows of each (replicated sample, figure head)
        figs = [(i, j, np.flatnonzero(organized & (residuals["sample"] == s).to_numpy()
                                      & (residuals["layer"] == la).to_numpy() & (residuals["head"] == he).to_numpy()))
                for i, s in enumerate(rows)
                for j, (la, he) in enumerate(zip(stab["fig_layer"].values, stab["fig_head_index"].values))]
        figs = [f for f in figs if f[2].size] or None
    coords = None
    if kind is not None and silhouettes is not None and "diffusion_coords" in stab:
        coords = stab["diffusion_coords"].transpose("sample", "replicate", "unit", "component").values
        layers = stab["unit_layer"].values
    for r in reps:
        s = np.asarray(sparsity, dtype=float).copy()
        s[rows] = ratio_rep[:, r] * np.asarray(random, dtype=float)[rows]
        out["sparsity"].append(sparsity_claim("", s, random, natural).verdict)
        out["recurrence"].append(recurrence_claim("", float(jac["bottom"][r]), n_units, k, [],
                                                  entropies.shape[0]).verdict)
        out["top_recurrence"].append(recurrence_claim("", float(jac["top"][r]), n_units, k, [], entropies.shape[0],
                                                      which="top").verdict)
        if coords is not None:
            sil, pval = np.asarray(silhouettes, dtype=float).copy(), np.asarray(pvalues, dtype=float).copy()
            for i, smp in enumerate(rows):  # the reference's shuffles (diffusion_silhouettes)
                sil[smp], pval[smp] = layer_silhouette_test(coords[i, r], layers,
                                                            rng=np.random.default_rng([DIFFUSION_SEED, int(smp)]))
            out["diffusion"].append(diffusion_claim("", kind, sil, pval).verdict)
        table = _replicate_table(residuals, fig, figs, r, r0) if figs is not None else None
        if table is None:  # sibling: no paraproduct replicate
            continue
        out["paraproduct"].append(paraproduct_claim("", table).verdict)
        if "corollary1_residual" in table and "corollary1_residual" in fig:
            out["corollary1"].append(corollary1_claim("", table).verdict)
        if {"alpha_softmax", "alpha_residual"} <= set(table.columns) and {"alpha_softmax", "alpha_residual"} <= set(fig):
            out["smoothness"].append(smoothness_claim("", table).verdict)
    return out


def prune_not_run(kind: str) -> str:
    """Why the prune stage did not run for a model of `kind`: its kind holds no model whose heads
    can be masked, or the config's prune.enabled."""
    if not adapter_for(kind).prunes:
        return f"kind {kind} holds no model to mask"
    return "prune.enabled: false"


def _masked_said(claims: list, attrs: dict) -> list:
    """The claims measured on the Haar expansions (sparsity, Table 2) say how the model's masked
    scores entered them, where the analysis set any (docs/method.md §9.5)."""
    n = int(attrs.get("masked_filled", 0))
    if not n:
        return claims
    said = f"; the {n} masked scores set per row to the row's allowed mean (extract.masked: row_mean)"
    on_expansions = {CLAIMS["sparsity"], CLAIMS["table2"]}
    return [replace(c, measured=c.measured + said) if c.claim in on_expansions and c.verdict != NOT_RUN else c
            for c in claims]


def summary(kinds: dict, inputs: dict, outs: dict, fraction: float) -> None:
    """One Markdown page: the claims table first, then training metrics and every model's tables.

    kinds: model name -> kind, in config order. inputs: paths named "<key>_<model>", keys
    `metrics` (trained models), `table1`..`table4` (Markdown; 3-4 when prune ran),
    `table1csv`, `table2csv`, `table3csv` and `curves` (the prune stage's, when prune ran),
    `entropy` (store), `temperature` (the temperature figure's JSON) and `temperaturecsv` (its
    curves), `theorem1` (the every-head Theorem 1 table, optional) and `theorem1curves` (its curves, optional), `decomposed` (the decomposed
    stores, a list), `stability` (store) and `stabilitymd` (its table) where the model has a
    `stability` section. outs: `md`, and the claims table as `claims_csv` and `claims_rst`
    (reStructuredText, the report's opening page).
    """
    claims, entropies = [], {}
    for name, kind in kinds.items():
        decomposed = inputs.get(f"decomposed_{name}", ())
        decomposed = [decomposed] if isinstance(decomposed, (str, Path)) else list(decomposed)
        mine = model_claims(name, kind, inputs[f"entropy_{name}"], inputs[f"table1csv_{name}"],
                            inputs[f"table2csv_{name}"], inputs[f"temperature_{name}"],
                            inputs.get(f"table3csv_{name}"), fraction, inputs.get(f"stability_{name}"),
                            temperature_csv=inputs.get(f"temperaturecsv_{name}"),
                            theorem1_csv=inputs.get(f"theorem1_{name}"), curves_csv=inputs.get(f"curves_{name}"),
                            decomposed_stores=decomposed, theorem1_curves_csv=inputs.get(f"theorem1curves_{name}"))
        claims += _masked_said(mine, store.read_store(inputs[f"entropy_{name}"], lazy=True).attrs)
        t2 = pd.read_csv(inputs[f"table2csv_{name}"])
        entropies[name] = (kind, t2["network_entropy"].to_numpy(),
                           t2["network_entropy_scale_free"].to_numpy() if "network_entropy_scale_free" in t2 else None)
    across = table2_order_claim(entropies, paper=paper_number("table2_order", "*"))
    claims += [across] if across is not None else []
    # grouped by claim in the order of CLAIMS, models in config order
    order = list(CLAIMS.values())
    claims.sort(key=lambda c: order.index(c.claim))
    store.atomic_write_text(outs["claims_csv"], pd.DataFrame(claims_records(claims)).to_csv(index=False))
    store.atomic_write_text(outs["claims_rst"], claims_rst(claims))
    lines = ["# oattn results\n", "## The paper's claims, as measured here\n", claims_markdown(claims)]
    for name in kinds:
        path = inputs.get(f"metrics_{name}")
        m = json.loads(Path(path).read_text()) if path else {}
        shown = {k: v for k, v in m.items() if k not in ("history",)}
        kind = kinds[name]
        origin = adapter_for(kind).origin + "\n"
        trained = ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}" for k, v in shown.items())
        lines.append(f"## {name}\n\n" + (f"Training: {trained}\n" if shown else origin))
        if f"table3_{name}" not in inputs:
            lines.append(f"prune: not run: {prune_not_run(kind)} (no Tables 3-4, no Figure 7).\n")
        skipped = json.loads(Path(inputs[f"temperature_{name}"]).read_text()).get("skipped")
        if skipped:
            lines.append(f"Theorem 1 (temperature figure, paraproduct): not run: {skipped}.\n")
        for t in (1, 2, 3, 4):
            if f"table{t}_{name}" in inputs:
                lines.append(f"### Table {t}\n\n{Path(inputs[f'table{t}_{name}']).read_text()}\n")
        if f"stabilitymd_{name}" in inputs:
            lines.append(f"### Stability (docs/method.md §14)\n\n{Path(inputs[f'stabilitymd_{name}']).read_text()}\n")
    store.atomic_write_text(outs["md"], "\n".join(lines))
    log.info("claims: %s", "; ".join(f"{c.model}: {c.verdict}" for c in claims))
