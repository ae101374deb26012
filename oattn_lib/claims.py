"""The paper's claims, each beside the sentence of the paper it tests, the number measured here
that tests it and a verdict derived from what that sentence says (docs/method.md §13).

Per model:

- sparsity: the network l1/l2 of all tri-Haar coefficients (docs/method.md §6.3) under the
  organized trees against balanced trees in the natural order and on random permutations;
- recurrence and top recurrence: the mean Jaccard index of the bottom (top) entropy head sets
  between every pair of samples, against its chance level (Table 1's two sides);
- paraproduct (Theorem 1): the relative residual of the paraproduct at tau = 1, its size and
  whether the 2-D organized order beats the original and random orders head-sample by head-sample;
- smoothness (Theorem 1, the residual in Lambda^{2 alpha}) and Corollary 1 (A' = A'' = 1): from
  the every-head Theorem 1 table where one was computed;
- pruning: the area under the held-out metric curve masking lowest entropy first, and the
  metric with the bottom `fraction` of heads masked, against random orders (docs/method.md §11.3);
- Table 2: the network l1 entropy's range, raw and divided by the tensor's l2 norm, and across
  models of several kinds whether their order survives that scale-free measure;
- diffusion: the silhouette of the heads grouped by layer in the diffusion coordinates against
  shuffled layer labels (Figure 3's continuous or clustered map).

Every verdict is HOLDS, NOT_HERE or MIXED, decided from the numbers by the rule in `RULES`
(all of them in `RULES_TEXT`, the tables' note); NOT_RUN says why a claim was not measured, and
REPORTED marks a row of numbers with no verdict of its own (the cross-model row compares them).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from math import comb

import numpy as np
import pandas as pd

__all__ = ["HOLDS", "MIXED", "NOT_HERE", "NOT_RUN", "REPORTED", "RULES", "RULES_TEXT", "CLAIMS", "QUOTES", "Claim",
           "chance_jaccard", "claim_key", "claims_markdown", "claims_records", "claims_rst", "corollary1_claim",
           "diffusion_claim", "head_sample_residuals", "layer_silhouette_test", "paper_number", "paraproduct_claim",
           "pruning_bottom_claim", "pruning_claim", "recurrence_claim", "sign_test", "silhouette",
           "smoothness_claim", "sparsity_claim", "stability_text", "table2_claim", "table2_order_claim"]

HOLDS, NOT_HERE, MIXED, NOT_RUN = "holds", "does not hold here", "mixed", "not run"
REPORTED = "reported (no verdict of its own)"

SPARSITY_MARGIN = 0.95
RECURRENCE_HOLDS = 0.5
RECURRENCE_CHANCE_FACTOR = 2.0
SIGN_TEST_P = 0.05
"""The one-sided sign test's level: organizing helps where it wins significantly more than half the pairs."""
PRUNING_SDS = 2.0
CLUSTER_P = 0.05
"""A sample's heads are clustered by layer where their silhouette is positive and its permutation p-value
below this."""
PERMUTATIONS = 200
ORGANIZED, ORIGINAL, RANDOM_ORDERS = "2-D organized", "original", "random"
"""The orders of a residual table's `order` column (the temperature figure's)."""

CLAIMS = {
    "sparsity": "the organized network is sparse in the tri-Haar basis",
    "recurrence": "the same heads do the least processing in every batch (bottom-entropy heads recur)",
    "top_recurrence": "the same heads do the most processing in every batch (top-entropy heads recur)",
    "paraproduct": "the paraproduct of an organized head approximates its softmax (Theorem 1)",
    "smoothness": "the paraproduct's residual lies in a smoother class than the softmax (Theorem 1, Λ^2α)",
    "corollary1": "with A′ = A″ = 1 the paraproduct still approximates the softmax (Corollary 1)",
    "pruning": "low-entropy heads could be pruned",
    "pruning_bottom": "the bottom-entropy heads could be removed (Table 1's bottom fraction masked)",
    "table2": "network l1 entropy per model (Table 2), raw and scale-free",
    "table2_order": "TXL's network l1 entropies are larger than ViT's (Table 2): the order on a scale-free measure",
    "diffusion": "the diffusion map of heads is continuous (TXL) or clustered (ViT) (Figure 3)",
}
"""Each claim's key and its wording in the table; rows are grouped in this order."""

