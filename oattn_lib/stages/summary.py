"""Stage `summary`: one Markdown page opening with the paper's claims as measured (docs/method.md §13),
then every model's training metrics and tables.

Each model's measurements are gathered once (`ModelData`); the claims' rows are built from them
(`model_rows`), corrected together (`claims.finalize`), and built again from changed copies of
them to say whether each verdict replicates: on each half of the samples, in each replicate
analysis of the stability stage, and under the other masked-entry rule (`claims.redecide`)."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .. import store
from ..claims import (APPROXIMATIONS, CLAIMS, NOT_RUN, ORGANIZED, REPORTED, UNIFORM, Claim, approximation_rows,
                      claims_markdown, claims_records, claims_rst, cluster_tests_of, diffusion_row, finalize,
                      head_sample_residuals, paper_number,
                      pruning_bottom_row, pruning_row, recurrence_null, recurrence_rows, redecide, smoothness_row,
                      sparsity_rows, table2_order_rows, table2_row, verdict_text)
from ..clustering import against_null, best_silhouette
from ..entropy import n_extreme
from ..models import adapter_for
from ..stability import FIG_MEASURES, REFERENCE, replicate_sets
from ..temperature import crossover_counts

log = logging.getLogger("oattn")

__all__ = ["ModelData", "PROMPT_KEYS", "Settings", "head_crossover_text", "load_model_data", "made_by", "model_rows",
           "prompt_claims", "prune_not_run", "replicate_data", "residual_table", "subset", "summary"]

LOWEST_FIRST, RANDOM = "Haar entropy, lowest first", "random"
"""Table 3's names of the ranking the paper proposes and of the random orders."""
NO_THEOREM1 = "no theorem1 table (every-head Theorem 1 measures not computed)"
MASKED_KEYS = ("sparsity", "recurrence", "top_recurrence", "table2", "table2_order", "diffusion")
"""The claims measured on the 3-D expansions of the analysed quantity: for pre-softmax scores they
depend on the masked-entry rule (docs/method.md §9.5)."""


@dataclass(frozen=True)
class Settings:
    """How the claims are inferred (the config's `claims` section) and Table 1's fraction."""

    fraction: float = 0.1
    bootstrap: int = 2000
    permutations: int = 9999
    null_draws: int = 99
    seed: int = 0
    nulls: dict = field(default_factory=dict, compare=False)
    """Recurrence nulls by (samples, units, k, seed): they depend on the sizes only."""


@dataclass(frozen=True)
class ModelData:
    """Everything the claims of one model are decided on, per sample where it is per sample."""

    name: str
    kind: str
    samples: np.ndarray                  # (S,) sample indices
    entropy: np.ndarray                  # (S, U) head Haar entropy, units flat (layer, head)
    amplitude: np.ndarray | None         # (S, U) each head's Frobenius norm
    sparsity: np.ndarray                 # (S,) network l1/l2, organized
    random: np.ndarray                   # (S,) under random trees
    natural: np.ndarray | None           # (S,) under balanced trees in the natural order
    network_entropy: np.ndarray          # (S,)
    scale_free: np.ndarray | None        # (S,) network entropy / l2 norm
    counts: dict                         # "bottom"/"top" -> Table 1's most frequent heads ((layer, head), count)
    residuals: pd.DataFrame | None       # the theorem1 table (or the temperature figure's rows at tau = 1)
    source: str = ""
    para_not_run: str | None = None
    theorem1_not_run: str | None = NO_THEOREM1
    crossover: str = ""
    clusters: tuple = ()                 # (S,) clustering.ClusterTest of the diffusion coordinates
    diffusion_not_run: str | None = None
    prune: dict | None = None            # pruning_row / pruning_bottom_row arguments; None: not run
    prune_not_run: str = ""
    masked_rule: str = ""                # the extract.masked rule, where it set any masked score


def residual_table(theorem1_csv=None, temperature_csv=None) -> tuple[pd.DataFrame | None, str]:
    """The per head-sample table of Theorem 1's claims (docs/method.md §13) and where it comes from:
    the every-head `theorem1_csv` where one was computed, else the temperature figure's curves
    (`temperature_csv`, its figure heads, rows at tau = 1, the paraproduct's residual only). (None,
    "") without either."""
    if theorem1_csv is not None:
        return pd.read_csv(theorem1_csv), "every head"
    if temperature_csv is None:
        return None, ""
    t = pd.read_csv(temperature_csv)
    t = t[np.isclose(t["tau"].to_numpy(dtype=float), 1.0)].rename(columns={"rel_residual": "residual"})
    return (t[["sample", "layer", "head", "order", "seed", "residual"]].reset_index(drop=True),
            "the temperature figure's heads")


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


