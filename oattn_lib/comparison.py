"""Two analyses side by side: one model on two sets of prompts, or two models (docs/method.md §15).

Every number compared is a mean over samples, and the sample is the independent unit: intervals
are bootstrap intervals resampling each side's samples, p-values come from permuting the samples'
side labels (every relabelling where there are few enough, else Monte Carlo), and a family of
tests is corrected by Holm.

- Same heads on both sides (one model, two prompt sets): each head's mean entropy rank on each side,
  the change with its interval, and whether it changed: the corrected p-value below `ALPHA` and
  the whole interval beyond the noise floor (the two sides' replicate half-ranges of the mean rank,
  where the stability stage ran on both; zero otherwise, and the table says so).
- Any two analyses: per-sample measures that do not depend on the model's size or the analysed
  quantity's scale (the median scale-free head entropy, the organized network's sparsity gain over
  random trees, the scale-free network entropy), each with its interval and test, and the
  distribution of the heads' mean scale-free entropies as quantiles.

`compare(a, b)` takes two `analyze` results or two workflow result directories
(`results/<model>`); the workflow's `compare` rule writes the same tables, figure and page.
"""
from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from itertools import combinations
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd

from .inference import ALPHA, holm

__all__ = ["Side", "Comparison", "compare", "load_side", "side_from_files", "head_changes", "model_differences", "two_sample"]

LEVEL = 0.95
"""Coverage of every interval."""
NOT_SHOWN = "not shown to change"
MODEL_MEASURES = {
    "median_head_entropy_scale_free": "median over heads of the Haar entropy / Frobenius norm (§6.4)",
    "sparsity_gain_over_random_trees": "log(l1/l2 under random trees / l1/l2 organized) of the network (§6.3)",
    "network_entropy_scale_free": "network l1 entropy / its l2 norm (Table 2, §6.4)",
}
"""The per-sample measures compared between any two analyses, and what each is."""


@dataclass(frozen=True)
class Side:
    """One analysis as compared: its name, heads table, head summary and Table 2 (docs/method.md §15).

    Attributes
    ----------
    name : str
        The side's name in the tables and the page.
    rows : pandas.DataFrame
        One row per (sample, layer, head) (`heads.sample_rows`).
    summary : pandas.DataFrame
        One row per head over the samples (`heads.head_summary`).
    table2 : pandas.DataFrame
        Table 2, one row per sample (docs/method.md §6.4).
    """

    name: str
    rows: pd.DataFrame
    summary: pd.DataFrame
    table2: pd.DataFrame


def side_from_files(name: str, rows, summary, table2) -> Side:
    """A `Side` from a workflow model's heads.parquet, heads_summary.parquet and tables/table2.csv.

    Parameters
    ----------
    name : str
        The side's name.
    rows : str or os.PathLike
        The heads.parquet file.
    summary : str or os.PathLike
        The heads_summary.parquet file.
    table2 : str or os.PathLike
        The tables/table2.csv file.

    Returns
    -------
    Side
        The three tables, read.
    """
    return Side(name, pd.read_parquet(rows), pd.read_parquet(summary), pd.read_csv(table2))


def load_side(source, name: str | None = None) -> Side:
    """A `Side` from an `Analysis`, or from a workflow result directory `results/<model>`.

    Parameters
    ----------
    source : Analysis, str or os.PathLike
        An `analyze` result, or a directory holding heads.parquet, heads_summary.parquet and
        tables/table2.csv.
    name : str, optional
        The side's name; default the analysis's model, or the directory's name.

    Returns
    -------
    Side
        The side's tables.

    Raises
    ------
    ValueError
        Naming the file that is missing.
    """
    if hasattr(source, "heads") and hasattr(source, "head_summary"):
        return Side(name or source.model, source.heads, source.head_summary, source.table2)
    d = Path(source)
    files = {"rows": d / "heads.parquet", "summary": d / "heads_summary.parquet", "table2": d / "tables" / "table2.csv"}
    for f in files.values():
        if not f.is_file():
            raise ValueError(f"{source}: no {f.relative_to(d)} (a workflow result directory, results/<model>, "
                             "written by the rules heads and tables)")
    return side_from_files(name or d.name, files["rows"], files["summary"], files["table2"])