QUOTES = {
    "sparsity": "“one can use the network 3-tensor organization for empirical network applications such as model "
                "pruning (by virtue of network sparsity) and network architecture comparison” (Abstract)",
    "recurrence": "“This suggests, the same attention heads do most of the processing regardless of the data seen, "
                  "and perhaps more consequentially, the same attention heads do the fewest processing.” (App. B.1)",
    "top_recurrence": "“This suggests, the same attention heads do most of the processing regardless of the data "
                      "seen” (App. B.1)",
    "paraproduct": "“We show theoretically - and supplement with computational examples - that if one produces an "
                   "intrinsic organization of the attention head to have some regularity, the self-attention "
                   "mechanism is invariant to the softmax function.” (paper §1)",
    "smoothness": "“Suppose A ∈ C², f ∈ Λ^α([0,1]²), 0 < α < 1/2, then we obtain the following discrete multiscale "
                  "tensor decomposition of A(f): … Δ_{N,N′}(A,f) = A(f) − Ã(f) ∈ Λ^{2α}([0,1]²)” (Theorem 1, "
                  "eq. 14)",
    "corollary1": "“then the softmax activation on a mixed α-Holder attention head can be decomposed into: A(f̃) = "
                  "[P^{j+1}P′^{j′+1}(f) − P^jP′^{j′+1}(f) − P^{j+1}P′^{j′}(f) + P^jP′^{j′}(f)] + [P^{j+1}P′^{j′}(f) − "
                  "P^jP′^{j′}(f)][P^jP′^{j′+1}(f) − P^jP′^{j′}(f)] + Δ_{N,N′}(A,f)” (Corollary 1, eq. 18)",
    "pruning": "“the head with low l₁ entropy do little processing and could be discarded.” (paper §3.2)",
    "pruning_bottom": "“The latter result implies one could remove attention heads with low l₁ entropy invariant to "
                      "data from the network, potentially saving computation time.” (App. B.1, of the bottom 10 "
                      "percent)",
    "table2": "“Of note, the l₁ entropies for TXL are consistently comparatively larger than VIT which can be "
              "interpreted as the TXL network processing more high frequency content than VIT due to the "
              "architectural set-up, but it is most likely related to the data being processed.” (App. B.2)",
    "diffusion": "“The diffusion map on the TXL network exhibits some continuous structure, while the VIT network "
                 "is more clustered and contains some outliers.” (paper §3.2)",
}
"""The paper's sentence each claim tests (arXiv 2506.15541), with where it stands."""
QUOTES["table2_order"] = QUOTES["table2"]

RULES = {
    "sparsity": (f"sparsity (organization gives network sparsity: the organized tensor must be sparser than the "
                 f"same tensor unorganized) holds if the organized network l1/l2 is below {SPARSITY_MARGIN} x that "
                 f"of balanced trees in the natural order and below {SPARSITY_MARGIN} x that of random trees in "
                 f"every sample; it does not hold if its mean ratio to either baseline is >= 1; otherwise mixed. "
                 f"A run whose Table 2 has no natural-order column is judged against random trees only, and says so"),
    "recurrence": (f"recurrence, bottom and top (the same heads regardless of the data): holds if the mean Jaccard "
                   f"index of the bottom (top) sets over pairs of samples is >= {RECURRENCE_HOLDS}; does not hold "
                   f"if it is below {RECURRENCE_CHANCE_FACTOR:g} x its chance level (two random sets of the same "
                   f"size); otherwise mixed"),
    "paraproduct": (f"paraproduct (the approximation works, and it works because of the organization): the "
                    f"relative residual at τ = 1 per head-sample, no pass mark; (a) it approximates: the organized "
                    f"residual is < 1 (better than predicting zero) in more than half the head-samples; (b) "
                    f"organizing helps: the organized residual is below the original order's and below the random "
                    f"orders' (geometric mean over seeds) in significantly more than half the head-sample pairs, "
                    f"each by a one-sided sign test (ties dropped) at p < {SIGN_TEST_P}. Holds if (a) and (b); does "
                    f"not hold if not (a), or if the organized residual is below a baseline's in at most half the "
                    f"pairs; otherwise mixed"),
    "smoothness": (f"smoothness (the residual in Λ^2α for f in Λ^α): holds if the residual's Hölder-type exponent "
                   f"(from the decay of its Haar coefficients across scales) exceeds the softmax's in the organized "
                   f"order in significantly more than half the head-samples (one-sided sign test, p < "
                   f"{SIGN_TEST_P}); does not hold if it does in at most half; otherwise mixed"),
    "corollary1": "Corollary 1 (A′ = A″ = 1): the paraproduct's rule, on the residual of that approximation",
    "pruning": (f"pruning (low-entropy heads could be discarded): holds if the area under the held-out metric "
                f"curve masking lowest entropy first beats the random orders' mean by >= {PRUNING_SDS:g} sd, "
                f"does not hold if it does not beat their mean, otherwise mixed; the bottom-fraction row applies "
                f"the same rule to the metric with the bottom fraction of heads masked"),
    "table2": ("Table 2 (TXL's entropies larger than ViT's): each model's rows report; across models of different "
               "kinds the order of their raw means holds if every such pair keeps it on the scale-free measure "
               "(network l1 entropy / l2 norm of the tensor) with disjoint sample ranges, does not hold if a pair's "
               "order is reversed with disjoint ranges, and is mixed where ranges overlap"),
    "diffusion": (f"diffusion map (TXL continuous, ViT clustered): a sample is clustered by layer if the "
                  f"silhouette of its heads grouped by layer in the diffusion coordinates is positive and beats "
                  f"{PERMUTATIONS} shuffles of the layer labels at p < {CLUSTER_P}; a clustered reading (ViT, and "
                  f"kinds the paper has no map of) holds if most samples are clustered, does not hold if none is; "
                  f"the continuous reading (TXL: no clustering by layer) holds if most samples are not clustered, "
                  f"does not hold if every sample is; otherwise mixed"),
}
"""Each verdict's rule, derived from the claim's sentence (QUOTES)."""
RULES_TEXT = "Verdicts, computed from the numbers by these rules: " + "; ".join(RULES.values()) + "."