def made_by() -> str:
    """The software that computed the results, for the summary page and the report: "oattn
    <version>", with ", commit <sha>" where the library is a git clone (`store.software_attrs`)."""
    made = store.software_attrs()
    return f"oattn {made['oattn_version']}" + (f", commit {made['oattn_commit']}" if "oattn_commit" in made else "")


def prune_not_run(kind: str) -> str:
    """Why the prune stage did not run for a model of `kind`: its kind holds no model whose heads
    can be masked, or the config's prune.enabled."""
    if not adapter_for(kind).prunes:
        return f"kind {kind} holds no model to mask"
    return "prune.enabled: false"


# -- reading ----------------------------------------------------------------------------------------
def _entropy_measures(entropy_store) -> dict:
    """The per-sample measures of an entropy store: head entropies and amplitudes (S, U) with the
    units' (layer, head), the network sparsities and entropies, the masked rule it records."""
    ent = store.read_store(entropy_store, require=("head_entropy", "network_sparsity", "network_sparsity_random",
                                                   "network_entropy"), finite=("head_entropy",))
    e = ent["head_entropy"].transpose("sample", "layer", "head")
    n_s = e.sizes["sample"]
    amp = (ent["head_l2"].transpose("sample", "layer", "head").values.reshape(n_s, -1)
           if "head_l2" in ent else None)
    filled = int(ent.attrs.get("masked_filled", 0))
    return {"samples": ent["sample"].values, "entropy": e.values.reshape(n_s, -1), "amplitude": amp,
            "layers": ent["layer"].values, "heads": ent["head"].values,
            "sparsity": ent["network_sparsity"].values, "random": ent["network_sparsity_random"].values,
            "natural": ent["network_sparsity_natural"].values if "network_sparsity_natural" in ent else None,
            "network_entropy": ent["network_entropy"].values,
            "scale_free": (ent["network_entropy"].values / ent["network_l2"].values if "network_l2" in ent else None),
            "masked_rule": str(ent.attrs.get("masked", "")) if filled else ""}


def _clusters(decomposed_stores, settings: Settings, name: str) -> tuple[tuple, str | None]:
    if not decomposed_stores:
        return (), "no decomposed stores given"
    coords = []
    for path in decomposed_stores:
        ds = store.read_store(path, require=("diffusion_coords",), lazy=True)
        coords.append(ds["diffusion_coords"].transpose("unit", "component").values)
    return tuple(cluster_tests_of(coords, settings.null_draws, settings.seed, name)), None


def _prune(table3_csv, curves_csv, bottom_csv) -> dict:
    """The pruning rows' arguments from Table 3 (what the areas are of), the curves (every order's
    area) and the bottom table (None where the prune stage wrote none)."""
    t3 = pd.read_csv(table3_csv)
    auc_of, higher = str(t3["auc_of"].iloc[0]), bool(t3["higher_is_better"].iloc[0])
    metric = str(t3["metric"].iloc[0])
    out = {"higher_is_better": higher, "metric": f"held-out {auc_of}", "bottom": None, "auc_low": None,
           "auc_random": None, "others": {}}
    if curves_csv is not None:
        c = pd.read_csv(curves_csv)
        if metric not in c.columns:
            raise ValueError(f"{curves_csv}: no column {metric!r} (has {list(c.columns)})")
        y = c[metric].to_numpy(dtype=float)
        c = c.assign(y=np.log(y) if auc_of.startswith("log ") else y).sort_values("fraction")
        # Table 3's trapezoidal areas (docs/method.md §11.3; ablation.auc, which would import torch here)
        areas = {key: float(np.trapezoid(g["y"].to_numpy(), g["fraction"].to_numpy()))
                 for key, g in c.groupby(["ranking", "order"], sort=False)}
        out["auc_low"] = areas.get((LOWEST_FIRST, 0))
        out["auc_random"] = np.array([v for (r, _), v in areas.items() if r == RANDOM])
        out["others"] = {r: v for (r, o), v in areas.items() if r not in (LOWEST_FIRST, RANDOM)}
    if bottom_csv is not None:
        # the null's sets are named "null", which pandas reads as a missing value by default
        out["bottom"] = pd.read_csv(bottom_csv, keep_default_na=False, na_values=[""])
    return out