def _weights(n: int, draws: int, rng) -> np.ndarray:
    """(draws, n) resampling weights of n samples, each row summing to 1."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws) / n


def two_sample(xa: np.ndarray, xb: np.ndarray, *, permutations: int, bootstrap: int, seed: int) -> dict:
    """Difference of means over samples, b - a, of each column, with its interval and permutation p-value.

    The p-value is two-sided; the samples are the units (docs/method.md §15).

    Parameters
    ----------
    xa, xb : ndarray of shape (n_a, n_cols) and (n_b, n_cols)
        Per-sample values of each side.
    permutations : int
        Relabellings of the pooled samples; every one of them where there are at most this many.
    bootstrap : int
        Resamplings of each side's samples for the interval.
    seed : int
        The seed of the resamplings and relabellings.

    Returns
    -------
    dict
        `difference`, `ci_low`, `ci_high`, `p` (n_cols,) and `exact` (bool: every relabelling).
        The interval is NaN where a side has one sample, the p-value where both have one.
    """
    xa, xb = np.asarray(xa, dtype=float), np.asarray(xb, dtype=float)
    n_a, n_b = xa.shape[0], xb.shape[0]
    rng = np.random.default_rng(seed)
    diff = xb.mean(0) - xa.mean(0)
    if min(n_a, n_b) > 1:
        boot = _weights(n_b, bootstrap, rng) @ xb - _weights(n_a, bootstrap, rng) @ xa
        lo, hi = np.quantile(boot, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=0)
    else:
        lo = hi = np.full(diff.shape, np.nan)
    pooled, n = np.vstack([xa, xb]), n_a + n_b
    exact = comb(n, n_b) <= permutations
    if exact:
        chosen = np.array(list(combinations(range(n), n_b)))
        members = np.zeros((len(chosen), n), dtype=bool)
        np.put_along_axis(members, chosen, True, axis=1)
    else:
        members = rng.random((permutations, n)).argsort(1) < n_b
    # each relabelling's b-minus-a difference of means, all columns at once: one matrix product
    signs = np.where(members, 1.0 / n_b, -1.0 / n_a)
    null = signs @ pooled
    tol = 1e-12 * np.maximum(1.0, np.abs(diff))
    at_least = (np.abs(null) >= np.abs(diff) - tol).sum(0)
    p = at_least / null.shape[0] if exact else (1 + at_least) / (1 + null.shape[0])
    if n < 3:
        p = np.full(diff.shape, np.nan)
    return {"difference": diff, "ci_low": lo, "ci_high": hi, "p": p, "exact": exact}


def _grid(rows: pd.DataFrame, column: str, units: pd.MultiIndex, side: str) -> np.ndarray:
    g = rows.pivot(index="sample", columns=["layer", "head"], values=column)
    missing = units.difference(g.columns)
    if len(missing):
        raise ValueError(f"{side}: has no head layer {missing[0][0]}, head {missing[0][1]}; the two sides must "
                         "hold the same heads to compare them head by head")
    return g.reindex(columns=units).to_numpy(dtype=float)


def head_changes(a: Side, b: Side, *, permutations: int = 9999, bootstrap: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Each head's mean entropy rank on both sides and whether it changed (module docstring).

    Parameters
    ----------
    a, b : Side
        Two analyses of the same heads (one model, two prompt sets).
    permutations, bootstrap, seed : int
        As in `two_sample`.

    Returns
    -------
    pandas.DataFrame
        One row per head, changed heads first, then by the size of the change: `layer`, `head`,
        `rank_a`, `rank_b` (mean ranks, 1 = lowest entropy), `entropy_a`, `entropy_b`,
        `rank_change` = rank_b - rank_a with `ci_low`, `ci_high`, `p`, `p_adjusted` (Holm over
        the heads), `margin` (the noise floor), `verdict` ("rank changed: lower entropy in b" /
        "... higher ...", or `NOT_SHOWN`), `n_a`, `n_b`.

    Raises
    ------
    ValueError
        Naming the side that lacks a head the other has.
    """
    # every head of either side: _grid names the side that lacks one
    units = pd.MultiIndex.from_frame(pd.concat([a.rows, b.rows])[["layer", "head"]].drop_duplicates()
                                     .sort_values(["layer", "head"]))
    ra, rb = _grid(a.rows, "entropy_rank", units, a.name), _grid(b.rows, "entropy_rank", units, b.name)
    ea, eb = _grid(a.rows, "head_entropy", units, a.name), _grid(b.rows, "head_entropy", units, b.name)
    t = two_sample(ra, rb, permutations=permutations, bootstrap=bootstrap, seed=seed)
    margin = np.zeros(len(units))
    replicated = all({"rank_replicates_low", "rank_replicates_high"} <= set(s.summary.columns) for s in (a, b))
    if replicated:
        for s in (a, b):
            half = s.summary.set_index(["layer", "head"]).reindex(units)
            margin += ((half["rank_replicates_high"] - half["rank_replicates_low"]) / 2).to_numpy(dtype=float)
    p_adj = holm(t["p"])
    beyond = (t["ci_low"] > margin) | (t["ci_high"] < -margin)
    changed = (p_adj < ALPHA) & beyond
    verdict = np.where(changed, np.where(t["difference"] < 0, "rank changed: lower entropy in b",
                                         "rank changed: higher entropy in b"), NOT_SHOWN)
    out = pd.DataFrame({"layer": units.get_level_values(0), "head": units.get_level_values(1),
                        "rank_a": ra.mean(0), "rank_b": rb.mean(0), "entropy_a": ea.mean(0), "entropy_b": eb.mean(0),
                        "rank_change": t["difference"], "ci_low": t["ci_low"], "ci_high": t["ci_high"], "p": t["p"],
                        "p_adjusted": p_adj, "margin": margin if replicated else np.nan, "verdict": verdict,
                        "n_a": ra.shape[0], "n_b": rb.shape[0]})
    out["changed"] = changed
    return (out.assign(size=-np.abs(out["rank_change"])).sort_values(["changed", "size"], ascending=[False, True],
                                                                     kind="stable")
            .drop(columns="size").reset_index(drop=True))