PAPER = {
    ("sparsity", "txl"): "no baseline; coefficient decay shown (Fig. 4), network l1 entropy 1200-2476 (Table 2)",
    ("sparsity", "vit"): "no baseline; coefficient decay shown (Fig. 4), network l1 entropy 2.47-9.77 (Table 2)",
    ("recurrence", "txl"): "bottom heads (6,0), (7,5), (3,5) each in 6/6 batches (Table 1)",
    ("recurrence", "vit"): "bottom heads (2,4), (3,10), (1,11) each in 6/6 batches (Table 1)",
    ("top_recurrence", "txl"): "top heads (13,3), (1,0), (7,7) each in 6/6 batches (Table 1)",
    ("top_recurrence", "vit"): "top heads (2,5), (3,6), (2,10) each in 6/6 batches (Table 1)",
    ("paraproduct", "txl"): "none: shown, not measured (Fig. 2)",
    ("paraproduct", "vit"): "none: shown, not measured (Fig. 2)",
    ("smoothness", "txl"): "none: stated (Theorem 1, eq. 14), not measured",
    ("smoothness", "vit"): "none: stated (Theorem 1, eq. 14), not measured",
    ("corollary1", "txl"): "none: stated (Corollary 1, eq. 18), not measured",
    ("corollary1", "vit"): "none: stated (Corollary 1, eq. 18), not measured",
    ("pruning", "txl"): "none: suggested, not measured (Sec. 3.2, App. B.1)",
    ("pruning", "vit"): "none: suggested, not measured (Sec. 3.2, App. B.1)",
    ("pruning_bottom", "txl"): "none: bottom 10% heads listed (Table 1), not removed",
    ("pruning_bottom", "vit"): "none: bottom 10% heads listed (Table 1), not removed",
    ("table2", "txl"): "network l1 entropy 1200.20-2476.25 over 5 batches (Table 2), raw only",
    ("table2", "vit"): "network l1 entropy 2.47-9.77 over 5 batches (Table 2), raw only",
    ("table2_order", "*"): "TXL 1200-2476 vs. ViT 2.47-9.77, raw (Table 2)",
    ("diffusion", "txl"): "“some continuous structure”, one batch (Fig. 3a)",
    ("diffusion", "vit"): "“more clustered and contains some outliers”, one batch (Fig. 3d)",
}
"""The paper's number for a (claim, model kind), from its text; the paper has no hf model.
The cross-model row's kind is "*"."""

DIFFUSION_READING = {"txl": "continuous"}
"""The structure the paper reads in a kind's diffusion map (Figure 3); every other kind is read as
clustered, the paper's reading of ViT."""


def paper_number(claim: str, kind: str) -> str:
    """What the paper reports for `claim` (a key of CLAIMS) on a model of `kind` ("" where it has no such model)."""
    if claim not in CLAIMS:
        raise ValueError(f"claim: expected one of {sorted(CLAIMS)}, got {claim!r}")
    return PAPER.get((claim, kind), "")


def claim_key(claim_text: str) -> str:
    """The key of CLAIMS whose wording is `claim_text`."""
    for k, v in CLAIMS.items():
        if v == claim_text:
            return k
    raise ValueError(f"claim_text: not a claim's wording: {claim_text!r}")


@dataclass(frozen=True)
class Claim:
    """One row of the claims table: a claim, a model, what was measured and the verdict."""

    claim: str
    model: str
    measured: str
    paper: str
    verdict: str
    value: float | None = None
    """The number the verdict is decided on (see each claim's function); None when not run."""
    stability: str = ""
    """Whether the verdict survives the replicate analyses (`stability_text`); "" when they were not run."""
    quote: str = ""
    """The paper's sentence the claim tests (QUOTES)."""


