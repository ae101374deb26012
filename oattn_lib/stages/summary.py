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
    NOT_RUN,
    claims_markdown,
    claims_records,
    claims_rst,
    paper_number,
    paraproduct_claim,
    pruning_claim,
    recurrence_claim,
    sparsity_claim,
    stability_text,
)
from ..stability import REFERENCE, bottom_sets, mean_pair_jaccard, replicate_sets
from ..entropy import extreme_heads, jaccard_stability
from ..models import adapter_for

log = logging.getLogger("oattn")

__all__ = ["model_claims", "prune_not_run", "summary"]

LOWEST_FIRST, RANDOM = "Haar entropy, lowest first", "random"
"""Table 3's names of the ranking the paper proposes and of the random orders."""


def model_claims(name: str, kind: str, entropy_store, table1_csv, table2_csv, temperature_json,
                 table3_csv=None, fraction: float = 0.1, stability_store=None) -> list:
    """The four claims for one model, from its stored entropies, tables and temperature curves.

    The bottom-set Jaccard index is recomputed from the entropy store (as Table 1's note);
    the sparsity ratios come from Table 2, the residuals at tau = 1 and the crossovers from
    the temperature figure's JSON, the pruning areas from Table 3 (None: prune not run, for the
    reason `prune_not_run`). A temperature JSON with `skipped` (the reason: no pre-softmax scores)
    makes the paraproduct claim not run. With a `stability_store`, each claim but pruning is decided
    again in every replicate analysis (`replicate_verdicts`) and says whether its verdict survives.
    """
    ent = store.read_store(entropy_store, require=("head_entropy",), finite=("head_entropy",))
    e = ent["head_entropy"].transpose("sample", "layer", "head").values
    n_s = e.shape[0]
    flat = e.reshape(n_s, -1)
    jac = jaccard_stability(flat, fraction, "bottom")
    off = jac[~np.eye(n_s, dtype=bool)]
    k = extreme_heads(flat, fraction)["k"]
    t1 = pd.read_csv(table1_csv)
    bottom = t1[t1["set"] == "bottom"].sort_values("rank")
    counts = [((int(r.layer), int(r.head)), int(str(r.count).split("/")[0])) for r in bottom.itertuples()]
    t2 = pd.read_csv(table2_csv)
    temp = json.loads(Path(temperature_json).read_text())
    skipped = temp.get("skipped")
    at1 = temp.get("at_model_tau") or dict.fromkeys(("2-D organized", "original", "random"))
    cross = "" if skipped else "; ".join(f"organized is {temp['crossover'][b]['text']}" for b in ("original", "random"))
    auc_low = auc_rand = auc_sd = None
    metric, higher = "held-out metric", True
    if table3_csv is not None:
        t3 = pd.read_csv(table3_csv).set_index("ranking")
        auc_low, auc_rand = float(t3.loc[LOWEST_FIRST, "auc"]), float(t3.loc[RANDOM, "auc"])
        auc_sd = float(t3.loc[RANDOM, "auc_sd"])
        # what the areas are of (log perplexity, accuracy, cosine similarity) as the prune stage measured
        metric, higher = f"held-out {t3['auc_of'].iloc[0]}", bool(t3["higher_is_better"].iloc[0])
    sparsity, random = t2["network_sparsity"].to_numpy(), t2["network_sparsity_random_trees"].to_numpy()
    claims = [
        sparsity_claim(name, sparsity, random, paper=paper_number("sparsity", kind)),
        recurrence_claim(name, float(off.mean()) if off.size else float("nan"), flat.shape[1], k, counts, n_s,
                         paper=paper_number("recurrence", kind)),
        paraproduct_claim(name, at1["2-D organized"], at1["original"], at1["random"], cross,
                          paper=paper_number("paraproduct", kind), not_run=skipped),
        pruning_claim(name, auc_low, auc_rand, auc_sd, higher, metric=metric, paper=paper_number("pruning", kind),
                      not_run=prune_not_run(kind)),
    ]
    if stability_store is None:
        return claims
    reps = replicate_verdicts(stability_store, flat, sparsity, random, fraction, at1, skipped)
    keys = ("sparsity", "recurrence", "paraproduct", "pruning")
    return [c if c.verdict == NOT_RUN else replace(c, stability=stability_text(c.verdict, reps[key]) if key in reps
                                                   else "not replicated: one ablation run")
            for c, key in zip(claims, keys)]