def _per_sample(s: Side) -> pd.DataFrame:
    """The per-sample measures of MODEL_MEASURES, indexed by sample."""
    med = s.rows.groupby("sample")["head_entropy_scale_free"].median()
    t2 = s.table2.set_index("sample")
    return pd.DataFrame({
        "median_head_entropy_scale_free": med,
        "sparsity_gain_over_random_trees": np.log(t2["network_sparsity_random_trees"] / t2["network_sparsity"]),
        "network_entropy_scale_free": t2["network_entropy_scale_free"]}).dropna()


def model_differences(a: Side, b: Side, *, permutations: int = 9999, bootstrap: int = 2000,
                      seed: int = 0) -> pd.DataFrame:
    """The measures of any two analyses, b against a (module docstring).

    Parameters
    ----------
    a, b : Side
        The two analyses, of the same model or of two models.
    permutations, bootstrap, seed : int
        As in `two_sample`.

    Returns
    -------
    pandas.DataFrame
        One row per measure of `MODEL_MEASURES` (tested: `difference` = mean b - mean a with
        `ci_low`, `ci_high`, `p`, `p_adjusted` Holm over these rows, `verdict`), then the 10th,
        50th and 90th percentiles of the heads' mean scale-free entropies (reported, no test).
        Columns `a`, `a_low`, `a_high`, `b`, `b_low`, `b_high` hold each side's mean and interval
        over its samples; `unit` and `n_a`, `n_b` the units.
    """
    pa, pb = _per_sample(a), _per_sample(b)
    cols = list(MODEL_MEASURES)
    t = two_sample(pa[cols].to_numpy(), pb[cols].to_numpy(), permutations=permutations, bootstrap=bootstrap,
                   seed=seed)
    rng = np.random.default_rng(seed + 1)
    q = [(1 - LEVEL) / 2, (1 + LEVEL) / 2]
    sides = {}
    for key, p in (("a", pa), ("b", pb)):
        x = p[cols].to_numpy(dtype=float)
        lo, hi = (np.quantile(_weights(len(x), bootstrap, rng) @ x, q, axis=0) if len(x) > 1
                  else (np.full(len(cols), np.nan),) * 2)
        sides[key] = (x.mean(0), lo, hi)
    p_adj = holm(t["p"])
    verdict = np.where((p_adj < ALPHA) & ((t["ci_low"] > 0) | (t["ci_high"] < 0)),
                       np.where(t["difference"] > 0, "higher in b", "lower in b"), "no difference shown")
    out = pd.DataFrame({"measure": cols, "what": [MODEL_MEASURES[c] for c in cols],
                        "a": sides["a"][0], "a_low": sides["a"][1], "a_high": sides["a"][2],
                        "b": sides["b"][0], "b_low": sides["b"][1], "b_high": sides["b"][2],
                        "difference": t["difference"], "ci_low": t["ci_low"], "ci_high": t["ci_high"], "p": t["p"],
                        "p_adjusted": p_adj, "verdict": verdict, "unit": "sample", "n_a": len(pa), "n_b": len(pb)})
    heads_a = a.rows.groupby(["layer", "head"])["head_entropy_scale_free"].mean()
    heads_b = b.rows.groupby(["layer", "head"])["head_entropy_scale_free"].mean()
    reported = [{"measure": f"head_entropy_scale_free_p{int(100 * p)}",
                 "what": f"{int(100 * p)}th percentile of the heads' mean scale-free entropies",
                 "a": float(np.quantile(heads_a, p)), "b": float(np.quantile(heads_b, p)),
                 "difference": float(np.quantile(heads_b, p) - np.quantile(heads_a, p)),
                 "verdict": "reported (no test)", "unit": "head", "n_a": len(heads_a), "n_b": len(heads_b)}
                for p in (0.1, 0.5, 0.9)]
    return pd.concat([out, pd.DataFrame(reported)], ignore_index=True)