def load_model_data(name: str, kind: str, inputs: dict, settings: Settings) -> ModelData:
    """A model's `ModelData` from the summary's inputs (`summary`'s keys, suffixed _<name>)."""
    def get(key):
        return inputs.get(f"{key}_{name}")

    m = _entropy_measures(get("entropy"))
    t1 = pd.read_csv(get("table1csv"))
    counts = {which: [((int(r.layer), int(r.head)), int(str(r.count).split("/")[0]))
                      for r in t1[t1["set"] == which].sort_values("rank").itertuples()] for which in ("bottom", "top")}
    temp = json.loads(Path(get("temperature")).read_text())
    skipped = temp.get("skipped")
    cross = "" if skipped else "; ".join(f"organized is {temp['crossover'][b]['text']}" for b in ("original", "random"))
    if get("theorem1curves") is not None and not skipped:
        cross = head_crossover_text(pd.read_csv(get("theorem1curves"))) or cross
    residuals, source = residual_table(get("theorem1"), get("temperaturecsv"))
    para_not_run = skipped if get("theorem1") is None else None
    if residuals is None and not para_not_run:
        para_not_run = "no residual table (neither the temperature figure's curves nor a theorem1 table)"
    elif residuals is not None and residuals.empty and not para_not_run:
        para_not_run = skipped or "the residual table is empty (no pre-softmax scores)"
    decomposed = get("decomposed") or ()
    decomposed = [decomposed] if isinstance(decomposed, (str, Path)) else list(decomposed)
    clusters, diff_not_run = _clusters(decomposed, settings, name)
    prune = None
    if get("table3csv") is not None:
        prune = _prune(get("table3csv"), get("curves"), get("bottom"))
    return ModelData(name=name, kind=kind, samples=m["samples"], entropy=m["entropy"], amplitude=m["amplitude"],
                     sparsity=m["sparsity"], random=m["random"], natural=m["natural"],
                     network_entropy=m["network_entropy"], scale_free=m["scale_free"], counts=counts,
                     residuals=residuals, source=source, para_not_run=para_not_run,
                     theorem1_not_run=NO_THEOREM1 if get("theorem1") is None else para_not_run, crossover=cross,
                     clusters=clusters, diffusion_not_run=diff_not_run, prune=prune,
                     prune_not_run=prune_not_run(kind) if prune is None else "", masked_rule=m["masked_rule"])


# -- the rows ---------------------------------------------------------------------------------------
def _null(settings: Settings, n_s: int, n_u: int) -> np.ndarray:
    k = n_extreme(n_u, settings.fraction)
    key = (n_s, n_u, k, settings.permutations, settings.seed)
    if key not in settings.nulls:
        settings.nulls[key] = recurrence_null(n_s, n_u, k, settings.permutations, settings.seed)
    return settings.nulls[key]


