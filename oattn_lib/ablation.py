"""Head ablation: does low Haar entropy mean a head can go? (beyond the paper; docs/method.md §11)

The paper suggests that heads with low l1 Haar entropy (docs/method.md §6.2) "do little processing and
could be discarded". This module holds what tests that on a trained network: the metric of
a network with heads masked, the importance rankings a reviewer would ask for, and the
summaries of the resulting curves. The rankings, all computed on the same (extracted)
samples:

- Haar entropy, lowest first (the paper's proposal) and highest first;
- random orders (several seeds);
- gradient importance (Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than
  One?"): a gate xi_h multiplies each head's output, I_h = E_x |dL(x)/dxi_h| at xi = 1,
  normalised per layer by the L2 norm of the layer's importances, least important first;
- attention-distribution entropy (mean over queries of -sum_k p log p), lowest first;
- confidence (Voita et al. 2019, "Analyzing Multi-Head Self-Attention"): mean over queries
  of the largest attention weight, lowest first.

For each ranking the first k heads (k = 0, 10%, ..., 100% of the network) are masked
(`masks_from_order`; the gates themselves are `models.gating`), and the network is
measured on held-out data that no ranking saw (`evaluate_masks`): Transformer-XL
perplexity, ViT accuracy, a causal language model's perplexity through its own LM head
(`lm`: an hf decoder, whose mask is read off its attention), and for a sentence encoder
(`hf`) the mean cosine similarity of its sentence embeddings to the unmasked model's. An hf
model's heads attend there, and in the gradient pass, through torch's fused attention, the
heads gated off skipped: the metric of the eager attention to float rounding, in less time and
memory (docs/method.md §11.4).

The bottom-k test (docs/method.md §11.5) masks each ranking's first k = round(fraction x heads)
heads, the set the paper's claim is about, and ranks its metric among that of every k-subset of
the heads (`null_sets`: exact where there are few, else uniform random ones).

The sentence encoder has no task loss; its gradient importance uses the random projection
L_v(x) = v . e(x) of the normalised sentence embedding e, v ~ N(0, I), so that
E_v |dL_v/dxi_h| = sqrt(2/pi) ||de/dxi_h||: the first-order change of the embedding when the
head's gate moves (the loss an embedding model is judged by, 1 - cos, is flat at xi = 1).
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .models.gating import HeadLayout, check_attention, check_gates, reference_embeddings, row_outputs, wide
from .models.kinds import HeldOut

log = logging.getLogger("oattn")

__all__ = ["RANKINGS", "NULL_SET", "HAAR_LOW", "HAAR_HIGH", "RANDOM", "GRADIENT", "ATTN_ENTROPY", "CONFIDENCE",
           "METRICS", "evaluate_masks", "gate_gradients",
           "gradient_importance", "normalize_per_layer", "attention_entropy", "attention_confidence",
           "lowest_first", "random_order", "mask_counts", "masks_from_order", "NullSets", "null_sets",
           "ranking_sets", "masks_from_sets", "auc", "relative_loss",
           "tolerated_fraction", "spearman_between", "stability", "curve_summary", "ranking_stability"]

HAAR_LOW = "Haar entropy, lowest first"
HAAR_HIGH = "Haar entropy, highest first"
RANDOM = "random"
GRADIENT = "gradient importance (Michel et al.)"
ATTN_ENTROPY = "attention entropy, lowest first"
CONFIDENCE = "confidence (Voita et al.), lowest first"
RANKINGS = (HAAR_LOW, HAAR_HIGH, RANDOM, GRADIENT, ATTN_ENTROPY, CONFIDENCE)
"""The compared head rankings, in the order of Figure 7 and Tables 3-4."""
NULL_SET = "null"
"""The bottom-k test's name for a set of its null beside the rankings' names (pandas reads "null"
as a missing value unless told `keep_default_na=False`)."""

METRICS = {"txl": ("perplexity", False), "vit": ("accuracy", True),
           "hf": ("cosine similarity to the unmasked model", True), "lm": ("perplexity", False)}
"""Held-out metric of each objective (`models.gating.OBJECTIVES`: the model kinds, and lm for
a causal language model loaded through transformers) and whether higher is better."""
PERPLEXITY = ("txl", "lm")
"""Objectives whose rows are next-token NLLs: the metric is exp of their mean, Table 3's
areas are of its log."""


# -- the masked network: held-out metric, gradients of the gates ------------------------
def _row_scores(objective: str, out: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    if objective in PERPLEXITY:
        return out  # NLL; the perplexity is exp of its mean
    if objective == "vit":
        return (out.argmax(-1) == targets).double()
    return (out * targets).sum(-1)  # cosine: both are unit vectors


def _aggregate(objective: str, per_row: torch.Tensor) -> torch.Tensor:
    """(configs, examples) row scores -> (configs,) metric."""
    m = per_row.double().mean(-1)
    return m.exp() if objective in PERPLEXITY else m


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def evaluate_masks(model, layout: HeadLayout, data: HeldOut, gates, batch_size: int = 64,
                   progress_s: float = 30.0, attention: str = "sdpa") -> np.ndarray:
    """The held-out metric under each of `gates` (configs, layer, head): (configs,).

    Rows (mask, example) are batched `batch_size` at a time, every mask in the same
    forward passes as the others; progress is logged every `progress_s` seconds.
    attention: how an hf model's heads attend (`models.gating.ATTENTIONS`): "sdpa", fused,
    the heads gated off in every row of a pass skipped, or "eager", every head's
    probabilities materialised; the same metric to float rounding (docs/method.md §11.4).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    check_attention(attention)
    g = check_gates(gates, layout)
    C, E = g.shape[0], len(data)
    if E == 0:
        raise ValueError("data: no held-out examples")
    dev = _device(model)
    per_row = torch.empty(C * E, dtype=torch.float64)
    was_training = model.training
    model.eval()
    t0 = last = time.perf_counter()
    try:
        for start in range(0, C * E, batch_size):
            now = time.perf_counter()
            if start and now - last >= progress_s:  # long evaluations report progress in the job's log
                last = now
                log.info("masked forward passes: %d of %d rows (%d masks x %d examples), %.0f s, about %.0f s to go",
                         start, C * E, C, E, now - t0, (now - t0) * (C * E - start) / start)
            idx = torch.arange(start, min(start + batch_size, C * E))
            c, e = idx // E, idx % E
            inputs, mask = data.rows(e, dev)
            out = row_outputs(model, layout, inputs, g[c].to(dev), mask=mask, attention=attention)
            tgt = None if data.targets is None else data.targets[e].to(dev)
            per_row[idx] = _row_scores(layout.objective, out, tgt).double().cpu()
    finally:
        model.train(was_training)
    return _aggregate(layout.objective, per_row.view(C, E)).numpy()