def _same_heads(a: Side, b: Side) -> bool:
    key = ["layer", "head"]
    return a.summary[key].sort_values(key).reset_index(drop=True).equals(
        b.summary[key].sort_values(key).reset_index(drop=True))


MEANING = ("A head's rank changed where its mean entropy rank differs between the two sets of samples beyond "
           "chance (a permutation test over samples, Holm-corrected over the heads) and beyond the noise floor (the "
           "replicates' spread of the mean rank, where both sides have replicates). It says that the prompts move "
           "the head's place in the network's ranking, not why; 'not shown to change' is no evidence that it stays: "
           "few samples give wide intervals. Comparing heads one by one assumes the same heads on both sides (one "
           "model); between two models only the per-sample measures, which do not depend on the model's size or "
           "the quantity's scale, are tested.")
"""What the comparison's verdicts can and cannot mean."""


@dataclass(frozen=True)
class Comparison:
    """`compare`'s result, with `figure()` (the figure) and `page(path)` (one HTML page).

    Attributes
    ----------
    a, b : Side
        The two analyses.
    heads : pandas.DataFrame or None
        `head_changes`: each head's mean rank on both sides and whether it changed; None for
        two models.
    models : pandas.DataFrame
        `model_differences`: the per-sample measures, b against a.
    """

    a: Side
    b: Side
    heads: pd.DataFrame | None
    models: pd.DataFrame

    def figure(self):
        """The comparison's figure (`plots.comparison.fig_comparison`).

        The distributions of the heads' scale-free entropies and of the sparsity gains, the
        heads' diffusion maps, and each head's rank on both sides where the heads are compared
        one by one.

        Returns
        -------
        matplotlib.figure.Figure
            The figure.
        """
        from .plots.comparison import fig_comparison

        sides = (self.a, self.b)
        entropy = [s.rows.groupby(["layer", "head"])["head_entropy_scale_free"].mean().to_numpy() for s in sides]
        gain = [_per_sample(s)["sparsity_gain_over_random_trees"].to_numpy() for s in sides]
        first = [s.rows[s.rows["sample"] == s.rows["sample"].min()] for s in sides]
        ranks = None
        if self.heads is not None:
            h = self.heads
            ranks = (h["rank_a"], h["rank_b"], h["ci_low"], h["ci_high"], h["changed"])
        return fig_comparison((self.a.name, self.b.name), entropy, gain,
                              [f[["diffusion_1", "diffusion_2"]].to_numpy(dtype=float) for f in first],
                              [f["layer"].to_numpy() for f in first], ranks)

    def page(self, path) -> Path:
        """Write one self-contained HTML page: what the verdicts mean, both tables and the figure.

        Without a head-by-head table, the page says why. Written atomically.

        Parameters
        ----------
        path : str or os.PathLike
            The HTML file.

        Returns
        -------
        pathlib.Path
            `path`.
        """
        from html import escape

        from . import store

        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=110)
        png = base64.b64encode(buf.getvalue()).decode()
        fmt = {"float_format": lambda x: f"{x:.4g}", "index": False, "border": 0}
        heads = ("<h2>Heads</h2><p>Not compared head by head: two models, whose heads are not the same heads.</p>"
                 if self.heads is None else "<h2>Heads (one model, two sets of samples)</h2>" + self.heads.to_html(**fmt))
        html = (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(self.a.name)} vs "
                f"{escape(self.b.name)}</title><style>body{{font-family:sans-serif;max-width:1200px;margin:auto}}"
                "td,th{padding:2px 8px;text-align:right}</style></head><body>"
                f"<h1>{escape(self.a.name)} (a) vs {escape(self.b.name)} (b)</h1><p>{escape(MEANING)}</p>"
                f"<h2>Measures per sample</h2>{self.models.to_html(**fmt)}{heads}"
                f"<h2>Figure</h2><img alt='comparison' style='max-width:100%' src='data:image/png;base64,{png}'>"
                "</body></html>")
        return store.atomic_write_text(path, html)

    def _repr_html_(self) -> str:
        fmt = {"float_format": lambda x: f"{x:.4g}", "index": False}
        changed = "" if self.heads is None else (
            f"<p>{int(self.heads['changed'].sum())} of {len(self.heads)} heads changed rank</p>"
            + self.heads.head(10).to_html(**fmt))
        return f"<div><p><b>{self.a.name} vs {self.b.name}</b></p>{self.models.to_html(**fmt)}{changed}</div>"


