"""The paper's claims, each beside the sentence of the paper it tests, tested as a referee would
(docs/method.md §13).

Every row is one test of one claim on one model against one baseline: an effect oriented so that
a positive value favours the claim, its 95% cluster-bootstrap interval over the independent units
(a head, a sample, a random head order, a set of heads), a one-sided p-value and that p-value
corrected by Holm over every test of the table (`finalize`). The verdict follows from the interval
and the corrected p-value (`RULES`): it holds where the corrected p-value is below 0.05 and the
whole interval clears the row's margin (the method's noise floor, or the claim's own magnitude);
it does not hold where the whole interval lies below the row's failure line; otherwise it is
inconclusive. A claim with several baselines gets one more row, "every baseline", that holds only
where every one of them does. Per model:

- sparsity: the network l1/l2 of all tri-Haar coefficients (§6.3), organized against balanced trees
  in the natural order and against random trees, per sample;
- recurrence (bottom and top): the mean Jaccard index of the entropy head sets over pairs of samples,
  against chance (a permutation test) and beyond the head's amplitude (the entropy left after its
  per-sample regression on the head's Frobenius norm);
- the approximations of Theorem 1 and Corollary 1 (`APPROXIMATIONS`): each head's relative residual
  at tau = 1 against uniform attention, the same expansion without its cross terms, and the
  original and random orders; head as the unit;
- smoothness (Theorem 1 as stated): the exponent of the scores f (the premise, 0 < alpha < 1/2) and,
  on the heads that meet it, the residual's exponent against 2 alpha;
- pruning: the area under the held-out metric curve against random orders, and the metric with
  exactly round(fraction x heads) lowest-entropy heads masked against every (or random) set of as
  many heads;
- Table 2: reported per model; the paper's order (TXL above ViT) judged on the scale-free measure
  between a txl and a vit model only;
- diffusion: a label-free clustering statistic of the heads' diffusion map against a continuous
  (Gaussian) cloud of the same spread, read as the paper reads each kind.

`NOT_RUN` says why a claim was not measured; `REPORTED` marks numbers with no verdict of their own;
`PREMISE_NOT_MET` a Theorem 1 row none of whose heads meets the theorem's premise.
"""
from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, replace
from math import comb, log

import numpy as np
import pandas as pd

from .clustering import ClusterTest
from .entropy import n_extreme
from .inference import (ALPHA, CLIP, MIN_UNITS, Test, exact_or_mc_test, holm, holm_multipliers, one_sample_test,
                        permutation_p, two_sample_test, unit_values, with_mde)
from .stability import bottom_sets, distinct_pair_jaccard, mean_pair_jaccard

__all__ = ["APPROXIMATIONS", "CLAIMS", "COLUMNS", "HOLDS", "INCONCLUSIVE", "NOT_HERE", "NOT_RUN", "PREMISE_NOT_MET",
           "QUOTES", "REPORTED", "RULES", "RULES_TEXT", "Claim", "approximation_rows", "chance_jaccard",
           "claims_markdown", "claims_records", "claims_rst", "decide", "diffusion_row", "finalize",
           "head_sample_residuals", "paper_number", "pruning_bottom_row", "pruning_row", "recurrence_null",
           "recurrence_rows", "redecide", "smoothness_row", "sparsity_rows", "table2_order_rows", "table2_row",
           "verdict_text"]

HOLDS, NOT_HERE, INCONCLUSIVE, NOT_RUN = "holds", "does not hold here", "inconclusive", "not run"
PREMISE_NOT_MET = "premise not met"
REPORTED = "reported (no verdict of its own)"
EVERY_BASELINE = "every baseline"
"""The baseline of a claim's summary row: it holds only where the claim holds against each baseline."""

SPARSITY_MARGIN = -log(0.95)
"""log(baseline l1/l2 / organized l1/l2) must clear this: the organized tensor at least 5% sparser."""
RESIDUAL_MARGIN = log(1.05)
"""log(baseline residual / organized residual) must clear this: a residual at least 5% lower, above
the spread of a residual under perturbations that carry no information (docs/method.md §14.5)."""
RECURRENCE_HOLDS = 0.5
"""The mean Jaccard index "the same heads" must reach (the interval's lower end)."""
RECURRENCE_CHANCE_FACTOR = 2.0
"""Below this multiple of its chance level (the interval's upper end) recurrence does not hold."""
EXPONENT_NOISE = 0.1
"""Differences of Hölder-type exponents below this are noise at 64-128 tokens (docs/method.md §7.7)."""
CLUSTER_MARGIN = 1.0
"""A map is clustered where its statistic sits this many null spreads above a continuous cloud's."""
ORGANIZED, ORIGINAL, RANDOM_ORDERS = "2-D organized", "original", "random"
"""The orders of a residual table's `order` column (the theorem1 stage's)."""

APPROXIMATIONS = {
    "paraproduct": ("residual", "residual_nocross"),
    "paraproduct_selfnorm": ("residual_selfnorm", "residual_nocross_selfnorm"),
    "corollary1": ("corollary1_residual", "corollary1_nocross"),
    "corollary1_selfnorm": ("corollary1_selfnorm", "corollary1_nocross_selfnorm"),
    "corollary1_taylor": ("taylor_residual", "taylor_nocross"),
    "corollary1_taylor_selfnorm": ("taylor_selfnorm", "taylor_nocross_selfnorm"),
}
"""Each approximation's claim key: the theorem1 table's column of its relative residual, and of the
same expansion without its cross terms (docs/method.md §7.3, §7.7)."""
UNIFORM = "uniform_residual"

CLAIMS = {
    "sparsity": "the organized network is sparse in the tri-Haar basis",
    "recurrence": "the same heads do the least processing in every batch (bottom-entropy heads recur)",
    "top_recurrence": "the same heads do the most processing in every batch (top-entropy heads recur)",
    "paraproduct": "the paraproduct of an organized head approximates its softmax (Theorem 1; true row sums)",
    "paraproduct_selfnorm": "the paraproduct, normalised by its own row sums, approximates the softmax (Theorem 1)",
    "smoothness": "for scores f in Λ^α, 0 < α < 1/2, the paraproduct's residual lies in Λ^2α (Theorem 1, eq. 14)",
    "corollary1": "with A′ = A″ = 1 the mixed differences and their products approximate the softmax (Corollary 1, "
                  "eq. 18 as written; true row sums)",
    "corollary1_selfnorm": "Corollary 1 as written, normalised by its own row sums, approximates the softmax",
    "corollary1_taylor": "a variant, not the paper's formula: first-order Taylor about the head's mean plus "
                         "Corollary 1's products approximates the softmax (true row sums)",
    "corollary1_taylor_selfnorm": "the Taylor variant of Corollary 1, normalised by its own row sums, approximates "
                                  "the softmax",
    "pruning": "low-entropy heads could be pruned",
    "pruning_bottom": "the bottom-entropy heads could be removed (Table 1's bottom fraction masked)",
    "table2": "network l1 entropy per model (Table 2), raw and scale-free",
    "table2_order": "TXL's network l1 entropies are larger than ViT's (Table 2): the order on a scale-free measure",
    "diffusion": "the diffusion map of heads is continuous (TXL) or clustered (ViT) (Figure 3)",
}
"""Each claim's key and its wording in the table; rows are grouped in this order."""

