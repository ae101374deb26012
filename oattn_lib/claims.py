"""The paper's claims, each with the number that tests it and a verdict worded from that number.

Four claims of Fasina et al., per model:

1. sparsity: organized heads are sparse in the bi-/tri-Haar basis. Measured: the network's
   l1/l2 ratio of all tri-Haar coefficients (docs/method.md §6.3; lower is sparser) under the
   organized trees divided by the same under random trees, per sample.
2. recurrence: the bottom-entropy heads recur across batches. Measured: the mean Jaccard
   index of the bottom-`fraction` head sets between every pair of samples, against its
   chance level (two independent random sets of the same size).
3. paraproduct: the paraproduct of an organized head approximates its softmax (Theorem 1).
   Measured: the relative residual at the model's own temperature (tau = 1) in the 2-D
   organized order, against the original and random orders (the temperature figure).
4. pruning: low-entropy heads could be pruned. Measured: the area under the held-out
   metric curve when heads are masked lowest Haar entropy first, against random orders
   (Table 3), oriented so that larger is better.

Every verdict is one of HOLDS, NOT_HERE, MIXED (or NOT_RUN), decided by the thresholds
below from the measured numbers; `THRESHOLDS_TEXT` states them for the table's note.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from math import comb

import numpy as np

__all__ = ["HOLDS", "MIXED", "NOT_HERE", "NOT_RUN", "THRESHOLDS_TEXT", "Claim", "chance_jaccard",
           "claims_markdown", "claims_records", "claims_rst", "paper_number", "paraproduct_claim",
           "pruning_claim", "recurrence_claim", "sparsity_claim", "stability_text"]

HOLDS, NOT_HERE, MIXED, NOT_RUN = "holds", "does not hold here", "mixed", "not run"

SPARSITY_MARGIN = 0.95
"""Sparsity holds when organized l1/l2 is below 0.95 x random trees' in every sample; it does
not hold when the mean ratio is 1 or more."""
RECURRENCE_HOLDS = 0.5
"""Recurrence holds when the bottom sets of two samples share at least half (mean Jaccard >= 0.5);
it does not hold when the mean Jaccard is below twice its chance level."""
RECURRENCE_CHANCE_FACTOR = 2.0
APPROXIMATES = 0.1
"""The paraproduct approximates the softmax when the relative residual at tau = 1 is at most 0.1."""
PRUNING_SDS = 2.0
"""Lowest-entropy-first pruning holds when its area beats the random orders' mean by 2 sd or more;
it does not hold when it does not beat their mean."""

THRESHOLDS_TEXT = (
    f"Verdicts, computed from the numbers by these thresholds: sparsity holds if organized/random l1/l2 < {SPARSITY_MARGIN} in "
    f"every sample, does not hold if its mean is >= 1; recurrence holds if the mean bottom-set Jaccard is "
    f">= {RECURRENCE_HOLDS}, does not hold if it is below {RECURRENCE_CHANCE_FACTOR:g}x chance; the paraproduct "
    f"claim holds if the organized residual at τ = 1 is <= {APPROXIMATES} and below the original and "
    f"random orders', does not hold if neither; pruning holds if lowest-entropy-first beats the random "
    f"orders' mean area by >= {PRUNING_SDS:g} sd, does not hold if it does not beat the mean; otherwise mixed.")

CLAIMS = {
    "sparsity": "organized heads are sparse in the bi-/tri-Haar basis",
    "recurrence": "the bottom-entropy heads recur across batches",
    "paraproduct": "the paraproduct of an organized head approximates its softmax (Theorem 1)",
    "pruning": "low-entropy heads could be pruned",
}


PAPER = {
    ("sparsity", "txl"): "no baseline; coefficient decay shown (Fig. 4), network l1 entropy 1200-2476 (Table 2)",
    ("sparsity", "vit"): "no baseline; coefficient decay shown (Fig. 4), network l1 entropy 2.47-9.77 (Table 2)",
    ("recurrence", "txl"): "bottom heads (6,0), (7,5), (3,5) each in 6/6 batches (Table 1)",
    ("recurrence", "vit"): "bottom heads (2,4), (3,10), (1,11) each in 6/6 batches (Table 1)",
    ("paraproduct", "txl"): "none: shown, not measured (Fig. 2)",
    ("paraproduct", "vit"): "none: shown, not measured (Fig. 2)",
    ("pruning", "txl"): "none: suggested, not measured (Sec. 3.2, App. B.1)",
    ("pruning", "vit"): "none: suggested, not measured (Sec. 3.2, App. B.1)",
}
"""The paper's number for a (claim, model kind), from its text; the paper has no hf model."""


def paper_number(claim: str, kind: str) -> str:
    """What the paper reports for `claim` on a model of `kind` ("" where it has no such model)."""
    if claim not in CLAIMS:
        raise ValueError(f"claim: expected one of {sorted(CLAIMS)}, got {claim!r}")
    return PAPER.get((claim, kind), "")


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


def chance_jaccard(n: int, k: int) -> float:
    """Expected Jaccard index of two independent uniformly random k-subsets of n items.

    The overlap i is hypergeometric, P(i) = C(k, i) C(n - k, k - i) / C(n, k), and the
    Jaccard index of two k-sets with overlap i is i / (2k - i).
    """
    if not 0 < k <= n:
        raise ValueError(f"k: expected 1..{n}, got {k}")
    total = comb(n, k)
    return sum(comb(k, i) * comb(n - k, k - i) / total * i / (2 * k - i) for i in range(1, k + 1))


def _g(x: float | None) -> str:
    return "not finite" if x is None or not np.isfinite(x) else f"{x:.3g}"