def compare(a, b, *, names: tuple[str, str] | None = None, heads: bool | None = None, permutations: int = 9999,
            bootstrap: int = 2000, seed: int = 0) -> Comparison:
    """Two analyses side by side (module docstring).

    Parameters
    ----------
    a, b : Analysis, str or os.PathLike
        `analyze` results, or workflow result directories (`results/<model>`).
    names : (str, str), optional
        The sides' names; default the models' names.
    heads : bool, optional
        Compare head by head (one model on two sets of prompts); default: where both sides hold
        the same (layer, head) pairs. Pass False for two models that merely share a shape.
    permutations, bootstrap, seed : int
        As in `two_sample`.

    Returns
    -------
    Comparison
        The two sides, `head_changes` (or None) and `model_differences`.

    Raises
    ------
    ValueError
        Naming a workflow result directory that lacks a file, or the side that lacks a head
        the other has where the heads are compared one by one.
    """
    na, nb = names or (None, None)
    sa, sb = load_side(a, na), load_side(b, nb)
    if sa.name == sb.name:
        sb = Side(sb.name + " (b)", sb.rows, sb.summary, sb.table2)
    same = _same_heads(sa, sb) if heads is None else bool(heads)
    kwargs = {"permutations": permutations, "bootstrap": bootstrap, "seed": seed}
    return Comparison(sa, sb, head_changes(sa, sb, **kwargs) if same else None, model_differences(sa, sb, **kwargs))