def _row_loss(objective: str, out: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    if objective in PERPLEXITY:
        return out
    if objective == "vit":
        return F.cross_entropy(wide(out), targets, reduction="none")
    return (out * targets).sum(-1)  # v . e(x): a random projection of the embedding


def gate_gradients(model, layout: HeadLayout, data: HeldOut, batch_size: int = 64,
                   gates=None, attention: str = "sdpa") -> torch.Tensor:
    """dL(x)/dxi for every row x of `data`, at `gates` (default: all 1): (rows, layer, head).

    L: txl and lm the mean next-token NLL of the row's tokens; vit the cross-entropy with the
    row's label; hf the projection targets[row] . e(x) of the sentence embedding. The model runs in
    eval mode (no dropout). attention: as in `evaluate_masks` (with a gradient every head is
    computed, gated off or not: dL/dxi_h of a head at 0 is not 0).
    """
    check_attention(attention)
    dev = _device(model)
    n = len(data)
    at = None if gates is None else check_gates(gates, layout)
    grads = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, batch_size):
            sl = slice(start, min(start + batch_size, n))
            m = sl.stop - sl.start
            base = torch.ones((m, *layout.shape)) if at is None else at.expand(n, -1, -1)[sl]
            g = base.to(dev, next(model.parameters()).dtype).clone().requires_grad_(True)
            with torch.enable_grad():
                inputs, mask = data.rows(sl, dev)
                out = row_outputs(model, layout, inputs, g, mask=mask, attention=attention)
                tgt = None if data.targets is None else data.targets[sl].to(dev)
                loss = _row_loss(layout.objective, out, tgt).sum()
                (grad,) = torch.autograd.grad(loss, g)
            grads.append(grad.detach().cpu())
    finally:
        model.train(was_training)
    return torch.cat(grads)