_PARA = ("“We show theoretically - and supplement with computational examples - that if one produces an intrinsic "
         "organization of the attention head to have some regularity, the self-attention mechanism is invariant "
         "to the softmax function.” (paper §1)")
_COR1 = ("“then the softmax activation on a mixed α-Holder attention head can be decomposed into: A(f̃) = "
         "[P^{j+1}P′^{j′+1}(f) − P^jP′^{j′+1}(f) − P^{j+1}P′^{j′}(f) + P^jP′^{j′}(f)] + [P^{j+1}P′^{j′}(f) − "
         "P^jP′^{j′}(f)][P^jP′^{j′+1}(f) − P^jP′^{j′}(f)] + Δ_{N,N′}(A,f)” (Corollary 1, eq. 18)")
_TABLE2 = ("“Of note, the l₁ entropies for TXL are consistently comparatively larger than VIT which can be "
           "interpreted as the TXL network processing more high frequency content than VIT due to the "
           "architectural set-up, but it is most likely related to the data being processed.” (App. B.2)")
QUOTES = {
    "sparsity": "“one can use the network 3-tensor organization for empirical network applications such as model "
                "pruning (by virtue of network sparsity) and network architecture comparison” (Abstract)",
    "recurrence": "“This suggests, the same attention heads do most of the processing regardless of the data seen, "
                  "and perhaps more consequentially, the same attention heads do the fewest processing.” (App. B.1)",
    "top_recurrence": "“This suggests, the same attention heads do most of the processing regardless of the data "
                      "seen” (App. B.1)",
    "paraproduct": _PARA, "paraproduct_selfnorm": _PARA,
    "smoothness": "“Suppose A ∈ C², f ∈ Λ^α([0,1]²), 0 < α < 1/2, then we obtain the following discrete multiscale "
                  "tensor decomposition of A(f): … Δ_{N,N′}(A,f) = A(f) − Ã(f) ∈ Λ^{2α}([0,1]²)” (Theorem 1, "
                  "eq. 14)",
    "corollary1": _COR1, "corollary1_selfnorm": _COR1, "corollary1_taylor": _COR1, "corollary1_taylor_selfnorm": _COR1,
    "pruning": "“the head with low l₁ entropy do little processing and could be discarded.” (paper §3.2)",
    "pruning_bottom": "“The latter result implies one could remove attention heads with low l₁ entropy invariant to "
                      "data from the network, potentially saving computation time.” (App. B.1, of the bottom 10 "
                      "percent)",
    "table2": _TABLE2, "table2_order": _TABLE2,
    "diffusion": "“The diffusion map on the TXL network exhibits some continuous structure, while the VIT network "
                 "is more clustered and contains some outliers.” (paper §3.2)",
}
"""The paper's sentence each claim tests (arXiv 2506.15541), with where it stands."""

_APPROX_RULE = (f"the approximations (paraproduct, Corollary 1 as written, its Taylor variant; each with the true "
                f"row sums and normalised by its own): per head-sample the log of the baseline's relative residual "
                f"over the organized one, averaged over each head's samples (head = unit); against uniform "
                f"attention (which beats any approximation that misses the rows' means: a residual below 1 proves "
                f"nothing), the same expansion without its cross terms A″ Dx Dy (the only part that depends on the "
                f"organization beyond first order), the original order and random orders (geometric mean over "
                f"seeds); the margin is log 1.05 (a residual at least 5% lower); a residual beyond float64 counts "
                f"as e^{CLIP:g} times worse; a self-normalised row whose own sum is not positive attends nowhere")
RULES = {
    "verdict": (f"every row is a test with an independent unit (a head: its samples averaged first; a sample; a "
                f"random head order; a set of heads), an effect oriented so that positive favours the claim, its 95% "
                f"cluster-bootstrap interval, and a one-sided p-value corrected by Holm over every test of the "
                f"table; a row holds if the corrected p < {ALPHA} and the whole interval lies above its margin, does "
                f"not hold if the whole interval lies below its failure line (uncorrected: a 95% statement about "
                f"that row), and is otherwise inconclusive; fewer than {MIN_UNITS} units decide nothing; "
                f"\"{EVERY_BASELINE}\" holds if the claim holds against each of its baselines and does not hold if "
                f"it fails against any; mde is the smallest effect the row could detect (80% power at the "
                f"Bonferroni level of the table), inf where no effect could (too few units or null draws)"),
    "sparsity": ("sparsity: per sample log(baseline l1/l2 / organized l1/l2) of all tri-Haar coefficients, against "
                 "balanced trees in the natural order and random trees; margin and failure line log(1/0.95) (at "
                 "least 5% sparser); t-test over samples"),
    "recurrence": (f"recurrence (bottom and top): the mean Jaccard index J of the entropy head sets over pairs of "
                   f"samples minus its chance level (two random sets of the same size); p from random "
                   f"relabellings of each sample's heads (claims.permutations); interval from a bootstrap over samples; holds "
                   f"if J's interval lies above {RECURRENCE_HOLDS} (\"the same heads\"), does not hold if it lies below "
                   f"{RECURRENCE_CHANCE_FACTOR:g} x chance; beyond amplitude: the same with each sample's log entropy "
                   f"residualised on the head's log Frobenius norm (any fixed per-head property recurs), held to "
                   f"{RECURRENCE_CHANCE_FACTOR:g} x chance both ways"),
    "approximations": _APPROX_RULE,
    "smoothness": (f"Theorem 1 as stated: α of the scores f (the premise) per head in its 2-D organized order; a "
                   f"head meets the premise if its mean α over samples is in (0, 1/2); none: premise not met; on "
                   f"those heads, α(residual) - 2α(f) per head against -{EXPONENT_NOISE} (the exponent's noise "
                   f"floor: the residual at least as smooth as 2α within the noise)"),
    "pruning": ("pruning: the area under the held-out metric curve masking lowest entropy first minus the random "
                "orders' mean, oriented by the metric, p = the rank among the random orders (Monte Carlo); the "
                "bottom-fraction row masks exactly round(fraction x heads) lowest-entropy heads against every set "
                "of as many heads (exact, where there are at most 10^5 sets) or random sets, p = the share of sets "
                "at least as good; one ablation run (no split halves)"),
    "table2": ("Table 2 (TXL's entropies larger than ViT's): each model's rows report; the order is judged between a "
               "txl and a vit model on the scale-free measure (network l1 entropy / l2 norm of the tensor), per "
               "sample log values, Welch's t-test and a bootstrap of each model's samples; other pairs are reported"),
    "diffusion": (f"diffusion map (Figure 3): per sample the best k-means silhouette (k = 2-5) of the heads in "
                  f"ψ1-ψ3 against Gaussian clouds of the same mean and covariance, as z = (statistic - null mean) / "
                  f"null sd; clustered (ViT, and kinds the paper has no map of) holds if the samples' mean z clears "
                  f"{CLUSTER_MARGIN:g}, continuous (TXL) if it stays below {CLUSTER_MARGIN:g}; the \"outliers\" of "
                  f"the sentence are not tested"),
    "replication": ("numerically robust: the verdict in each replicate analysis (an ulp, float16, a renaming of the "
                    "items: no information) with the row's Holm multiplier; split halves: the verdict on the first "
                    "and on the second half of the samples alone, the same multiplier; masked rule: a causal model's "
                    "rows measured on the expansions of its scores give the verdict under the other extract.masked "
                    "rule too"),
}
"""Each family of rows' rule (docs/method.md §13): what a verdict can and cannot mean."""
RULES_TEXT = "Verdicts, computed from the numbers by these rules: " + "; ".join(RULES.values()) + "."

