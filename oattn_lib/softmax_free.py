"""Softmax vs Tensor Attention: what is lost, what is gained, how the heads change (docs/method.md §10.5).

The paper argues that once organized, attention is nearly invariant to its softmax; Tensor
Attention (Zhang, "Deep Tensor Network"; `oattn_lib.tensor_attention`) has no softmax at
all. The experiment trains the same networks (a Transformer-XL and a ViT of the config)
with softmax and with every listed tensor variant, several seeds each and the same number
of steps, then:

- Table 5: validation perplexity (TXL) or test accuracy (ViT), mean, spread, min and max
  over seeds, the difference from softmax, and training seconds per step;
- Figure 8: per-head l1 entropy and l1/l2 sparsity (docs/method.md §6) of every run's organized heads
  (docs/method.md §5.2, on the heads' probs: the matrices the values are multiplied by, softmax or
  normalised T), variant beside variant;
- the paraproduct residual (docs/method.md §7) of the softmax heads: every head of the softmax runs,
  organized by the 2-D questionnaire (docs/method.md §5.3) and unorganized, on its pre-softmax scores.

TXL variants run in their causal prefix form (`tensor_attention`); ViT variants in the
non-causal linear form.

How the workflow runs it: every (model, attention, seed) is a model of the graph, generated
from the config by `run_models` and named `softmax_free/<model>/<attention>/seed<k>`, so its
files sit under `results/softmax_free/<model>/<attention>/seed<k>/` laid out as an ordinary
model's under `results/<model>/` (model/, attention/, organized/, decomposed/, entropy.zarr).
Rule softmax_free_train trains it (`stages.softmax_free_train`); the ordinary extract,
organize, decompose and entropy rules analyse it, one job per sample; softmax_free_paraproduct
adds the residuals of a softmax run (`stages.softmax_free_paraproduct`); softmax_free_table
builds Table 5 and Figure 8 (`stages.softmax_free_table`) from what this module computes.

This module: the runs (`run_models`) and Table 5 from loaded values (`table5_frame`,
`table5_markdown`). Which models the experiment may retrain is a config check
(`config.softmax_free_bases`); Figure 8 is drawn by `plots.softmax_free`. It is imported when
the workflow starts, so pandas is imported only by the functions that use it.
"""
from __future__ import annotations

import numpy as np

from .config import canonical, softmax_free_bases
from .models import adapter_for

__all__ = ["DEFAULT_VARIANTS", "PREFIX", "run_name", "run_models", "run_metric", "table5_frame",
           "table5_markdown"]

DEFAULT_VARIANTS = ("tensor_q", "tensor_k", "tensor_q_relu", "tensor_q_diag", "tensor_q_row")
"""The paper's named variants: T_Q, T_K, ReLU, diagonal and row renormalisation."""

PREFIX = "softmax_free"
"""The experiment's directory under `results/`, and the first part of its runs' names."""


# -- the runs ------------------------------------------------------------------------------
def run_name(model: str, attention: str, seed: int) -> str:
    """The graph's name of one run: also its directory below `results/`."""
    return f"{PREFIX}/{model}/{attention}/seed{seed}"


def run_models(config: dict) -> dict[str, dict]:
    """Every run of the experiment as a model entry of the workflow, by name (`run_name`), in
    Table 5's order: model, then softmax and the variants as listed, then seed.

    An entry is what the ordinary rules read of a model (name, kind, data, arch, train,
    extract), complete and canonical like the validated config: the base model's data, arch
    with `attention` set, train with the run's seed; extract samples `softmax_free.n_samples`
    with the base model's extraction seed (the same inputs for every run), stores what the
    base model stores (its extract.dtype, extract.layers and extract.heads) and analyses
    `softmax_free.quantity`, uncropped. `softmax_free` records the base model, attention,
    seed and `softmax_free.steps`: what rule softmax_free_train reads besides.
    """
    sf = config["softmax_free"]
    runs = {}
    for base in softmax_free_bases(config):
        for attention in ("softmax", *sf["variants"]):
            for seed in range(sf["seeds"]):
                name = run_name(base["name"], attention, seed)
                runs[name] = canonical({
                    "name": name, "kind": base["kind"], "data": base["data"],
                    "arch": {**base["arch"], "attention": attention},
                    "train": {**base["train"], "seed": seed},
                    "extract": {"quantity": sf["quantity"], "n_samples": sf["n_samples"],
                                **{k: base["extract"][k] for k in ("seed", "dtype", "layers", "heads", "masked")}},
                    "softmax_free": {"model": base["name"], "attention": attention, "seed": seed,
                                     "steps": sf["steps"]}})
    return runs


# -- Table 5 ----------------------------------------------------------------------------
def run_metric(kind: str) -> tuple[str, str]:
    """(metrics key, label) of a model kind's quality measure."""
    return adapter_for(kind).validation_metric()