def gradient_importance(model, layout: HeadLayout, samples: HeldOut, projections: int = 8,
                        seed: int = 0, batch_size: int = 64, attention: str = "sdpa") -> np.ndarray:
    """Michel et al.'s head importance |dL/dxi_h| at xi = 1 for each sample: (sample, layer, head).

    hf: L = v . e(x) for `projections` Gaussian v per sample (seeded), averaged; the mean
    over samples, normalised per layer (`normalize_per_layer`), is the ranking score.
    attention: as in `gate_gradients`.
    """
    if layout.objective != "hf":
        return gate_gradients(model, layout, samples, batch_size, attention=attention).abs().double().numpy()
    n = len(samples)
    gen = torch.Generator().manual_seed(int(seed))
    dim = reference_embeddings(model, layout, samples.inputs[:1],
                               mask=None if samples.mask is None else samples.mask[:1],
                               attention=attention).shape[-1]
    v = torch.randn((n * projections, dim), generator=gen)
    rows = HeldOut(samples.inputs.repeat_interleave(projections, 0), v,
                   None if samples.mask is None else samples.mask.repeat_interleave(projections, 0))
    g = gate_gradients(model, layout, rows, batch_size, attention=attention).abs().double()
    return g.view(n, projections, *layout.shape).mean(1).numpy()


def normalize_per_layer(importance) -> np.ndarray:
    """Divide each layer's head importances by their L2 norm (Michel et al. 2019, sec. 4.2).
    importance: (..., layer, head)."""
    x = np.asarray(importance, dtype=np.float64)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