PAPER = {
    ("sparsity", "txl"): "no baseline; coefficient decay shown (Fig. 4), network l1 entropy 1200-2476 (Table 2)",
    ("sparsity", "vit"): "no baseline; coefficient decay shown (Fig. 4), network l1 entropy 2.47-9.77 (Table 2)",
    ("recurrence", "txl"): "bottom heads (6,0), (7,5), (3,5) each in 6/6 batches (Table 1)",
    ("recurrence", "vit"): "bottom heads (2,4), (3,10), (1,11) each in 6/6 batches (Table 1)",
    ("top_recurrence", "txl"): "top heads (13,3), (1,0), (7,7) each in 6/6 batches (Table 1)",
    ("top_recurrence", "vit"): "top heads (2,5), (3,6), (2,10) each in 6/6 batches (Table 1)",
    ("smoothness", "txl"): "none: stated (Theorem 1, eq. 14), not measured",
    ("smoothness", "vit"): "none: stated (Theorem 1, eq. 14), not measured",
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
for _k in APPROXIMATIONS:
    for _kind in ("txl", "vit"):
        PAPER[(_k, _kind)] = ("none: shown, not measured (Fig. 2)" if _k.startswith("paraproduct")
                              else "none: stated (Corollary 1, eq. 18), not measured")
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


@dataclass(frozen=True)
class Claim:
    """One row of the claims table: one test of a claim on a model against one baseline.

    The effect is oriented so that positive favours the claim; `margin` is what its interval must
    clear to hold and `fail_below` the line its interval must stay under to fail (docs/method.md
    §13.1). `p` is the test's one-sided p-value and `p_adjusted` Holm's over the table; `mde` the
    smallest detectable effect; NaN where the row has no test. `components`: the baselines a row
    "every baseline" summarises. `masked_rule`: the extract.masked rule of the numbers (where it set
    any masked score), `other_masked_rule` the verdict under the other rule; `numerically_robust`
    and `split_half` the verdict's replication (`redecide`)."""

    key: str
    claim: str
    model: str
    baseline: str
    verdict: str
    measured: str
    paper: str = ""
    quote: str = ""
    effect: float = float("nan")
    ci_low: float = float("nan")
    ci_high: float = float("nan")
    p: float = float("nan")
    p_adjusted: float = float("nan")
    unit: str = ""
    n_units: int = 0
    mde: float = float("nan")
    margin: float = float("nan")
    fail_below: float = float("nan")
    masked_rule: str = ""
    other_masked_rule: str = ""
    numerically_robust: str = ""
    split_half: str = ""
    components: tuple = ()
    test: Test | None = None


COLUMNS = ["claim", "model", "baseline", "verdict", "effect", "ci_low", "ci_high", "p", "p_adjusted", "unit", "n_units",
           "mde", "margin", "measured", "paper", "masked_rule", "other_masked_rule", "numerically_robust", "split_half",
           "quote", "key"]
"""The columns of results/claims.csv, in order."""


def _rng(seed: int, *names) -> np.random.Generator:
    """A generator that depends on the seed and the row's names only, not on the order rows are built."""
    return np.random.default_rng([int(seed), *(zlib.crc32(str(n).encode()) for n in names)])


def _claim(key: str, model: str, baseline: str, measured: str, paper: str = "", test: Test | None = None,
           verdict: str = INCONCLUSIVE, fail_below: float | None = None) -> Claim:
    c = Claim(key, CLAIMS[key], model, baseline, verdict, measured, paper, QUOTES.get(key, ""))
    if test is None:
        return c
    return replace(c, test=test, effect=test.effect, ci_low=test.ci_low, ci_high=test.ci_high, p=test.p,
                   unit=test.unit, n_units=test.n_units, margin=test.margin,
                   fail_below=test.margin if fail_below is None else fail_below)


def _not_run(key: str, model: str, why: str, paper: str = "", baseline: str = "") -> Claim:
    return _claim(key, model, baseline, f"not run: {why}", paper, verdict=NOT_RUN)


def _summary_row(key: str, model: str, parts: list, paper: str) -> list:
    """The rows of one claim with several baselines, led by its "every baseline" row."""
    tests = [c for c in parts if c.test is not None]
    if len(tests) < 2:
        return parts
    head = _claim(key, model, EVERY_BASELINE, "holds only where it holds against every baseline below: "
                  + ", ".join(c.baseline for c in tests), paper)
    return [replace(head, components=tuple(c.baseline for c in tests))] + parts


def chance_jaccard(n: int, k: int) -> float:
    """Expected Jaccard index of two independent uniformly random k-subsets of n items.

    The overlap i is hypergeometric, P(i) = C(k, i) C(n - k, k - i) / C(n, k), and the
    Jaccard index of two k-sets with overlap i is i / (2k - i).
    """
    if not 0 < k <= n:
        raise ValueError(f"k: expected 1..{n}, got {k}")
    total = comb(n, k)
    return sum(comb(k, i) * comb(n - k, k - i) / total * i / (2 * k - i) for i in range(1, k + 1))


def _g(x) -> str:
    return "not finite" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _range(x) -> str:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    if not x.size:
        return "none"
    return f"median {_g(float(np.median(x)))} (range {_g(float(x.min()))}–{_g(float(x.max()))})"


# -- sparsity -------------------------------------------------------------------------------------
def sparsity_rows(model: str, sparsity, random, natural=None, *, paper: str = "", n_boot: int = 2000,
                  seed: int = 0) -> list:
    """Sparsity from the per-sample network l1/l2 under the organized trees, random trees and (None:
    not in this run's Table 2) balanced trees in the natural order; the sample is the unit."""
    s = np.asarray(sparsity, dtype=float)
    rows = []
    for name, base in (("natural order (balanced trees)", natural), ("random trees", random)):
        if base is None:
            rows.append(_not_run("sparsity", model, "this run's Table 2 has no natural-order column "
                                 "(network_sparsity_natural_trees)", paper, baseline=name))
            continue
        b = np.asarray(base, dtype=float)
        e = np.log(b / s)
        t = one_sample_test(e, SPARSITY_MARGIN, "sample", n_boot, _rng(seed, "sparsity", model, name))
        rows.append(_claim("sparsity", model, name,
                           f"network l1/l2 of all tri-Haar coefficients over {s.size} samples: organized / {name} "
                           f"{_range(s / b)}, at least 5% sparser in {int((s / b < 0.95).sum())}/{s.size}; effect "
                           f"log({name} / organized) per sample", paper, t))
    return _summary_row("sparsity", model, rows, paper)


# -- recurrence -----------------------------------------------------------------------------------
def recurrence_null(n_samples: int, n_units: int, k: int, permutations: int, seed: int) -> np.ndarray:
    """The mean pair Jaccard index of n_samples independent uniformly random k-sets of n_units items,
    `permutations` times: what relabelling each sample's heads at random gives (permutations,).
    It depends on the sizes only, not on the data, so one null serves every replicate."""
    rng = np.random.default_rng([int(seed), n_samples, n_units, k])
    out = np.empty(permutations)
    chunk = max(1, (1 << 24) // max(1, n_samples * n_units))
    for start in range(0, permutations, chunk):
        p = min(chunk, permutations - start)
        keys = rng.random((p, n_samples, n_units))
        member = keys <= np.partition(keys, k - 1, axis=-1)[..., k - 1:k]       # the k smallest keys
        out[start:start + p] = mean_pair_jaccard(member)
    return out


def _amplitude_residual(entropies: np.ndarray, amplitude: np.ndarray) -> np.ndarray:
    """Each sample's log entropy minus its least-squares fit on the log amplitude across the heads:
    what entropy says of a head beyond its size (samples, units)."""
    tiny = np.finfo(float).tiny
    y, x = np.log(np.maximum(entropies, tiny)), np.log(np.maximum(amplitude, tiny))
    xc, yc = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    sxx = (xc * xc).sum(1, keepdims=True)
    slope = np.where(sxx > 0, (xc * yc).sum(1, keepdims=True) / np.where(sxx > 0, sxx, 1.0), 0.0)
    return yc - slope * xc


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation of each row of a with the same row of b."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra, rb = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    den = np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
    return np.where(den > 0, (ra * rb).sum(1) / np.where(den > 0, den, 1.0), np.nan)


def _recurrence_test(member: np.ndarray, null: np.ndarray, chance: float, n_boot: int, rng, margin: float) -> Test:
    j = float(mean_pair_jaccard(member))
    boot = distinct_pair_jaccard(member, rng.integers(0, member.shape[0], size=(n_boot, member.shape[0]))) - chance
    boot = boot[np.isfinite(boot)]
    lo, hi = (float(q) for q in np.quantile(boot, [0.025, 0.975])) if boot.size else (float("nan"),) * 2
    levels = np.array([0.5, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999])
    return Test(j - chance, lo, hi, permutation_p(j, null), margin, member.shape[0], "sample",
                p_min=1.0 / (1 + null.size), se=float(boot.std(ddof=1)) if boot.size > 1 else float("nan"),
                null_quantiles=tuple(zip(levels.tolist(), (np.quantile(null, levels) - chance).tolist())))


def recurrence_rows(model: str, entropies, fraction: float, which: str = "bottom", *, amplitude=None, counts=(),
                    paper: str = "", permutations: int = 9999, n_boot: int = 2000, seed: int = 0,
                    null: np.ndarray | None = None) -> list:
    """Recurrence of the bottom (or top, `which`) entropy head sets across samples (Table 1's two
    sides): against chance, and (with `amplitude`, each head's Frobenius norm per sample) beyond the
    head's amplitude. entropies, amplitude : (samples, units). counts: Table 1's most frequent heads
    ((layer, head), count). `null`: a `recurrence_null` of these sizes (computed when None)."""
    if which not in ("bottom", "top"):
        raise ValueError(f"which: must be 'bottom' or 'top', got {which!r}")
    key = "recurrence" if which == "bottom" else "top_recurrence"
    e = np.asarray(entropies, dtype=float)
    n_s, n_u = e.shape
    if n_s < 2:
        return [_not_run(key, model, f"{n_s} sample: recurrence needs two", paper)]
    k = n_extreme(n_u, fraction)
    chance = chance_jaccard(n_u, k)
    if null is None:
        null = recurrence_null(n_s, n_u, k, permutations, seed)
    member = bottom_sets(e, fraction, which)
    heads = ", ".join(f"({la},{he}) {c}/{n_s}" for (la, he), c in counts)
    t = _recurrence_test(member, null, chance, n_boot, _rng(seed, key, model, "chance"), RECURRENCE_HOLDS - chance)
    j = t.effect + chance
    rows = [_claim(key, model, "chance (random sets of the same size)",
                   f"{which}-{k}-of-{n_u} mean Jaccard over the pairs of {n_s} samples: {j:.3g} (chance "
                   f"{chance:.3g}); effect J - chance" + (f"; most frequent {which} heads {heads}" if heads else ""),
                   paper, t, fail_below=(RECURRENCE_CHANCE_FACTOR - 1) * chance)]
    if amplitude is not None:
        a = np.asarray(amplitude, dtype=float)
        if a.shape != e.shape:
            raise ValueError(f"amplitude: expected shape {e.shape} (samples, units), got {a.shape}")
        resid = _amplitude_residual(e, a)
        ta = _recurrence_test(bottom_sets(resid, fraction, which), null, chance, n_boot,
                              _rng(seed, key, model, "amplitude"), (RECURRENCE_CHANCE_FACTOR - 1) * chance)
        j_norm = float(mean_pair_jaccard(bottom_sets(a, fraction, which)))
        rho = _spearman_rows(e, a)
        rows.append(_claim(key, model, "the head's amplitude (entropy beyond its Frobenius norm)",
                           f"{which} sets of each sample's log entropy residualised on the log Frobenius norm: mean "
                           f"Jaccard {ta.effect + chance:.3g} (chance {chance:.3g}); the norm's own {which} sets "
                           f"{j_norm:.3g}; Spearman of entropy with norm per sample {_range(rho)}; effect J - chance",
                           paper, ta))
    return _summary_row(key, model, rows, paper)


# -- Theorem 1 and Corollary 1 ---------------------------------------------------------------------
def head_sample_residuals(table: pd.DataFrame, column="residual") -> pd.DataFrame:
    """One row per head-sample (sample, layer, head), one column per order: the `column` of the 2-D
    organized and original orders and the geometric mean over the random orders' seeds.

    table : DataFrame with columns sample, layer, head, order and `column` (random orders: one row
    per seed). A NaN residual (not representable in float64) counts as +inf, worse than any other;
    an order a head-sample lacks is NaN. `column` a list of columns: one groupby for all of them,
    the result's columns (column, order).
    """
    columns = [column] if isinstance(column, str) else list(column)
    missing = [c for c in ("sample", "layer", "head", "order", *columns) if c not in table.columns]
    if missing:
        raise ValueError(f"table: missing columns {missing}, has {list(table.columns)}")
    v = table[columns].to_numpy(dtype=float)
    with np.errstate(divide="ignore"):
        logs = pd.DataFrame(np.log(np.where(np.isnan(v), np.inf, v)), columns=columns, index=table.index)
    key = [table[c] for c in ("sample", "layer", "head", "order")]
    wide = np.exp(logs.groupby(key).mean()).unstack("order")
    return wide[column] if isinstance(column, str) else wide


def _log_ratio(base: pd.Series, org: pd.Series) -> pd.Series:
    """log(base / org) per head-sample, oriented for the organized approximation; both infinite is a
    tie (0), one infinite is ±CLIP, a missing value NaN."""
    b, o = base.to_numpy(dtype=float), org.reindex(base.index).to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(b) - np.log(o)
    r = np.where(np.isinf(b) & np.isinf(o), 0.0, r)
    return pd.Series(np.clip(r, -CLIP, CLIP), index=base.index)


def _head_test(ratio: pd.Series, margin: float, n_boot: int, rng) -> tuple[Test, int, int]:
    """The test over heads of per head-sample log ratios: (test, head-samples where positive, heads
    whose mean is positive)."""
    per_head = ratio.clip(-CLIP, CLIP).dropna().groupby(level=["layer", "head"]).mean()   # one head, one vote
    return (one_sample_test(per_head.to_numpy(), margin, "head", n_boot, rng), int((ratio > 0).sum()),
            int((per_head > 0).sum()))


def approximation_rows(model: str, table: pd.DataFrame | None, key: str = "paraproduct", *, paper: str = "",
                       not_run: str | None = None, source: str = "", crossover_text: str = "", n_boot: int = 2000,
                       seed: int = 0, orders: pd.DataFrame | None = None) -> list:
    """One approximation (`APPROXIMATIONS[key]`) of every head-sample's softmax against its baselines
    (the module docstring), the head as the unit. table : the theorem1 stage's rows (sample, layer,
    head, order, seed and the residual columns). `not_run`: why there is no table. orders: the
    table's `head_sample_residuals` of every residual column, where the caller has it."""
    if key not in APPROXIMATIONS:
        raise ValueError(f"key: expected one of {sorted(APPROXIMATIONS)}, got {key!r}")
    column, nocross = APPROXIMATIONS[key]
    if not_run:
        return [_not_run(key, model, not_run, paper)]
    if table is None or column not in table.columns:
        return [_not_run(key, model, f"no {column} column in the residual table{f' ({source})' if source else ''}",
                         paper)]
    if orders is None:
        orders = head_sample_residuals(table, [c for c in (column, nocross, UNIFORM) if c in table.columns])
    wide = orders[column] if column in orders.columns.get_level_values(0) else pd.DataFrame()
    if ORGANIZED not in wide or wide[ORGANIZED].isna().all():
        return [_not_run(key, model, f"no {ORGANIZED} residuals in the table", paper)]
    org = wide[ORGANIZED]
    bases = {}
    for name, col in (("uniform attention", UNIFORM), ("no cross terms (A″ Dx Dy dropped)", nocross)):
        bases[name] = (orders[col][ORGANIZED] if col in orders.columns.get_level_values(0) else None, col)
    bases["original order"] = (wide[ORIGINAL] if ORIGINAL in wide else None, ORIGINAL)
    bases["random orders (geometric mean over seeds)"] = (wide[RANDOM_ORDERS] if RANDOM_ORDERS in wide else None,
                                                          RANDOM_ORDERS)
    n_heads = org.reset_index()[["layer", "head"]].drop_duplicates().shape[0]
    lead = (f"relative residual at τ = 1 over {org.size} head-samples of {n_heads} heads"
            f"{f' ({source})' if source else ''}: organized {_range(org)}")
    rows = []
    for name, (base, what) in bases.items():
        if base is None or base.isna().all():
            rows.append(_not_run(key, model, f"no {what} residuals in the table", paper, baseline=name))
            continue
        t, wins, heads = _head_test(_log_ratio(base, org), RESIDUAL_MARGIN, n_boot, _rng(seed, key, model, name))
        rows.append(_claim(key, model, name,
                           f"{lead}; {name} {_range(base)}; organized below it in {wins}/{base.notna().sum()} "
                           f"head-samples, {heads}/{t.n_units} heads; effect log({name.split(' (')[0]} / organized) "
                           f"per head" + (f"; {crossover_text}" if crossover_text and name.startswith("original")
                                          else ""), paper, t))
    return _summary_row(key, model, rows, paper)


def smoothness_row(model: str, table: pd.DataFrame | None, *, paper: str = "", not_run: str | None = None,
                   n_boot: int = 2000, seed: int = 0) -> list:
    """Theorem 1 as stated: the share of heads meeting its premise (alpha of the scores in (0, 1/2),
    the head's mean over its samples, organized order) and, on those, alpha(residual) - 2 alpha(f)
    against -EXPONENT_NOISE, the head as the unit."""
    key, base = "smoothness", "2α of the scores (Theorem 1's bound), heads meeting its premise"
    if not_run:
        return [_not_run(key, model, not_run, paper, baseline=base)]
    need = ("sample", "layer", "head", "order", "alpha_scores", "alpha_residual")
    missing = [c for c in need if c not in table.columns]
    if missing:
        return [_not_run(key, model, f"the theorem1 table has no {', '.join(missing)}", paper, baseline=base)]
    org = table[table["order"] == ORGANIZED]
    per_head = org.groupby(["layer", "head"])["alpha_scores"].mean().dropna()
    if per_head.empty:
        return [_not_run(key, model, f"no finite exponent of the scores in the {ORGANIZED} order", paper,
                         baseline=base)]
    meets = per_head[(per_head > 0) & (per_head < 0.5)]
    share = f"α of the scores f per head {_range(per_head)}; in (0, 1/2) for {meets.size}/{per_head.size} heads"
    extra = ""
    if "alpha_softmax" in org:
        d = (org["alpha_residual"] - org["alpha_softmax"]).dropna()
        extra = (f"; for comparison (not the theorem's statement) the residual's exponent above the softmax's in "
                 f"{int((d > 0).sum())}/{d.size} head-samples")
    if meets.empty:
        return [_claim(key, model, base, share + " (the premise is met by none)" + extra, paper,
                       verdict=PREMISE_NOT_MET)]
    on = org.set_index(["layer", "head"]).loc[meets.index].reset_index()
    on = on.assign(d=on["alpha_residual"] - 2.0 * on["alpha_scores"])
    per = unit_values(on, ["layer", "head"], "d")
    t = one_sample_test(per.to_numpy(), -EXPONENT_NOISE, "head", n_boot, _rng(seed, key, model))
    return [_claim(key, model, base, f"{share}; on those, α(residual) - 2α(f) per head {_range(per)}; effect its "
                   f"mean, margin -{EXPONENT_NOISE}" + extra, paper, t)]


# -- pruning --------------------------------------------------------------------------------------
def _oriented(v, higher_is_better: bool, log_metric: bool) -> np.ndarray:
    x = np.asarray(v, dtype=float)
    if log_metric:
        x = np.log(x)
    return x if higher_is_better else -x


def pruning_row(model: str, auc_low: float | None, auc_random=None, *, higher_is_better: bool = True,
                metric: str = "held-out metric", others: dict | None = None, paper: str = "",
                not_run: str = "prune.enabled: false", n_boot: int = 2000, seed: int = 0) -> list:
    """Pruning: the area under the held-out metric curve masking lowest entropy first against the
    random orders' areas (one per order: the null's draws). others: the other rankings' areas,
    reported. None for `auc_low`: the prune stage did not run, for `not_run`."""
    if auc_low is None or auc_random is None:
        return [_claim("pruning", model, "random head orders", f"prune stage not run ({not_run})", paper,
                       verdict=NOT_RUN)]
    sign = 1.0 if higher_is_better else -1.0
    r = np.asarray(auc_random, dtype=float)
    t = exact_or_mc_test(sign * float(auc_low), sign * r, 0.0, "random head order", False, n_boot,
                         _rng(seed, "pruning", model))
    rest = "; ".join(f"{k} {float(v):.4g}" for k, v in (others or {}).items())
    measured = (f"area under the {metric} curve masking lowest Haar entropy first {float(auc_low):.4g} vs. "
                f"{r.size} random orders {r.mean():.4g} ± {r.std(ddof=1) if r.size > 1 else 0.0:.2g} "
                f"({'higher' if higher_is_better else 'lower'} is better; effect oriented so)"
                + (f"; beside it: {rest}" if rest else ""))
    return [_claim("pruning", model, "random head orders", measured, paper, t)]


def pruning_bottom_row(model: str, bottom: pd.DataFrame | None, *, paper: str = "",
                       not_run: str = "prune.enabled: false", haar: str = "Haar entropy, lowest first",
                       n_boot: int = 2000, seed: int = 0) -> list:
    """The held-out metric with exactly k = round(fraction x heads) lowest-entropy heads masked
    against every set of k heads (exact) or random ones (the prune stage's bottom table: columns
    set, index, heads, value, k, n_units, null, n_null, n_sets_total, metric, higher_is_better,
    log_metric); the other rankings' bottom-k sets are reported with their own p-values."""
    base = "every set of as many heads"
    if bottom is None:
        return [_claim("pruning_bottom", model, base, f"prune stage not run ({not_run})", paper, verdict=NOT_RUN)]
    first = bottom.iloc[0]
    higher, logm = bool(first["higher_is_better"]), bool(first["log_metric"])
    exact = str(first["null"]) == "exact"
    null = _oriented(bottom.loc[bottom["set"] == "null", "value"], higher, logm)
    sets = bottom[bottom["set"] != "null"].set_index("set")["value"]
    if haar not in sets.index:
        raise ValueError(f"bottom: no row of the ranking {haar!r} (has {sorted(sets.index)})")
    low = float(_oriented([sets[haar]], higher, logm)[0])
    k, n_units = int(first["k"]), int(first["n_units"])
    unit = f"set of {k} heads ({'every one' if exact else 'random'})"
    base = "every set of as many heads" if exact else f"{null.size} random sets of as many heads"
    t = exact_or_mc_test(low, null, 0.0, unit, exact, n_boot, _rng(seed, "pruning_bottom", model))
    beside = "; ".join(f"{name} p = {permutation_p(float(_oriented([v], higher, logm)[0]), null, exact):.2g}"
                       for name, v in sets.items() if name != haar)
    measured = (f"{first['metric']} with the {k} of {n_units} lowest-entropy heads masked {float(sets[haar]):.4g} vs. "
                f"{null.size} {'' if exact else 'random '}sets of {k} heads (of {int(first['n_sets_total'])}) "
                f"{_range(bottom.loc[bottom['set'] == 'null', 'value'])}; "
                f"{'higher' if higher else 'lower'} is better{', compared in log' if logm else ''}; p = the share of "
                f"sets at least as good" + (f"; the other rankings' {k} first heads: {beside}" if beside else ""))
    return [_claim("pruning_bottom", model, base, measured, paper, t)]


# -- Table 2 --------------------------------------------------------------------------------------
def table2_row(model: str, raw, scale_free=None, paper: str = "") -> list:
    """One model's network l1 entropies over its samples, raw and scale-free (None: the column is
    not in this run's Table 2): reported, no verdict."""
    raw = np.asarray(raw, dtype=float)
    text = f"network l1 entropy over {raw.size} samples: raw {raw.min():.4g}–{raw.max():.4g} (mean {raw.mean():.4g})"
    if scale_free is None:
        return [_claim("table2", model, "", text + "; not run: scale-free measure: this run's Table 2 has no "
                       "network_entropy_scale_free column", paper, verdict=NOT_RUN)]
    sf = np.asarray(scale_free, dtype=float)
    text += f"; scale-free (/ l2 norm of the tensor) {sf.min():.4g}–{sf.max():.4g} (mean {sf.mean():.4g})"
    return [_claim("table2", model, "", text, paper, verdict=REPORTED)]


def table2_order_rows(models: dict, paper: str = "", *, n_boot: int = 2000, seed: int = 0) -> list:
    """The paper's Table 2 order, TXL's scale-free network entropy above ViT's: one test per pair of
    a txl and a vit model (log scale-free values per sample; the sample is the unit). models: name
    -> (kind, raw, scale_free or None), per-sample arrays. Every other pair of models of different
    kinds is reported in one row. [] when every model has the same kind."""
    if len({kind for kind, _, _ in models.values()}) < 2:
        return []
    key = "table2_order"
    txl = [n for n, (k, _, _) in models.items() if k == "txl"]
    vit = [n for n, (k, _, _) in models.items() if k == "vit"]
    rows = []
    for a in txl:
        for b in vit:
            label = f"{a} vs {b}"
            sa, sb = models[a][2], models[b][2]
            if sa is None or sb is None:
                rows.append(_not_run(key, label, "a Table 2 has no network_entropy_scale_free column", paper))
                continue
            t = two_sample_test(np.log(np.asarray(sa, dtype=float)), np.log(np.asarray(sb, dtype=float)), 0.0,
                                "sample", n_boot, _rng(seed, key, label))
            rows.append(_claim(key, label, f"{b} (the paper's lower)",
                               f"raw means {np.mean(models[a][1]):.4g} vs {np.mean(models[b][1]):.4g}; scale-free "
                               f"{a} {_range(sa)}, {b} {_range(sb)}; effect mean log scale-free {a} - {b}", paper, t))
    if not rows:
        rows.append(_not_run(key, " vs ".join(models), "the paper's order is between a txl and a vit model; this run "
                             "has not both", paper))
    others = [(a, b) for i, a in enumerate(models) for b in list(models)[i + 1:]
              if models[a][0] != models[b][0] and {models[a][0], models[b][0]} != {"txl", "vit"}]
    if others:
        words = []
        for a, b in others:
            sa, sb = models[a][2], models[b][2]
            if sa is None or sb is None:
                continue
            words.append(f"{a} {np.mean(sa):.3g} vs {b} {np.mean(sb):.3g}")
        rows.append(_claim(key, "other pairs", "", "scale-free means (pairs the paper does not compare): "
                           + ("; ".join(words) or "none with the scale-free column"), paper, verdict=REPORTED))
    return rows


# -- diffusion map --------------------------------------------------------------------------------
def diffusion_row(model: str, kind: str, tests: list, *, paper: str = "", not_run: str | None = None,
                  n_boot: int = 2000, seed: int = 0) -> list:
    """Figure 3's structure from each sample's `clustering.ClusterTest` of its heads' diffusion
    coordinates against a Gaussian cloud (the sample is the unit), read as the paper reads the kind
    (DIFFUSION_READING)."""
    reading = DIFFUSION_READING.get(kind, "clustered")
    base = "a continuous (Gaussian) cloud of the same spread"
    if not_run:
        return [_not_run("diffusion", model, not_run, paper, baseline=base)]
    z = np.array([t.z for t in tests], dtype=float)
    p = np.array([t.p for t in tests], dtype=float)
    keep = np.isfinite(z)
    if not keep.any():
        return [_not_run("diffusion", model, "clustering statistic undefined (fewer than three heads)", paper,
                         baseline=base)]
    sign, margin = (1.0, CLUSTER_MARGIN) if reading == "clustered" else (-1.0, -CLUSTER_MARGIN)
    t = one_sample_test(sign * z[keep], margin, "sample", n_boot, _rng(seed, "diffusion", model))
    draws = tests[0].null.size if tests else 0
    measured = (f"best k-means silhouette (k = 2-5) of the heads in ψ1-ψ3 against {draws} Gaussian clouds per sample: "
                f"z {_range(z[keep])} over {int(keep.sum())} samples, more clustered than the cloud (p < 0.05) in "
                f"{int((p[keep] < 0.05).sum())}/{int(keep.sum())}; reading tested: {reading}; effect "
                f"{'mean z' if sign > 0 else '-mean z'}"
                + ("" if ("diffusion", kind) in PAPER else " (the paper has no map of this kind)"))
    return [_claim("diffusion", model, base, measured, paper, t)]


# -- verdicts -------------------------------------------------------------------------------------
def decide(c: Claim, p_adjusted: float) -> str:
    """A test row's verdict from its interval and corrected p-value (RULES["verdict"])."""
    if c.verdict in (NOT_RUN, REPORTED, PREMISE_NOT_MET) or c.test is None:
        return c.verdict
    if not (np.isfinite(c.effect) and np.isfinite(c.ci_low) and np.isfinite(c.ci_high)):
        return INCONCLUSIVE
    if not c.test.null_quantiles and c.n_units < MIN_UNITS:
        return INCONCLUSIVE
    if p_adjusted < ALPHA and c.ci_low > c.margin:
        return HOLDS
    if c.ci_high < c.fail_below:
        return NOT_HERE
    return INCONCLUSIVE


def _combine(verdicts) -> str:
    v = list(verdicts)
    if not v:
        return NOT_RUN
    if any(x == NOT_HERE for x in v):
        return NOT_HERE
    if all(x == HOLDS for x in v):
        return HOLDS
    return INCONCLUSIVE


def _summaries(claims: list) -> list:
    """Each "every baseline" row from its components: the verdict, the least favourable effect with
    its interval, and the largest corrected p-value (an intersection-union test)."""
    out = []
    for i, c in enumerate(claims):
        if not c.components:
            out.append(c)
            continue
        parts = [d for d in claims if d.key == c.key and d.model == c.model and d.baseline in c.components]
        worst = min(parts, key=lambda d: d.effect if np.isfinite(d.effect) else -np.inf)
        out.append(replace(c, verdict=_combine(d.verdict for d in parts), effect=worst.effect, ci_low=worst.ci_low,
                           ci_high=worst.ci_high, p_adjusted=max(d.p_adjusted for d in parts),
                           unit=worst.unit, n_units=worst.n_units, margin=worst.margin))
    return out


def finalize(claims: list) -> tuple[list, dict]:
    """Holm's correction over every test of the table, each row's smallest detectable effect and
    verdict, then the "every baseline" rows. Returns the claims and each test row's Holm multiplier
    by (key, model, baseline), for `redecide`."""
    p = np.array([c.p if c.test is not None else np.nan for c in claims], dtype=float)
    adj, mult = holm(p), holm_multipliers(p)
    m = int(np.isfinite(p).sum())
    out, multipliers = [], {}
    for c, a, k in zip(claims, adj, mult):
        if c.test is not None:
            c = replace(c, p_adjusted=float(a), mde=with_mde(c.test, m).mde)
            c = replace(c, verdict=decide(c, float(a)))
            multipliers[(c.key, c.model, c.baseline)] = float(k)
        out.append(c)
    return _summaries(out), multipliers


def redecide(claims: list, multipliers: dict) -> dict:
    """The verdict of every row of `claims` (rebuilt on other data: a replicate, half the samples,
    the other masked rule) with the p-value multiplied by the full table's Holm multiplier of the
    same row, by (key, model, baseline)."""
    out = {}
    decided = []
    for c in claims:
        if c.test is not None:
            k = multipliers.get((c.key, c.model, c.baseline), float("nan"))
            a = min(1.0, c.p * k) if np.isfinite(k) and np.isfinite(c.p) else float("nan")
            c = replace(c, p_adjusted=a, verdict=decide(c, a))
        decided.append(c)
    for c in _summaries(decided):
        out[(c.key, c.model, c.baseline)] = c.verdict
    return out


def verdict_text(verdict: str, others, what: str) -> str:
    """Whether `verdict` is also the verdict in each of `others` (verdicts of replicates or halves):
    "same in R/R {what}" or "flips in k/R {what} (to ...)"; "" without any."""
    reps = [v for v in others if v]
    if not reps:
        return ""
    flips = [v for v in reps if v != verdict]
    if not flips:
        return f"same in {len(reps)}/{len(reps)} {what}"
    to = ", ".join(f"{v} in {flips.count(v)}" for v in dict.fromkeys(flips))
    return f"flips in {len(flips)}/{len(reps)} {what} ({to})"


# -- the tables -----------------------------------------------------------------------------------
def claims_records(claims) -> list[dict]:
    """The rows of results/claims.csv (COLUMNS)."""
    return [{k: asdict(c)[k] if k != "test" else None for k in COLUMNS} for c in claims]


def _effect_cell(c: Claim) -> str:
    if not np.isfinite(c.effect):
        return "—"
    ci = f" [{_g(c.ci_low)}, {_g(c.ci_high)}]" if np.isfinite(c.ci_low) else ""
    return f"{_g(c.effect)}{ci}"


def _p_cell(c: Claim) -> str:
    return "—" if not np.isfinite(c.p_adjusted) else f"{c.p_adjusted:.2g}"


def _replication_cell(c: Claim) -> str:
    parts = [p for p in (c.other_masked_rule, c.split_half, c.numerically_robust) if p]
    return "; ".join(parts)


def claims_markdown(claims) -> str:
    """The claims in Markdown: one section per claim (its sentence, the paper's number), a table of
    its tests (model, baseline, verdict, effect [95% interval], Holm-corrected p, unit, mde, what was
    measured, replication), then the rules."""
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = []
    for key, wording in CLAIMS.items():
        mine = [c for c in claims if c.key == key]
        if not mine:
            continue
        lines += [f"### {wording}", "", f"> {QUOTES.get(key, '')}", ""]
        lines += ["| model | baseline | verdict | effect [95% CI] | p (Holm) | unit (n) | mde | measured | "
                  "replication | paper's number |", "|:--|:--|:--|:--|:--|:--|:--|:--|:--|:--|"]
        lines += [f"| {cell(c.model)} | {cell(c.baseline) or '—'} | **{cell(c.verdict)}** | {_effect_cell(c)} | "
                  f"{_p_cell(c)} | {cell(c.unit) or '—'}{f' ({c.n_units})' if c.n_units else ''} | {_g(c.mde) if np.isfinite(c.mde) or np.isinf(c.mde) else '—'} | "
                  f"{cell(c.measured)} | {cell(_replication_cell(c)) or '—'} | {cell(c.paper) or '—'} |" for c in mine]
        lines.append("")
    return "\n".join(lines) + "\nVerdicts, computed from the numbers by these rules:\n\n" + "\n".join(
        f"- {r}." for r in RULES.values()) + "\n"


def claims_rst(claims) -> str:
    """The claims table as a reStructuredText list-table (the report's opening page): one row per
    test, the claim's wording in the first row of its group (〃 below it)."""
    def cell(s):
        s = str(s) or "—"
        for ch in "\\*`|_":
            s = s.replace(ch, "\\" + ch)
        return s

    out = [".. list-table::", "   :header-rows: 1", "", "   * - claim", "     - model", "     - baseline",
           "     - verdict", "     - effect [95% CI]", "     - p (Holm)", "     - unit (n)", "     - measured",
           "     - replication"]
    seen = set()
    for c in claims:
        first = c.key not in seen
        seen.add(c.key)
        out += [f"   * - {cell(c.claim) if first else '〃'}", f"     - {cell(c.model)}",
                f"     - {cell(c.baseline)}", f"     - **{cell(c.verdict)}**", f"     - {cell(_effect_cell(c))}",
                f"     - {cell(_p_cell(c))}", f"     - {cell(c.unit)}{f' ({c.n_units})' if c.n_units else ''}",
                f"     - {cell(c.measured)}", f"     - {cell(_replication_cell(c))}"]
    return "\n".join(out) + "\n\nVerdicts, computed from the numbers by these rules:\n\n" + "\n".join(
        f"- {cell(r)}." for r in RULES.values()) + "\n"


def cluster_tests_of(coords_by_sample, draws: int, seed: int, model: str) -> list[ClusterTest]:
    """`clustering.cluster_test` of each sample's diffusion coordinates (units, components), each
    with its own generator from (seed, model, sample index)."""
    from .clustering import cluster_test

    return [cluster_test(np.asarray(x, dtype=float), draws, _rng(seed, "diffusion", model, i))
            for i, x in enumerate(coords_by_sample)]