def _claim(key: str, model: str, measured: str, paper: str, verdict: str, value: float | None = None) -> Claim:
    return Claim(CLAIMS[key], model, measured, paper, verdict, value, quote=QUOTES[key])


def _not_run(key: str, model: str, why: str, paper: str = "") -> Claim:
    return _claim(key, model, f"not run: {why}", paper, NOT_RUN)


def chance_jaccard(n: int, k: int) -> float:
    """Expected Jaccard index of two independent uniformly random k-subsets of n items.

    The overlap i is hypergeometric, P(i) = C(k, i) C(n - k, k - i) / C(n, k), and the
    Jaccard index of two k-sets with overlap i is i / (2k - i).
    """
    if not 0 < k <= n:
        raise ValueError(f"k: expected 1..{n}, got {k}")
    total = comb(n, k)
    return sum(comb(k, i) * comb(n - k, k - i) / total * i / (2 * k - i) for i in range(1, k + 1))


def sign_test(wins: int, n: int) -> float:
    """One-sided sign test: P(X >= wins) for X ~ Binomial(n, 1/2), the chance of `wins` or more of
    `n` untied pairs going one way when neither way is favoured; 1 when there is no pair."""
    from scipy.stats import binomtest

    if n == 0:
        return 1.0
    if not 0 <= wins <= n:
        raise ValueError(f"wins: expected 0..{n}, got {wins}")
    return float(binomtest(int(wins), int(n), 0.5, alternative="greater").pvalue)


def _g(x: float | None) -> str:
    return "not finite" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _range(x) -> str:
    x = np.asarray(x, dtype=float)
    return f"{_g(float(np.median(x)))} (range {_g(float(x.min()))}–{_g(float(x.max()))})"


# -- sparsity -------------------------------------------------------------------------------------
def sparsity_claim(model: str, sparsity, sparsity_random, sparsity_natural=None, paper: str = "") -> Claim:
    """Sparsity from the per-sample network l1/l2 under the organized trees, random trees and (None:
    not in this run's Table 2) balanced trees in the natural order. Value: the larger mean ratio."""
    s = np.asarray(sparsity, dtype=float)
    ratios = {"random trees": s / np.asarray(sparsity_random, dtype=float)}
    if sparsity_natural is not None:
        ratios = {"natural order": s / np.asarray(sparsity_natural, dtype=float), **ratios}
    means = {b: float(r.mean()) for b, r in ratios.items()}
    if all(np.all(r < SPARSITY_MARGIN) for r in ratios.values()):
        verdict = HOLDS
    elif any(m >= 1 for m in means.values()):
        verdict = NOT_HERE
    else:
        verdict = MIXED
    parts = [f"organized / {b}: {means[b]:.3g} (range {r.min():.3g}-{r.max():.3g}; below {SPARSITY_MARGIN} in "
             f"{int((r < SPARSITY_MARGIN).sum())}/{r.size} samples)" for b, r in ratios.items()]
    measured = "network l1/l2 of all tri-Haar coefficients, " + "; ".join(parts)
    if sparsity_natural is None:
        measured += ("; against random trees only: this run's Table 2 has no natural-order column "
                     "(network_sparsity_natural_trees)")
    return _claim("sparsity", model, measured, paper, verdict, max(means.values()))


# -- recurrence -----------------------------------------------------------------------------------
def recurrence_claim(model: str, jaccard_mean: float, n_heads: int, k: int, counts, n_samples: int,
                     paper: str = "", which: str = "bottom") -> Claim:
    """Recurrence of the bottom (or top, `which`) entropy heads from the mean Jaccard index of their
    sets over pairs of samples; `counts` are the most frequent heads ((layer, head), count) as in Table 1."""
    if which not in ("bottom", "top"):
        raise ValueError(f"which: must be 'bottom' or 'top', got {which!r}")
    chance = chance_jaccard(n_heads, k)
    j = float(jaccard_mean)
    verdict = HOLDS if j >= RECURRENCE_HOLDS else NOT_HERE if j < RECURRENCE_CHANCE_FACTOR * chance else MIXED
    heads = ", ".join(f"({la},{he}) {c}/{n_samples}" for (la, he), c in counts)
    measured = (f"{which}-{k}-of-{n_heads} Jaccard across {n_samples} samples: {j:.3g} (chance {chance:.3g}); "
                f"most frequent {which} heads {heads}")
    return _claim("recurrence" if which == "bottom" else "top_recurrence", model, measured, paper, verdict, j)