# -- attention-based rankings ---------------------------------------------------------------
def _per_head(probs, reduce, chunk_bytes: int = 64 << 20, *, widen: bool = True) -> np.ndarray:
    """reduce(block (heads, query, key)) -> (heads,) over the leading axes of `probs`
    (..., query, key), a block of heads at a time: float64 temporaries of at most about
    `chunk_bytes`, whatever the number of heads (270 heads of 1024 tokens are 2.3 GB in float64).
    Blocks are cast to float64 unless `widen` is False (`reduce` then sees the stored dtype)."""
    p = np.asarray(probs)
    lead, (nq, nk) = p.shape[:-2], p.shape[-2:]
    flat = p.reshape(-1, nq, nk)
    step = max(1, chunk_bytes // max(1, nq * nk * 8))
    out = np.concatenate([reduce(flat[i:i + step].astype(np.float64) if widen else flat[i:i + step])
                          for i in range(0, flat.shape[0], step)] or [np.empty(0)])
    return out.reshape(lead)


def _entropy_rows(p: np.ndarray) -> np.ndarray:
    from scipy.special import xlogy

    # p log p with 0 log 0 = 0 in one pass (the same values as p * log(p) where p > 0)
    return -xlogy(p, p).sum(-1).mean(-1)


@functools.cache
def _xlogy_float16() -> np.ndarray:
    """x log x in float64 of each of the 65,536 float16 values, indexed by their bits."""
    from scipy.special import xlogy

    v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    with np.errstate(all="ignore"):
        return xlogy(v, v)


def _entropy_rows_float16(p: np.ndarray) -> np.ndarray:
    # a float16 store holds at most 65,536 distinct values: each element's x log x is looked up,
    # the same float64 numbers `_entropy_rows` computes from the widened block, summed alike
    return -np.take(_xlogy_float16(), p.view(np.uint16)).sum(-1).mean(-1)


def attention_entropy(probs) -> np.ndarray:
    """Mean over queries of the attention distribution's entropy -sum_k p log p (nats).
    probs (..., query, key) -> (...); 0 log 0 = 0 (masked keys). Computed in float64; a
    float16 array's terms come from a table of its 65,536 values (the same numbers, without
    widening every block to float64 and taking its logarithms; bench/prune.py times the scores
    of one store)."""
    p = np.asarray(probs)
    if p.dtype == np.float16:
        return _per_head(p, _entropy_rows_float16, widen=False)
    return _per_head(p, _entropy_rows)


def attention_confidence(probs) -> np.ndarray:
    """Voita et al.'s confidence: mean over queries of the largest attention weight.
    probs (..., query, key) -> (...). The row maxima are taken in the array's own float dtype
    (widening is monotone: the same maxima), their mean in float64."""
    p = np.asarray(probs)
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    return _per_head(p, _confidence_rows, widen=False)


def _confidence_rows(p: np.ndarray) -> np.ndarray:
    if p.dtype == np.float16:
        # non-negative finite float16 values (bits below 0x7C00) order as their bits do, and
        # integer maxima are vectorised where float16 ones are not
        bits = p.view(np.uint16).max(-1)
        if bits.size and bits.max() < 0x7C00:
            return bits.view(np.float16).astype(np.float64).mean(-1)
    return p.max(-1).astype(np.float64).mean(-1)


# -- orders and masks -----------------------------------------------------------------------
def lowest_first(scores) -> np.ndarray:
    """Head order (flat layer * n_head + head indices), lowest score first; ties by index."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not np.isfinite(s).all():
        raise ValueError("scores: contains NaN or inf")
    return np.argsort(s, kind="stable")


def random_order(n_units: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n_units)


def mask_counts(n_units: int, step: float = 0.1) -> np.ndarray:
    """Numbers of masked heads: round(f * n) for f = 0, step, 2 step, ..., 1 (duplicates dropped)."""
    if not 0 < step <= 1:
        raise ValueError(f"step: must be in (0, 1], got {step}")
    fr = np.append(np.arange(0.0, 1.0, step), 1.0)
    return np.unique(np.round(fr * n_units).astype(int))


def masks_from_order(order, ks, shape: tuple[int, int]) -> np.ndarray:
    """Gates (len(ks), layer, head): the first k heads of `order` at 0, the rest at 1."""
    order = np.asarray(order)
    n = shape[0] * shape[1]
    if sorted(order.tolist()) != list(range(n)):
        raise ValueError(f"order: expected a permutation of {n} heads, got {order.size} entries")
    g = np.ones((len(ks), n), dtype=np.float32)
    for i, k in enumerate(ks):
        g[i, order[:k]] = 0.0
    return g.reshape(len(ks), *shape)


# -- the bottom-k test: each ranking's first k heads against every (or random) k heads ----------
@dataclass(frozen=True)
class NullSets:
    """The null of the bottom-k test (docs/method.md §11.5): sets of k heads a ranking's first k
    are compared with.

    sets: (n_sets, k) int, flat unit indices (layer * n_head + head), ascending in each row.
    kind: "exact" (every k-subset, each once) or "random" (k-subsets drawn uniformly, each
    without repetition inside, independently of one another: two draws may coincide).
    n_total: comb(n_units, k), the number of k-subsets.
    """

    sets: np.ndarray
    kind: str
    n_total: int


def null_sets(n_units: int, k: int, exact_max: int, n_random: int, rng: np.random.Generator) -> NullSets:
    """The k-subsets of `n_units` heads the bottom-k test ranks a ranking's set among.

    Every one of the comb(n_units, k) subsets, in lexicographic order, where that is at most
    `exact_max` (the exact null: under the hypothesis that the ranking's set is any k-subset,
    each equally likely, its rank among them is an exact p-value); else `n_random` subsets drawn uniformly from `rng` (the first k of a
    uniform random permutation, each row independent: the Monte Carlo null).

    Parameters
    ----------
    n_units : int
        Heads of the network (layer x head), at least 1.
    k : int
        Heads per set, 1 <= k <= n_units.
    exact_max : int
        Largest number of subsets enumerated (0: always random).
    n_random : int
        Sets drawn where the subsets are more than `exact_max`, at least 1.
    rng : numpy.random.Generator
        Source of the random sets (unused for the exact null).

    Returns
    -------
    NullSets
        sets (n_sets, k), kind ("exact" or "random") and n_total = comb(n_units, k).

    Raises
    ------
    ValueError
        An argument out of range, naming it and its value.
    """
    for name, v, lo in (("n_units", n_units, 1), ("k", k, 1), ("exact_max", exact_max, 0), ("n_random", n_random, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    if k > n_units:
        raise ValueError(f"k: at most n_units = {n_units} heads per set, got {k}")
    total = math.comb(int(n_units), int(k))
    if total <= exact_max:
        flat = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n_units), k)),
                           dtype=np.int64, count=total * k)
        return NullSets(flat.reshape(total, k), "exact", total)
    # argsort of iid uniforms is a uniform permutation per row; its first k a uniform k-subset
    first = np.argsort(rng.random((n_random, n_units)), axis=1)[:, :k]
    return NullSets(np.sort(first, axis=1).astype(np.int64), "random", total)


def ranking_sets(orders: dict, k: int) -> dict:
    """The bottom-k set of each ranking of `orders` (name -> list of head orders): the first k heads
    of its first order, ascending; (k,) int each. Random orders are the null's business, not a
    ranking's: RANDOM is left out."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {k!r}")
    out = {}
    for name, ords in orders.items():
        if name == RANDOM:
            continue
        o = np.asarray(ords[0])
        if k > o.size:
            raise ValueError(f"k: {k} heads, but ranking {name!r} orders {o.size}")
        out[name] = np.sort(o[:k]).astype(np.int64)
    return out


def masks_from_sets(sets, shape: tuple[int, int]) -> np.ndarray:
    """Gates (n_sets, layer, head): the heads of each row of `sets` (n_sets, k), flat unit indices,
    at 0, the rest at 1."""
    s = np.asarray(sets)
    n = shape[0] * shape[1]
    if s.ndim != 2 or not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"sets: expected an integer array (n_sets, k), got {s.dtype} of shape {s.shape}")
    if s.size and (s.min() < 0 or s.max() >= n):
        raise ValueError(f"sets: unit indices must be in [0, {n}) for {shape} (layer, head), "
                         f"got [{s.min()}, {s.max()}]")
    g = np.ones((s.shape[0], n), dtype=np.float32)
    np.put_along_axis(g, s, 0.0, axis=1)
    return g.reshape(s.shape[0], *shape)