def _spread(x: np.ndarray) -> dict:
    ok = x[np.isfinite(x)]
    if not ok.size:
        return {"mean": np.nan, "sd": np.nan, "min": np.nan, "max": np.nan}
    return {"mean": float(ok.mean()), "sd": float(ok.std(ddof=1)) if ok.size > 1 else 0.0,
            "min": float(ok.min()), "max": float(ok.max())}


def _median(x: np.ndarray) -> float:
    ok = x[np.isfinite(x)]
    return float(np.median(ok)) if ok.size else np.nan


def table5_frame(runs: list[dict]):
    """Table 5 (a DataFrame, one row per (model, attention) in the order the runs come) and
    Figure 8's distributions ({(model, attention): {"entropy", "sparsity", "paraproduct"}}).

    runs: dicts with model, kind, attention, metrics (the run's metrics dict), head_entropy
    and head_sparsity (arrays, any shape; NaN where there is nothing) and paraproduct (an
    (n, 2) array of organized / unorganized residuals, or None). A diverged run (metrics
    "diverged") counts in `seeds` and `diverged`; its heads and residuals are left out.
    """
    import pandas as pd

    if not runs:
        raise ValueError("runs: the experiment has no runs (softmax_free.models and variants)")
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["attention"]), []).append(r)
    rows, dists = [], {}
    for (model, attention), rs in groups.items():
        key, label = run_metric(rs[0]["kind"])
        ms = [r["metrics"] for r in rs]
        values = np.array([m.get(key, np.nan) for m in ms], dtype=float)
        kept = [r for r in rs if not r["metrics"].get("diverged")]
        ent = np.concatenate([np.ravel(r["head_entropy"]) for r in kept] or [np.empty(0)])
        spa = np.concatenate([np.ravel(r["head_sparsity"]) for r in kept] or [np.empty(0)])
        pps = [np.asarray(r["paraproduct"]) for r in kept if r.get("paraproduct") is not None]
        pp = np.concatenate(pps) if pps else None
        dists[(model, attention)] = {"entropy": ent[np.isfinite(ent)], "sparsity": spa[np.isfinite(spa)],
                                     "paraproduct": pp}
        row = {"model": model, "attention": attention, "metric": label, "seeds": len(rs),
               "steps": int(ms[0].get("steps", 0)),
               "diverged": int(sum(bool(m.get("diverged")) for m in ms)),
               **_spread(values), "s_per_step": float(np.nanmean([m.get("seconds_per_step", np.nan) for m in ms])),
               "head_entropy_median": _median(ent), "head_sparsity_median": _median(spa)}
        if pp is not None:
            row["paraproduct_organized"] = float(np.median(pp[:, 0]))
            row["paraproduct_unorganized"] = float(np.median(pp[:, 1]))
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("paraproduct_organized", "paraproduct_unorganized"):
        if col not in df:
            df[col] = np.nan
    soft = df[df["attention"] == "softmax"].set_index("model")["mean"]
    df.insert(df.columns.get_loc("max") + 1, "delta_vs_softmax",
              [r["mean"] - soft.get(r["model"], np.nan) for _, r in df.iterrows()])
    return df, dists


def table5_markdown(df) -> str:
    """Table 5 as Markdown, with the note on what each column is."""
    show = df.copy()
    show["quality (mean ± sd)"] = [f"{m:.4g} ± {s:.2g}" if np.isfinite(m) else "n/a"
                                   for m, s in zip(show["mean"], show["sd"])]
    show["min–max"] = [f"{a:.4g}–{b:.4g}" if np.isfinite(a) else "n/a" for a, b in zip(show["min"], show["max"])]
    show["paraproduct residual (organized / unorganized)"] = [
        f"{a:.3g} / {b:.3g}" if np.isfinite(a) else "" for a, b in
        zip(show["paraproduct_organized"], show["paraproduct_unorganized"])]
    cols = ["model", "attention", "metric", "seeds", "steps", "quality (mean ± sd)", "min–max", "delta_vs_softmax",
            "diverged", "s_per_step", "head_entropy_median", "head_sparsity_median",
            "paraproduct residual (organized / unorganized)"]
    return (show[cols].to_markdown(index=False, floatfmt=".4g") +
            "\n\nquality: validation perplexity (Transformer-XL, lower is better) or test accuracy (ViT, "
            "higher is better) over the training seeds; delta_vs_softmax: difference of the means; "
            "s_per_step: training seconds per optimizer step on this machine. Head entropy (the paper's "
            "coarse l1 entropy) and sparsity (l1/l2 of all bi-Haar coefficients, lower is sparser) are "
            "medians over every head, sample and seed of the organized probs (softmax or normalised T). "
            "Paraproduct residual: median over the softmax heads of the relative residual of their "
            "paraproduct approximation (docs/method.md §7) on their scores, organized by the 2-D questionnaire and "
            "unorganized. s_per_step is measured on a shared machine; bench/attention.py times one layer.\n")