# -- Theorem 1 and Corollary 1 ---------------------------------------------------------------------
def head_sample_residuals(table: pd.DataFrame, column: str = "residual") -> pd.DataFrame:
    """One row per head-sample (sample, layer, head), one column per order: the `column` of the 2-D
    organized and original orders and the geometric mean over the random orders' seeds.

    table : DataFrame with columns sample, layer, head, order and `column` (random orders: one row
    per seed). A NaN residual (the paraproduct not representable in float64) counts as +inf,
    worse than any other; an order a head-sample lacks is NaN.
    """
    missing = [c for c in ("sample", "layer", "head", "order", column) if c not in table.columns]
    if missing:
        raise ValueError(f"table: missing columns {missing}, has {list(table.columns)}")
    v = table[column].to_numpy(dtype=float)
    with np.errstate(divide="ignore"):
        logs = np.log(np.where(np.isnan(v), np.inf, v))
    t = table[["sample", "layer", "head", "order"]].assign(log=logs)
    wide = np.exp(t.groupby(["sample", "layer", "head", "order"])["log"].mean()).unstack("order")
    return wide


def _wins(x: pd.Series, y: pd.Series) -> tuple[int, int, int]:
    """How many pairs have x < y, how many tie, and how many pairs there are (both present)."""
    both = pd.concat([x, y], axis=1).dropna()
    a, b = both.iloc[:, 0].to_numpy(), both.iloc[:, 1].to_numpy()
    return int((a < b).sum()), int((a == b).sum()), len(both)


def paraproduct_claim(model: str, table: pd.DataFrame | None, crossover_text: str = "", paper: str = "",
                      not_run: str | None = None, column: str = "residual", source: str = "",
                      key: str = "paraproduct") -> Claim:
    """Theorem 1's approximation from the relative residuals at tau = 1 of every head-sample.

    table : DataFrame with columns sample, layer, head, order ("2-D organized", "original",
    "random"), seed and `column` (`head_sample_residuals`). `not_run`: why the residuals were not
    computed (the claim is then not run). `key`: "corollary1" judges Corollary 1's residual by the
    same rule. Value: the organized residual's median over head-samples.
    """
    if not_run:
        return _not_run(key, model, not_run, paper)
    wide = head_sample_residuals(table, column)
    if ORGANIZED not in wide or wide[ORGANIZED].isna().all():
        return _not_run(key, model, f"no {ORGANIZED} residuals in the table", paper)
    o = wide[ORGANIZED].dropna()
    n = o.size
    below1 = int((o < 1).sum())
    approximates = below1 > n / 2
    parts, helps, worse = [], True, False
    for b, name in ((ORIGINAL, "the original order"), (RANDOM_ORDERS, "the random orders")):
        if b not in wide or wide[b].isna().all():
            parts.append(f"no {b} order measured")
            helps = False
            continue
        wins, ties, pairs = _wins(wide[ORGANIZED], wide[b])
        p = sign_test(wins, pairs - ties)
        helps &= p < SIGN_TEST_P
        worse |= wins <= pairs / 2
        parts.append(f"below {name} in {wins}/{pairs} (sign test p = {p:.2g})")
    verdict = NOT_HERE if not approximates or worse else HOLDS if helps else MIXED
    what = "residual of the approximation with A′ = A″ = 1" if key == "corollary1" else "relative residual"
    others = "; ".join(f"{label} {_range(wide[b].dropna())}" for b, label in
                       ((ORIGINAL, "original order"), (RANDOM_ORDERS, "random orders (geometric mean over seeds)"))
                       if b in wide and wide[b].notna().any())
    measured = (f"{what} at τ = 1 over {n} head-samples{f' ({source})' if source else ''}: organized "
                f"{_range(o)}, below 1 in {below1}/{n}" + (f"; {others}" if others else "") + "; organized "
                + ", ".join(parts) + (f"; {crossover_text}" if crossover_text else ""))
    med = float(np.median(o))
    return _claim(key, model, measured, paper, verdict, med if np.isfinite(med) else None)


def corollary1_claim(model: str, table: pd.DataFrame | None, paper: str = "", not_run: str | None = None,
                     source: str = "") -> Claim:
    """Corollary 1 (A' = A'' = 1) by the paraproduct's rule on the table's `corollary1_residual`."""
    return paraproduct_claim(model, table, paper=paper, not_run=not_run, column="corollary1_residual",
                             source=source, key="corollary1")