def model_rows(d: ModelData, settings: Settings, keys=None) -> list[Claim]:
    """Every per-model row of the claims table (docs/method.md §13), not yet corrected (`finalize`);
    only the claims in `keys` where given."""
    boot = {"n_boot": settings.bootstrap, "seed": settings.seed}
    want = set(CLAIMS) if keys is None else set(keys)

    def paper(key):
        return paper_number(key, d.kind)

    rows = []
    if "sparsity" in want:
        rows += sparsity_rows(d.name, d.sparsity, d.random, d.natural, paper=paper("sparsity"), **boot)
    for which, key in (("bottom", "recurrence"), ("top", "top_recurrence")):
        if key in want:
            null = _null(settings, *d.entropy.shape) if d.entropy.shape[0] > 1 else None
            rows += recurrence_rows(d.name, d.entropy, settings.fraction, which, amplitude=d.amplitude,
                                    counts=d.counts.get(which, ()), paper=paper(key),
                                    permutations=settings.permutations, null=null, **boot)
    residual_columns = [c for c in (*(c for pair in APPROXIMATIONS.values() for c in pair), UNIFORM)
                        if d.residuals is not None and c in d.residuals.columns]
    orders = (head_sample_residuals(d.residuals, residual_columns)
              if residual_columns and not d.para_not_run and want & set(APPROXIMATIONS) else None)
    for key in APPROXIMATIONS:
        if key in want:
            rows += approximation_rows(d.name, d.residuals, key, paper=paper(key), not_run=d.para_not_run,
                                       source=d.source, crossover_text=d.crossover if key == "paraproduct" else "",
                                       orders=orders, **boot)
    if "smoothness" in want:
        rows += smoothness_row(d.name, d.residuals, paper=paper("smoothness"), not_run=d.theorem1_not_run, **boot)
    if "pruning" in want:
        p = d.prune or {}
        rows += pruning_row(d.name, p.get("auc_low"), p.get("auc_random"), higher_is_better=p.get("higher_is_better", True),
                            metric=p.get("metric", "held-out metric"), others=p.get("others"), paper=paper("pruning"),
                            not_run=d.prune_not_run or "no curves given", **boot)
    if "pruning_bottom" in want:
        p = d.prune or {}
        rows += pruning_bottom_row(d.name, p.get("bottom"), paper=paper("pruning_bottom"),
                                   not_run=d.prune_not_run or "no bottom table given", **boot)
    if "table2" in want:
        rows += table2_row(d.name, d.network_entropy, d.scale_free, paper=paper("table2"))
    if "diffusion" in want:
        rows += diffusion_row(d.name, d.kind, list(d.clusters), paper=paper("diffusion"),
                              not_run=d.diffusion_not_run, **boot)
    return rows


def subset(d: ModelData, rows: np.ndarray) -> ModelData:
    """The model's data on the samples at positions `rows` only."""
    rows = np.asarray(rows)
    ids = set(int(s) for s in d.samples[rows])

    def pick(a):
        return None if a is None else np.asarray(a)[rows]

    res = d.residuals
    if res is not None:
        res = res[res["sample"].isin(ids)].reset_index(drop=True)
    return replace(d, samples=d.samples[rows], entropy=d.entropy[rows], amplitude=pick(d.amplitude),
                   sparsity=d.sparsity[rows], random=d.random[rows], natural=pick(d.natural),
                   network_entropy=d.network_entropy[rows], scale_free=pick(d.scale_free), residuals=res,
                   clusters=tuple(d.clusters[i] for i in rows) if d.clusters else ())


# -- replicates -------------------------------------------------------------------------------------
_SCALED = {c for pair in APPROXIMATIONS.values() for c in pair} | {"uniform_residual"}
_SHIFTED = {"alpha_scores", "alpha_softmax", "alpha_residual"}


def _fig_measure(column: str) -> str:
    """The stability store's name of a theorem1 table column (its paraproduct residual is
    `paraproduct_residual` there)."""
    return "paraproduct_residual" if column == "residual" else column


def _replicate_residuals(residuals: pd.DataFrame, fig: dict, figs: list, r: int, r0: int) -> pd.DataFrame | None:
    """The residual table of replicate r: each replicated (sample, figure head)'s organized rows
    with residuals scaled and exponents shifted by the head's change from the reference r0 (`fig`:
    measure -> (sample, replicate, fig_head)). None where the replicate has no paraproduct (sibling)."""
    if not np.isfinite(fig["paraproduct_residual"][:, r]).all():
        return None
    out = residuals.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        for column in (_SCALED | _SHIFTED) & set(out.columns):
            measure = _fig_measure(column)
            if measure not in fig:
                continue
            v = out[column].to_numpy(dtype=float).copy()
            for i, j, at in figs:
                rep, ref = fig[measure][i, r, j], fig[measure][i, r0, j]
                v[at] = v[at] * (rep / ref) if column in _SCALED else v[at] + (rep - ref)
            out[column] = v
    return out