# -- summaries ------------------------------------------------------------------------------
def auc(fractions, y) -> np.ndarray:
    """Trapezoidal area under y(fraction) over [0, 1]; y (..., n_k)."""
    return np.trapezoid(np.asarray(y, dtype=np.float64), np.asarray(fractions, dtype=np.float64), axis=-1)


def relative_loss(y, base: float, higher_is_better: bool) -> np.ndarray:
    """Relative loss of the metric against the unmasked `base` (positive = worse)."""
    y = np.asarray(y, dtype=np.float64)
    return (base - y) / abs(base) if higher_is_better else (y - base) / abs(base)


def tolerated_fraction(fractions, y, base: float, higher_is_better: bool, tol: float = 0.01) -> np.ndarray:
    """Largest fraction masked such that it and every smaller fraction lose at most `tol`
    (relative) of the metric; y (..., n_k) -> (...)."""
    f = np.asarray(fractions, dtype=np.float64)
    ok = relative_loss(y, base, higher_is_better) <= tol + 1e-12
    prefix = np.cumprod(ok, axis=-1).astype(bool)
    return np.where(prefix, f, 0.0).max(-1)


def spearman_between(scores) -> np.ndarray:
    """Spearman rank correlation between every pair of rows of scores (rows, heads)."""
    from scipy.stats import rankdata
    r = rankdata(np.asarray(scores, dtype=np.float64), axis=1)
    return np.corrcoef(r)