def smoothness_claim(model: str, table: pd.DataFrame | None, paper: str = "", not_run: str | None = None) -> Claim:
    """Theorem 1's residual in Lambda^{2 alpha}: the Hölder-type exponents of the residual and of the
    softmax (`alpha_residual`, `alpha_softmax`) of each head-sample in the 2-D organized order.
    Value: the median of alpha_residual - alpha_softmax."""
    if not_run:
        return _not_run("smoothness", model, not_run, paper)
    missing = [c for c in ("sample", "layer", "head", "order", "alpha_softmax", "alpha_residual")
               if c not in table.columns]
    if missing:
        raise ValueError(f"table: missing columns {missing}, has {list(table.columns)}")
    org = (table[table["order"] == ORGANIZED].groupby(["sample", "layer", "head"])[["alpha_softmax", "alpha_residual"]]
           .mean().dropna())
    if org.empty:
        return _not_run("smoothness", model, f"no finite exponents of the {ORGANIZED} order", paper)
    d = (org["alpha_residual"] - org["alpha_softmax"]).to_numpy()
    n, wins, ties = d.size, int((d > 0).sum()), int((d == 0).sum())
    p = sign_test(wins, n - ties)
    verdict = HOLDS if p < SIGN_TEST_P else NOT_HERE if wins <= n / 2 else MIXED
    measured = (f"Hölder-type exponents from the decay of the Haar coefficients across scales, {ORGANIZED} order, "
                f"over {n} head-samples: softmax {_range(org['alpha_softmax'])}, residual "
                f"{_range(org['alpha_residual'])}; the residual's above the softmax's in {wins}/{n} "
                f"(sign test p = {p:.2g})")
    return _claim("smoothness", model, measured, paper, verdict, float(np.median(d)))


# -- pruning --------------------------------------------------------------------------------------
def _against_random(low: float, mean: float, sd: float | None, higher_is_better: bool) -> tuple[str, float, float]:
    """The verdict of `low` against the random orders' mean and sd, its gain and its z (sign only without spread)."""
    gain = (1.0 if higher_is_better else -1.0) * (float(low) - float(mean))
    sd = float(sd) if sd is not None and np.isfinite(sd) else 0.0
    if sd > 0:
        z = gain / sd
    else:  # one random order, or identical ones: only the sign of the gain is known
        z = float(np.sign(gain)) * float("inf") if gain else 0.0
    return HOLDS if z >= PRUNING_SDS else NOT_HERE if gain <= 0 else MIXED, z, sd


def pruning_claim(model: str, auc_low: float | None, auc_random: float | None, auc_random_sd: float | None,
                  higher_is_better: bool = True, metric: str = "held-out metric", paper: str = "",
                  not_run: str = "prune.enabled: false") -> Claim:
    """Pruning from Table 3's areas; None for `auc_low` means the prune stage was not run, for the
    reason `not_run`. Value: the gain over the random orders' mean area in their sd."""
    if auc_low is None or auc_random is None:
        return _claim("pruning", model, f"prune stage not run ({not_run})", paper, NOT_RUN)
    verdict, z, sd = _against_random(auc_low, auc_random, auc_random_sd, higher_is_better)
    measured = (f"area under the {metric} curve masking lowest Haar entropy first {float(auc_low):.4g} vs. "
                f"random orders {float(auc_random):.4g} ± {sd:.2g} ({'higher' if higher_is_better else 'lower'} "
                f"is better; {z:+.3g} sd)")
    return _claim("pruning", model, measured, paper, verdict, float(z))


def pruning_bottom_claim(model: str, low: float | None, random=None, k: int = 0, n_units: int = 0,
                         higher_is_better: bool = True, metric: str = "held-out metric", paper: str = "",
                         not_run: str = "prune.enabled: false", note: str = "") -> Claim:
    """The held-out metric with the k lowest-entropy heads of `n_units` masked (`low`) against the
    random orders masking k (`random`, one value per order); None: prune not run, for `not_run`.
    Value: the gain over the random orders' mean in their sd."""
    if low is None or random is None:
        return _claim("pruning_bottom", model, f"prune stage not run ({not_run})", paper, NOT_RUN)
    r = np.asarray(random, dtype=float)
    sd = float(r.std(ddof=1)) if r.size > 1 else None
    verdict, z, sd = _against_random(low, float(r.mean()), sd, higher_is_better)
    measured = (f"{metric} with the {k} of {n_units} lowest-entropy heads masked{note} {float(low):.4g} vs. "
                f"{r.size} random orders {float(r.mean()):.4g} ± {sd:.2g} "
                f"({'higher' if higher_is_better else 'lower'} is better; {z:+.3g} sd)")
    return _claim("pruning_bottom", model, measured, paper, verdict, float(z))