def replicate_data(d: ModelData, stability_store) -> list[tuple[ModelData, bool]]:
    """The model's data in each replicate analysis of a stability store (docs/method.md §14.4):
    replicate r has, for each sample with replicates, its replicate r and, for every other sample,
    the reference. Changed: the head entropies, the network sparsity (its ratio to the random trees),
    the residual table's replicated figure heads (residuals scaled, exponents shifted by the head's
    change), and the clustering statistic of the replicated samples' diffusion coordinates (against
    the reference sample's null). Returns (data, has_paraproduct) per replicate."""
    stab = store.read_store(stability_store, require=("head_entropy", "sparsity_ratio"))
    pert = stab["perturbation"].values
    reps = np.flatnonzero(pert != REFERENCE)
    r0 = int(np.flatnonzero(pert == REFERENCE)[0])
    sets, _ = replicate_sets(stab, d.entropy)
    ratio = stab["sparsity_ratio"].transpose("sample", "replicate").values
    rows = stab["sample"].values
    pos = {int(s): i for i, s in enumerate(d.samples)}
    at = np.array([pos[int(s)] for s in rows])
    fig, figs = {}, None
    if d.residuals is not None and not d.para_not_run and "paraproduct_residual" in stab:
        fig = {m: stab[m].transpose("sample", "replicate", "fig_head").values for m in FIG_MEASURES if m in stab}
        organized = (d.residuals["order"] == ORGANIZED).to_numpy()
        figs = [(i, j, np.flatnonzero(organized & (d.residuals["sample"] == s).to_numpy()
                                      & (d.residuals["layer"] == la).to_numpy()
                                      & (d.residuals["head"] == he).to_numpy()))
                for i, s in enumerate(rows)
                for j, (la, he) in enumerate(zip(stab["fig_layer"].values, stab["fig_head_index"].values))]
        figs = [f for f in figs if f[2].size] or None
    coords = (stab["diffusion_coords"].transpose("sample", "replicate", "unit", "component").values
              if d.clusters and "diffusion_coords" in stab else None)
    out = []
    for r in reps:
        s = d.sparsity.copy()
        s[at] = ratio[:, r] * d.random[at]
        clusters = d.clusters
        if coords is not None:
            clusters = list(d.clusters)
            for i, p in enumerate(at):
                stat = float(best_silhouette(coords[i, r], rng=np.random.default_rng([d.samples[p], int(r)])))
                clusters[p] = against_null(stat, d.clusters[p].null)
            clusters = tuple(clusters)
        table = _replicate_residuals(d.residuals, fig, figs, int(r), r0) if figs is not None else None
        out.append((replace(d, entropy=sets[r], sparsity=s, clusters=clusters,
                            residuals=table if table is not None else d.residuals), table is not None))
    return out


# -- the page ---------------------------------------------------------------------------------------
def _masked_other(d: ModelData, other_store, other_decomposed, settings: Settings) -> ModelData | None:
    """The model's data with the measures of the 3-D expansions taken under the other masked rule
    (its entropy store and decomposed stores), or None without them."""
    if other_store is None:
        return None
    m = _entropy_measures(other_store)
    decomposed = [other_decomposed] if isinstance(other_decomposed, (str, Path)) else list(other_decomposed or ())
    clusters, not_run = _clusters(decomposed, settings, d.name) if decomposed else (d.clusters, d.diffusion_not_run)
    return replace(d, entropy=m["entropy"], amplitude=m["amplitude"], sparsity=m["sparsity"], random=m["random"],
                   natural=m["natural"], network_entropy=m["network_entropy"], scale_free=m["scale_free"],
                   clusters=clusters, diffusion_not_run=not_run)