def stability(scores, fraction: float = 0.1) -> dict:
    """How a ranking's per-sample scores (sample, heads) agree across samples: mean and min
    Spearman over pairs, mean and min Jaccard of the `fraction` of heads masked first
    (lowest scores)."""
    from .entropy import jaccard_stability
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] < 2:
        raise ValueError(f"scores: expected (samples >= 2, heads), got shape {s.shape}")
    off = ~np.eye(s.shape[0], dtype=bool)
    rho = spearman_between(s)[off]
    jac = jaccard_stability(s, fraction, "bottom")[off]
    return {"spearman_mean": float(rho.mean()), "spearman_min": float(rho.min()),
            "jaccard_mean": float(jac.mean()), "jaccard_min": float(jac.min())}


def curve_summary(fractions, curves: dict, base: float, higher_is_better: bool, tol: float, metric: str,
                  log: bool = False) -> list[dict]:
    """Table 3: for each ranking's curve(s) (n_k,) or (orders, n_k), the trapezoidal area under
    the curve (of log y with `log`: perplexity), the largest fraction masked within `tol`
    (`tolerated_fraction`) and the metric at the fraction nearest 50%; mean, sd (ddof 1, NaN
    for one order) and per-order values. One row per ranking, in the order of `curves`."""
    fractions = np.asarray(fractions, dtype=np.float64)
    rows = []
    for k, y in curves.items():
        c = np.atleast_2d(y)
        a = auc(fractions, np.log(c)) if log else auc(fractions, c)
        tf = tolerated_fraction(fractions, c, base, higher_is_better, tol)
        rows.append({"ranking": k, "n_orders": c.shape[0], "auc": float(a.mean()),
                     "auc_sd": float(a.std(ddof=1)) if c.shape[0] > 1 else float("nan"),
                     "auc_seeds": a.tolist(), "tolerated_fraction": float(tf.mean()),
                     "tolerated_fraction_sd": float(tf.std(ddof=1)) if c.shape[0] > 1 else float("nan"),
                     "tolerated_seeds": tf.tolist(),
                     f"{metric} at 50%": float(c[:, np.argmin(abs(fractions - .5))].mean())})
    return rows


def ranking_stability(orders: dict, per_sample: dict, mean_scores: dict, fraction: float) -> list[dict]:
    """Table 4: for each ranking of `orders`, the `stability` of its per-sample scores (sample,
    layer, head) across samples; a ranking without scores (random) across its orders, with
    the position in the order as score. And the Spearman correlation of its mean score with
    gradient importance's (GRADIENT). NaN where there is only one sample (order) or no score."""
    none = dict.fromkeys(("spearman_mean", "spearman_min", "jaccard_mean", "jaccard_min"), float("nan"))
    grad = mean_scores[GRADIENT].reshape(-1)
    rows = []
    for k, ords in orders.items():
        if k not in per_sample:
            sc = np.argsort(np.stack(ords), axis=1).astype(float)  # score = position in the order
            st = stability(sc, fraction) if len(ords) > 1 else none
            rho, across = float("nan"), "seeds"
        else:
            s = per_sample[k]
            st = stability(s.reshape(s.shape[0], -1), fraction) if s.shape[0] > 1 else none
            rho = float(spearman_between(np.stack([mean_scores[k].reshape(-1), grad]))[0, 1])
            across = "samples"
        rows.append({"ranking": k, "across": across, **st, "spearman_with_gradient": rho})
    return rows