# -- Table 2 --------------------------------------------------------------------------------------
def table2_claim(model: str, raw, scale_free=None, paper: str = "") -> Claim:
    """One model's network l1 entropies over its samples, raw and scale-free (None: the column is
    not in this run's Table 2). Value: the scale-free mean."""
    raw = np.asarray(raw, dtype=float)
    text = f"network l1 entropy over {raw.size} samples: raw {raw.min():.4g}–{raw.max():.4g} (mean {raw.mean():.4g})"
    if scale_free is None:
        return _claim("table2", model, text + "; not run: scale-free measure: this run's Table 2 has no "
                      "network_entropy_scale_free column", paper, NOT_RUN)
    sf = np.asarray(scale_free, dtype=float)
    text += f"; scale-free (/ l2 norm of the tensor) {sf.min():.4g}–{sf.max():.4g} (mean {sf.mean():.4g})"
    return _claim("table2", model, text, paper, REPORTED, float(sf.mean()))


def table2_order_claim(models: dict, paper: str = "") -> Claim | None:
    """Whether the order of the models' raw mean network l1 entropies survives the scale-free
    measure. models: name -> (kind, raw, scale_free or None), per-sample arrays. Only pairs of
    models of different kinds are compared; None when every model has the same kind.
    Value: the fraction of such pairs that keep their order with disjoint ranges."""
    if len({kind for kind, _, _ in models.values()}) < 2:
        return None
    by_raw = sorted(models, key=lambda n: -float(np.mean(models[n][1])))
    label = " > ".join(by_raw) + " (raw mean)"
    lacking = [n for n, (_, _, sf) in models.items() if sf is None]
    if lacking:
        return _not_run("table2_order", label, f"Table 2 of {', '.join(lacking)} has no network_entropy_scale_free "
                        "column", paper)
    same = reversed_ = overlap = 0
    words = []
    for i, a in enumerate(by_raw):
        for b in by_raw[i + 1:]:
            if models[a][0] == models[b][0]:
                continue
            sa, sb = (np.asarray(models[n][2], dtype=float) for n in (a, b))
            if sa.min() > sb.max():
                same += 1
                words.append(f"{a} > {b} kept")
            elif sa.max() < sb.min():
                reversed_ += 1
                words.append(f"{a} > {b} reversed")
            else:
                overlap += 1
                words.append(f"{a}, {b} overlap")
    n = same + reversed_ + overlap
    verdict = NOT_HERE if reversed_ else HOLDS if same == n else MIXED
    measured = (f"raw means order {', '.join(by_raw)}; on the scale-free measure (sample ranges): "
                + "; ".join(words))
    return _claim("table2_order", label, measured, paper, verdict, same / n)