def _halves(n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The first and second half of n samples (the first has the extra one); None below 4."""
    if n < 4:
        return None
    h = (n + 1) // 2
    return np.arange(h), np.arange(h, n)


def _replication(final: list, multipliers: dict, datas: dict, settings: Settings, others: dict,
                 stability: dict) -> list:
    """The final rows with their replication columns: split halves, numerical replicates, the other
    masked rule (docs/method.md §13.7)."""
    by_row = {}

    def note(kind, verdicts):
        for k, v in verdicts.items():
            by_row.setdefault(k, {}).setdefault(kind, []).append(v)

    halves_data, alt_data = {}, {}
    for name, d in datas.items():
        split = _halves(d.samples.size)
        if split is not None:
            halves_data[name] = [subset(d, idx) for idx in split]
            for part in halves_data[name]:
                note("half", redecide(model_rows(part, settings), multipliers))
        if stability.get(name):
            for rep, has_para in replicate_data(d, stability[name]):
                keys = None if has_para else [k for k in CLAIMS if k not in APPROXIMATIONS and k != "smoothness"]
                note("replicate", redecide(model_rows(rep, settings, keys), multipliers))
        alt = others.get(name)
        if alt is not None:
            alt_data[name] = alt
            note("masked", redecide(model_rows(alt, settings, MASKED_KEYS), multipliers))
    # the cross-model row on halves and under the other rule
    table2 = {n: (d.kind, d.network_entropy, d.scale_free) for n, d in datas.items()}
    if halves_data and len(halves_data) == len(datas):
        for i in range(2):
            note("half", redecide(table2_order_rows({n: (h[i].kind, h[i].network_entropy, h[i].scale_free)
                                                     for n, h in halves_data.items()}, n_boot=settings.bootstrap,
                                                    seed=settings.seed), multipliers))
    if alt_data:
        note("masked", redecide(table2_order_rows({**table2, **{n: (a.kind, a.network_entropy, a.scale_free)
                                                                for n, a in alt_data.items()}},
                                                  n_boot=settings.bootstrap, seed=settings.seed), multipliers))
    out = []
    for c in final:
        mine = by_row.get((c.key, c.model, c.baseline), {})
        if c.verdict in (NOT_RUN, REPORTED):
            out.append(c)
            continue
        pruning = c.key.startswith("pruning")
        half = ("not applicable: one ablation run" if pruning else
                verdict_text(c.verdict, mine.get("half", []), "halves of the samples") or "too few samples to split")
        robust = ("not replicated: one ablation run" if pruning else
                  verdict_text(c.verdict, mine.get("replicate", []), "numerical replicates") or "not replicated")
        rule, other = "", ""
        models = c.model.split(" vs ")
        rules = {datas[m].masked_rule for m in models if m in datas and datas[m].masked_rule}
        if c.key in MASKED_KEYS and rules:
            rule = ", ".join(sorted(rules))
            if mine.get("masked"):
                v = mine["masked"][0]
                names = sorted({_other_rule(r) for r in rules})
                other = f"{'/'.join(names)}: {v} ({'same verdict' if v == c.verdict else 'the verdict flips'})"
            else:
                other = "not run (claims.both_masked: false)"
        out.append(replace(c, split_half=half, numerically_robust=robust, masked_rule=rule, other_masked_rule=other))
    return out


PROMPT_KEYS = ("sparsity", "recurrence", "top_recurrence", "table2", "diffusion")
"""The claims a set of prompts decides on one model alone, with no training, pruning or every-head
Theorem 1 run (`prompt_claims`)."""


def prompt_claims(name: str, kind: str, entropy_store, table1_csv, decomposed_stores: list, *,
                  fraction: float = 0.1, claims: dict | None = None, stability_store=None) -> pd.DataFrame:
    """The claims table's rows (docs/method.md §13) that one model's samples decide alone
    (`PROMPT_KEYS`), Holm-corrected among themselves, with their split-half replication and,
    given the model's stability store, their numerical replication: what `oattn_lib.analyze`
    reports for a user's prompts. The same rows as the workflow's claims table on the same
    stores, except that the workflow corrects over every row of every model, so its corrected
    p-values are larger or equal.

    Parameters
    ----------
    name, kind : str
        The model's name and kind ("hf", "attention", ...).
    entropy_store, table1_csv, decomposed_stores : paths
        The model's entropy store, Table 1 and decomposed stores (one per sample).
    fraction : float
        Table 1's fraction.
    claims : dict, optional
        The config's `claims` section (bootstrap, permutations, null_draws, seed).
    stability_store : path, optional
        The model's stability store.

    Returns
    -------
    pandas.DataFrame
        `claims.COLUMNS`, one row per test and a summary row per claim with several baselines.
    """
    c = dict(claims or {})
    settings = Settings(fraction=fraction, bootstrap=int(c.get("bootstrap", 2000)),
                        permutations=int(c.get("permutations", 9999)), null_draws=int(c.get("null_draws", 99)),
                        seed=int(c.get("seed", 0)))
    m = _entropy_measures(entropy_store)
    t1 = pd.read_csv(table1_csv)
    counts = {which: [((int(r.layer), int(r.head)), int(str(r.count).split("/")[0]))
                      for r in t1[t1["set"] == which].sort_values("rank").itertuples()] for which in ("bottom", "top")}
    clusters, diff_not_run = _clusters(list(decomposed_stores), settings, name)
    why = "not measured on prompts alone"
    d = ModelData(name=name, kind=kind, samples=m["samples"], entropy=m["entropy"], amplitude=m["amplitude"],
                  sparsity=m["sparsity"], random=m["random"], natural=m["natural"],
                  network_entropy=m["network_entropy"], scale_free=m["scale_free"], counts=counts, residuals=None,
                  para_not_run=why, theorem1_not_run=why, clusters=clusters, diffusion_not_run=diff_not_run,
                  prune=None, prune_not_run=why, masked_rule=m["masked_rule"])
    rows = model_rows(d, settings, PROMPT_KEYS)
    order = list(CLAIMS)
    rows.sort(key=lambda r: order.index(r.key))
    final, multipliers = finalize(rows)
    final = _replication(final, multipliers, {name: d}, settings, {}, {name: stability_store})
    return pd.DataFrame(claims_records(final))


def _other_rule(rule: str) -> str:
    return "keep" if rule == "row_mean" else "row_mean"


def summary(kinds: dict, inputs: dict, outs: dict, fraction: float, claims: dict | None = None) -> None:
    """One Markdown page: the claims first (docs/method.md §13), then training metrics and every
    model's tables.

    kinds: model name -> kind, in config order. inputs: paths named "<key>_<model>", keys
    `metrics` (trained models), `table1`..`table4` (Markdown; 3-4 when prune ran), `table1csv`,
    `table3csv`, `curves` and `bottom` (the prune stage's, when prune ran), `entropy` (store),
    `temperature` (the temperature figure's JSON) and `temperaturecsv` (its curves), `theorem1`
    (the every-head Theorem 1 table, optional) and `theorem1curves` (its curves, optional),
    `decomposed` (the decomposed stores, a list), `stability` (store) and `stabilitymd` (its table)
    where the model has a `stability` section, `maskedentropy` and `maskeddecomposed` (the other
    masked rule's entropy store and decomposed stores, where it ran). claims: the config's `claims`
    section (bootstrap, permutations, null_draws, seed). outs: `md`, and the claims table as
    `claims_csv` and `claims_rst` (reStructuredText, the report's opening page); the Markdown page
    and the report's opening page name the version of oattn and the commit that computed them (`made_by`).
    """
    c = dict(claims or {})
    settings = Settings(fraction=fraction, bootstrap=int(c.get("bootstrap", 2000)),
                        permutations=int(c.get("permutations", 9999)), null_draws=int(c.get("null_draws", 99)),
                        seed=int(c.get("seed", 0)))
    datas = {name: load_model_data(name, kind, inputs, settings) for name, kind in kinds.items()}
    rows = []
    for d in datas.values():
        rows += model_rows(d, settings)
    rows += table2_order_rows({n: (d.kind, d.network_entropy, d.scale_free) for n, d in datas.items()},
                              paper=paper_number("table2_order", "*"), n_boot=settings.bootstrap, seed=settings.seed)
    order = list(CLAIMS)
    rows.sort(key=lambda r: order.index(r.key))           # stable: models in config order within a claim
    final, multipliers = finalize(rows)
    others = {name: _masked_other(d, inputs.get(f"maskedentropy_{name}"), inputs.get(f"maskeddecomposed_{name}"),
                                  settings) for name, d in datas.items()}
    stability = {name: inputs.get(f"stability_{name}") for name in datas}
    final = _replication(final, multipliers, datas, settings, {k: v for k, v in others.items() if v is not None},
                         stability)
    made = made_by()
    store.atomic_write_text(outs["claims_csv"], pd.DataFrame(claims_records(final)).to_csv(index=False))
    store.atomic_write_text(outs["claims_rst"], claims_rst(final) + f"\nComputed by {made}.\n")
    n_tests = sum(1 for r in final if r.test is not None)
    samples = ", ".join(f"{n} {d.samples.size}" for n, d in datas.items())
    lines = ["# oattn results\n", f"Computed by {made}.\n", "## The paper's claims, as measured here\n",
             f"{n_tests} tests, Holm-corrected together; samples per model: {samples} (the paper used 10 per model "
             "and 6 for Table 1; fewer samples widen every interval and raise every mde).\n",
             claims_markdown(final)]
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
    counts = pd.Series([r.verdict for r in final if r.test is not None or r.verdict != REPORTED]).value_counts()
    log.info("claims: %d rows, %d tests; %s", len(final), n_tests, ", ".join(f"{v} {n}" for v, n in counts.items()))