def replicate_verdicts(stability_store, entropies: np.ndarray, sparsity, random, fraction: float, at1: dict,
                       skipped) -> dict[str, list[str]]:
    """The verdicts of the sparsity, recurrence and paraproduct claims in each replicate analysis
    of a stability store (docs/method.md §14.4): replicate r has, for each sample with replicates,
    its replicate r and, for every other sample, the reference (entropies: (samples, units); the
    network sparsity and its random-tree value per sample, from Table 2). The paraproduct's
    organized residual at tau = 1 (the temperature figure's geometric mean `at1`) is scaled by the
    replicate's change of the geometric mean of the figure heads' residuals."""
    stab = store.read_store(stability_store, require=("head_entropy", "sparsity_ratio"))
    pert = stab["perturbation"].values
    reps = np.flatnonzero(pert != REFERENCE)
    r0 = int(np.flatnonzero(pert == REFERENCE)[0])
    sets, _ = replicate_sets(stab, entropies)
    bottom = bottom_sets(sets, fraction, "bottom")
    jac = mean_pair_jaccard(bottom) if entropies.shape[0] > 1 else np.full(sets.shape[0], np.nan)
    n_units, k = entropies.shape[1], int(bottom[0, 0].sum())
    ratio_rep = stab["sparsity_ratio"].transpose("sample", "replicate").values
    rows = stab["sample"].values
    out = {"sparsity": [], "recurrence": [], "paraproduct": []}
    for r in reps:
        s = np.asarray(sparsity, dtype=float).copy()
        s[rows] = ratio_rep[:, r] * np.asarray(random, dtype=float)[rows]
        out["sparsity"].append(sparsity_claim("", s, random).verdict)
        out["recurrence"].append(recurrence_claim("", float(jac[r]), n_units, k, [], entropies.shape[0]).verdict)
        if skipped or "paraproduct_residual" not in stab or at1["2-D organized"] is None:
            continue
        res = stab["paraproduct_residual"].transpose("sample", "replicate", "fig_head").values
        if not np.isfinite(res[:, r]).all():  # sibling: no paraproduct replicate
            continue
        factor = float(np.exp(np.log(res[:, r]).mean() - np.log(res[:, r0]).mean()))
        out["paraproduct"].append(paraproduct_claim("", at1["2-D organized"] * factor, at1["original"],
                                                    at1["random"]).verdict)
    return out


def prune_not_run(kind: str) -> str:
    """Why the prune stage did not run for a model of `kind`: its kind holds no model whose heads
    can be masked, or the config's prune.enabled."""
    if not adapter_for(kind).prunes:
        return f"kind {kind} holds no model to mask"
    return "prune.enabled: false"


def summary(kinds: dict, inputs: dict, outs: dict, fraction: float) -> None:
    """One Markdown page: the claims table first, then training metrics and every model's tables.

    kinds: model name -> kind, in config order. inputs: paths named "<key>_<model>", keys
    `metrics` (trained models), `table1`..`table4` (Markdown; 3-4 when prune ran),
    `table1csv`, `table2csv`, `table3csv` (when prune ran), `entropy` (store) and
    `temperature` (the temperature figure's JSON), `stability` (store) and `stabilitymd` (its table)
    where the model has a `stability` section. outs: `md`, and the claims table as
    `claims_csv` and `claims_rst` (reStructuredText, the report's opening page).
    """
    claims = []
    for name, kind in kinds.items():
        claims += model_claims(name, kind, inputs[f"entropy_{name}"], inputs[f"table1csv_{name}"],
                               inputs[f"table2csv_{name}"], inputs[f"temperature_{name}"],
                               inputs.get(f"table3csv_{name}"), fraction, inputs.get(f"stability_{name}"))
    # grouped by claim, models in config order
    order = {c.claim: i for i, c in enumerate(claims[:4])}
    claims.sort(key=lambda c: order[c.claim])
    store.atomic_write_text(outs["claims_csv"], pd.DataFrame(claims_records(claims)).to_csv(index=False))
    store.atomic_write_text(outs["claims_rst"], claims_rst(claims))
    lines = ["# oattn results\n", "## The paper's claims, as measured here\n", claims_markdown(claims)]
    for name in kinds:
        path = inputs.get(f"metrics_{name}")
        m = json.loads(Path(path).read_text()) if path else {}
        shown = {k: v for k, v in m.items() if k not in ("history",)}
        kind = kinds[name]
        origin = adapter_for(kind).origin + "\n"
        lines.append(f"## {name}\n\n" + ("Training: " + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                                                                 for k, v in shown.items()) + "\n" if shown else
                                         origin))
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