def sparsity_claim(model: str, sparsity, sparsity_random, paper: str = "") -> Claim:
    """Claim 1 from the per-sample network l1/l2 ratios under organized and random trees."""
    r = np.asarray(sparsity, dtype=float) / np.asarray(sparsity_random, dtype=float)
    mean = float(r.mean())
    verdict = HOLDS if np.all(r < SPARSITY_MARGIN) else NOT_HERE if mean >= 1 else MIXED
    measured = (f"network l1/l2 of all tri-Haar coefficients, organized / random trees: {mean:.3g} "
                f"(range {r.min():.3g}-{r.max():.3g}; below {SPARSITY_MARGIN} in {int((r < SPARSITY_MARGIN).sum())}"
                f"/{r.size} samples)")
    return Claim(CLAIMS["sparsity"], model, measured, paper, verdict, mean)


def recurrence_claim(model: str, jaccard_mean: float, n_heads: int, k: int, bottom_counts, n_samples: int,
                     paper: str = "") -> Claim:
    """Claim 2 from the mean bottom-set Jaccard index; `bottom_counts` are the counts of the
    most frequent bottom heads ((layer, head), count) as in Table 1."""
    chance = chance_jaccard(n_heads, k)
    j = float(jaccard_mean)
    verdict = HOLDS if j >= RECURRENCE_HOLDS else NOT_HERE if j < RECURRENCE_CHANCE_FACTOR * chance else MIXED
    heads = ", ".join(f"({la},{he}) {c}/{n_samples}" for (la, he), c in bottom_counts)
    measured = (f"bottom-{k}-of-{n_heads} Jaccard across {n_samples} samples: {j:.3g} (chance {chance:.3g}); "
                f"most frequent bottom heads {heads}")
    return Claim(CLAIMS["recurrence"], model, measured, paper, verdict, j)


def paraproduct_claim(model: str, organized: float | None, original: float | None, random: float | None,
                      crossover_text: str = "", paper: str = "", not_run: str | None = None) -> Claim:
    """Claim 3 from the relative residuals at tau = 1 (None: not finite); `not_run`: why the
    temperature figure was not computed (the claim is then not run)."""
    if not_run:
        return Claim(CLAIMS["paraproduct"], model, f"not run: {not_run}", paper, NOT_RUN)
    inf = float("inf")
    o, a, r = (inf if x is None or not np.isfinite(x) else float(x) for x in (organized, original, random))
    approximates = o <= APPROXIMATES
    helps = o < min(a, r)
    verdict = HOLDS if approximates and helps else NOT_HERE if not (approximates or helps) else MIXED
    measured = (f"relative residual at τ = 1: organized {_g(organized)}, original order {_g(original)}, "
                f"random orders {_g(random)}" + (f"; {crossover_text}" if crossover_text else ""))
    return Claim(CLAIMS["paraproduct"], model, measured, paper, verdict, None if o == inf else o)


def pruning_claim(model: str, auc_low: float | None, auc_random: float | None, auc_random_sd: float | None,
                  higher_is_better: bool = True, metric: str = "held-out metric", paper: str = "",
                  not_run: str = "prune.enabled: false") -> Claim:
    """Claim 4 from Table 3's areas; None for `auc_low` means the prune stage was not run, for the
    reason `not_run`."""
    if auc_low is None or auc_random is None:
        return Claim(CLAIMS["pruning"], model, f"prune stage not run ({not_run})", paper, NOT_RUN)
    sign = 1.0 if higher_is_better else -1.0
    gain = sign * (float(auc_low) - float(auc_random))
    sd = float(auc_random_sd) if auc_random_sd is not None and np.isfinite(auc_random_sd) else 0.0
    if sd > 0:
        z = gain / sd
    else:  # one random order, or identical ones: only the sign of the gain is known
        z = float(np.sign(gain)) * float("inf") if gain else 0.0
    verdict = HOLDS if z >= PRUNING_SDS else NOT_HERE if gain <= 0 else MIXED
    measured = (f"area under the {metric} curve masking lowest Haar entropy first {float(auc_low):.4g} vs. "
                f"random orders {float(auc_random):.4g} ± {sd:.2g} ({'higher' if higher_is_better else 'lower'} "
                f"is better; {z:+.3g} sd)")
    return Claim(CLAIMS["pruning"], model, measured, paper, verdict, float(z))


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
    """The claims table in Markdown, its note stating the thresholds."""
    def cell(s):
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| claim | model | measured here | paper | verdict |", "|:--|:--|:--|:--|:--|"]
    lines += [f"| {cell(c.claim)} | {cell(c.model)} | {cell(c.measured)} | {cell(c.paper) or '—'} | "
              f"{cell(_verdict_cell(c))} |" for c in claims]
    return "\n".join(lines) + f"\n\n{THRESHOLDS_TEXT}\n"


def claims_rst(claims) -> str:
    """The claims table as a reStructuredText list-table (the report's opening page)."""
    def cell(s):
        s = str(s) or "—"
        for ch in "\\*`|_":
            s = s.replace(ch, "\\" + ch)
        return s

    out = [".. list-table::", "   :header-rows: 1", "", "   * - claim", "     - model", "     - measured here",
           "     - paper", "     - verdict"]
    for c in claims:
        out += [f"   * - {cell(c.claim)}", f"     - {cell(c.model)}", f"     - {cell(c.measured)}",
                f"     - {cell(c.paper)}", f"     - **{cell(c.verdict)}**"
                + (f" ({cell(c.stability)})" if c.stability else "")]
    return "\n".join(out) + f"\n\n{cell(THRESHOLDS_TEXT)}\n"