# -- diffusion map --------------------------------------------------------------------------------
def silhouette(distances, labels) -> np.ndarray:
    """Mean silhouette of one or several labellings of the same items (Rousseeuw 1987).

    distances : array of shape (n, n), symmetric, zero diagonal. labels : int array of shape
    (n,) or (..., n). With a(i) the mean distance of i to the other members of its group and
    b(i) the smallest mean distance of i to another group, s(i) = (b - a) / max(a, b), 0 for a
    group of one (and where a = b = 0); the result is the mean over i, shape (...). NaN where a
    labelling has fewer than 2 groups or no group of two or more.
    """
    d = np.asarray(distances, dtype=float)
    lab = np.asarray(labels)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or lab.shape[-1] != d.shape[0]:
        raise ValueError(f"distances, labels: expected (n, n) and (..., n), got {d.shape} and {lab.shape}")
    _, inv = np.unique(lab, return_inverse=True)
    inv = inv.reshape(lab.shape)
    k = int(inv.max()) + 1
    onehot = (inv[..., None] == np.arange(k)).astype(float)               # (..., n, k)
    sums = d @ onehot                                                       # (..., n, k)
    size = onehot.sum(-2)                                                   # (..., k)
    own_size = np.take_along_axis(size, inv, -1)                            # (..., n)
    own_sum = np.take_along_axis(sums, inv[..., None], -1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = own_sum / (own_size - 1)
        other = np.where(onehot.astype(bool) | (size[..., None, :] == 0), np.inf, sums / size[..., None, :])
        b = other.min(-1)
        s = np.where((own_size > 1) & (np.maximum(a, b) > 0), (b - a) / np.maximum(a, b), 0.0)
    groups = (size > 0).sum(-1)
    ok = (groups >= 2) & (size > 1).any(-1)
    return np.where(ok, s.mean(-1), np.nan)


def layer_silhouette_test(coords, layers, n_permutations: int = PERMUTATIONS, rng=None) -> tuple[float, float]:
    """The silhouette of items grouped by `layers` in `coords` (n, d) and its permutation p-value:
    the share of `n_permutations` shuffles of the labels (and the observed labelling) whose
    silhouette is at least the observed one. (NaN, NaN) where the silhouette is undefined."""
    x = np.asarray(coords, dtype=float)
    layers = np.asarray(layers)
    if x.ndim != 2 or layers.shape != (x.shape[0],):
        raise ValueError(f"coords, layers: expected (n, d) and (n,), got {x.shape} and {layers.shape}")
    rng = np.random.default_rng(rng)
    d = np.sqrt(np.maximum(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))
    obs = float(silhouette(d, layers))
    if not np.isfinite(obs):
        return float("nan"), float("nan")
    perms = rng.permuted(np.broadcast_to(layers, (n_permutations, layers.size)), axis=1)
    null = silhouette(d, perms)
    return obs, float((1 + np.sum(null >= obs - 1e-12)) / (1 + n_permutations))


def diffusion_claim(model: str, kind: str, silhouettes, pvalues, paper: str = "", not_run: str | None = None) -> Claim:
    """Figure 3's structure from each sample's layer silhouette and its permutation p-value: the
    kind's reading (DIFFUSION_READING) judged by the share of samples clustered by layer. Value:
    the median silhouette."""
    if not_run:
        return _not_run("diffusion", model, not_run, paper)
    s, p = np.asarray(silhouettes, dtype=float), np.asarray(pvalues, dtype=float)
    keep = np.isfinite(s) & np.isfinite(p)
    if not keep.any():
        return _not_run("diffusion", model, "silhouette undefined (fewer than two layers of heads)", paper)
    s, p = s[keep], p[keep]
    n, clustered = s.size, int(((p < CLUSTER_P) & (s > 0)).sum())
    reading = DIFFUSION_READING.get(kind, "clustered")
    agree = clustered if reading == "clustered" else n - clustered
    verdict = HOLDS if agree > n / 2 else NOT_HERE if agree == 0 else MIXED
    measured = (f"silhouette of the heads grouped by layer in the diffusion coordinates ψ1-ψ3: median "
                f"{_g(np.median(s))} (range {_g(s.min())}–{_g(s.max())}) over {n} samples, permutation p (vs. "
                f"{PERMUTATIONS} shuffles of the layer labels) median {np.median(p):.2g}; clustered by layer "
                f"(silhouette > 0, p < {CLUSTER_P}) in {clustered}/{n} samples; reading tested: {reading}"
                + ("" if ("diffusion", kind) in PAPER else " (the paper has no map of this kind)"))
    return _claim("diffusion", model, measured, paper, verdict, float(np.median(s)))


# -- the tables -----------------------------------------------------------------------------------
def stability_text(verdict: str, replicate_verdicts) -> str:
    """Whether `verdict` holds in every replicate analysis (docs/method.md §14.4): "stable in R/R
    replicates", or "flips in k/R replicates" with what it flips to."""
    reps = list(replicate_verdicts)
    if not reps:
        return ""
    flips = [v for v in reps if v != verdict]
    if not flips:
        return f"stable in {len(reps)}/{len(reps)} replicates"
    to = ", ".join(f"{v} in {flips.count(v)}" for v in dict.fromkeys(flips))
    return f"flips in {len(flips)}/{len(reps)} replicates ({to})"


def _verdict_cell(c: Claim) -> str:
    return f"**{c.verdict}**" + (f" ({c.stability})" if c.stability else "")


def claims_records(claims) -> list[dict]:
    return [asdict(c) for c in claims]


def claims_markdown(claims) -> str:
    """The claims table in Markdown, each claim beside the paper's sentence, its note stating the rules."""
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| claim | model | the paper says | measured here | paper's number | verdict |",
             "|:--|:--|:--|:--|:--|:--|"]
    lines += [f"| {cell(c.claim)} | {cell(c.model)} | {cell(c.quote) or '—'} | {cell(c.measured)} | "
              f"{cell(c.paper) or '—'} | {cell(_verdict_cell(c))} |" for c in claims]
    return ("\n".join(lines) + "\n\nVerdicts, computed from the numbers by these rules:\n\n"
            + "\n".join(f"- {r}." for r in RULES.values()) + "\n")


def claims_rst(claims) -> str:
    """The claims table as a reStructuredText list-table (the report's opening page)."""
    def cell(s):
        s = str(s) or "—"
        for ch in "\\*`|_":
            s = s.replace(ch, "\\" + ch)
        return s

    out = [".. list-table::", "   :header-rows: 1", "", "   * - claim", "     - model", "     - the paper says",
           "     - measured here", "     - paper's number", "     - verdict"]
    for c in claims:
        out += [f"   * - {cell(c.claim)}", f"     - {cell(c.model)}", f"     - {cell(c.quote)}",
                f"     - {cell(c.measured)}", f"     - {cell(c.paper)}", f"     - **{cell(c.verdict)}**"
                + (f" ({cell(c.stability)})" if c.stability else "")]
    return "\n".join(out) + "\n\nVerdicts, computed from the numbers by these rules:\n\n" + "\n".join(
        f"- {cell(r)}." for r in RULES.values()) + "\n"
