"""The explorer's data for one model: which resolution fits the page's budget, and each sample
encoded at it.

Two forms of a head reach the page. When the tokens fit `max_side`, every head goes at full
resolution and, for the heads with a 2-D organization, the paraproduct residual; the browser
derives the organized views by permuting rows and columns (exact: the permutation of the
quantised head is the quantisation of the permuted head). Beyond `max_side` tokens the page
gets the level of detail (`lod`): each of the four views averaged over a cut of its own trees
(token order: the balanced tree; 3-D view: the network's query and key trees; 2-D view and
residual: the head's own trees), at most `side` folders per axis, plus full resolution for as
many heads as the budget allows, which the page shows where the user zooms in. Every matrix
is quantised to 8 bits with its own range; the codes are gzipped and base64-encoded.

The model's own mask (a causal decoder's future, a sliding window, padding) is shared by the
heads of a layer: the page gets it once per distinct layer mask, in token order, as a rule
where it is one (`band`: the key may be lo..hi positions after the query; causal is
[-(n - 1), 0]) and as packed bits otherwise (`mask_rules`). The browser masks every view
of a head with it, permuted with the view's rows and columns. Masked entries take no part in
a matrix's 8-bit range (they are coded 0) and none in a level of detail's block means
(`lod.block_mean`): a block the model cannot attend to anywhere is masked, the others are
means of their allowed entries.
"""
from __future__ import annotations

import base64
import gzip
import json
import math
from dataclasses import dataclass, field

import numpy as np

from ..heads2d import HeadOrganization
from .collect import Sample
from .lod import block_mean, boundary_depth, pack, quantise, tree_cut, uniform_cut

__all__ = ["Plan", "plan", "encode_sample", "encoded_bytes", "full_head_bytes", "estimate_sample_bytes", "round_values",
           "mask_rules", "allowed_of_rule", "SIDES"]

SIDES = (128, 96, 64, 48, 32, 24, 16, 12, 8)
_CHUNK = 16  # heads averaged at a time, at most: bounds the memory of a level of detail of long sequences
_CHUNK_BYTES = 256 << 20  # and at most this many bytes of one float64 copy of them (2 heads at 4096 tokens)


@dataclass(frozen=True)
class Plan:
    """The resolution chosen for a model's page: `side` (folders per axis of the level of detail,
    or the number of tokens at full resolution), `full_mode` (every head at full resolution),
    `full` ({sample position: units also shipped at full resolution}), `size` (the data's
    estimated bytes in the page) and the `budget`."""

    side: int
    full_mode: bool
    full: dict = field(default_factory=dict)
    size: int = 0
    budget: int = 0

    def describe(self) -> dict:
        return {"side": self.side, "full_mode": self.full_mode, "estimated_bytes": self.size,
                "budget_bytes": self.budget, "full_units": {str(k): sorted(v) for k, v in self.full.items()}}


def _b64(n_bytes: float) -> int:
    return int(math.ceil(n_bytes / 3) * 4)


def estimate_sample_bytes(n_q: int, n_k: int, n_units: int, n_2d: int, side: int) -> int:
    """Bytes of one sample in the page without compression (an upper bound of what gzip leaves):
    8-bit codes in base64, orders and boundary depths as JSON integers, per-head numbers."""
    over = 6 * (n_q + n_k) * (2 + 2 * n_2d) + 120 * n_units + 40 * n_2d
    if n_q <= side and n_k <= side:
        return over + _b64((n_units + n_2d) * n_q * n_k)
    return over + _b64(2 * (n_units + n_2d) * min(n_q, side) * min(n_k, side))


def plan(n_q: int, n_k: int, n_units: int, n_samples: int, units_2d: list[int], max_side: int, budget: int,
         sample_bytes=None, head_bytes: int | None = None) -> Plan:
    """The finest resolution whose size fits `budget` bytes: every head at full resolution if the
    tokens fit `max_side`, else the largest level of detail (`side` <= max_side); then full
    resolution for the heads with a 2-D organization, in priority order, sample by sample, while
    it still fits. `sample_bytes(side)` is one sample's size at `side` (default: the uncompressed
    estimate), `head_bytes` one head's full resolution (head and residual)."""
    if max_side < 1:
        raise ValueError(f"max_side: must be >= 1, got {max_side}")
    n2 = len(units_2d)
    if sample_bytes is None:
        def sample_bytes(side):
            return estimate_sample_bytes(n_q, n_k, n_units, n2, side)
    if head_bytes is None:
        head_bytes = 2 * _b64(n_q * n_k)
    if n_q <= max_side and n_k <= max_side:
        size = n_samples * sample_bytes(max(n_q, n_k))
        if size <= budget:
            return Plan(max(n_q, n_k), True, {s: list(range(n_units)) for s in range(n_samples)}, size, budget)
    top = max(1, min(max_side, max(n_q, n_k) - 1))
    sides = sorted({top, *(s for s in SIDES if s < top)}, reverse=True)
    for side in sides:
        size = n_samples * sample_bytes(side)
        if size <= budget:
            break
    full: dict = {s: [] for s in range(n_samples)}
    for u in units_2d:
        for s in range(n_samples):
            if size + head_bytes > budget:
                return Plan(side, False, full, size, budget)
            full[s].append(u)
            size += head_bytes
    return Plan(side, False, full, size, budget)


def _tree(tree) -> dict:
    return {"order": tree.order.tolist(), "depth": boundary_depth(tree).tolist()}


def mask_rules(allowed) -> dict | None:
    """The page's form of a sample's masks, `allowed` (layer, query, key) bool (None: nothing
    masked): {"rules": distinct layer masks, "layers": per layer the index of its rule, -1 where
    the layer masks nothing}, or None when no layer masks anything. A rule is {"band": [lo, hi]}
    (allowed exactly where lo <= key - query <= hi: causal, sliding windows) or {"bits": the
    mask's np.packbits, gzip, base64} (padding and any other mask)."""
    if allowed is None:
        return None
    a = np.asarray(allowed)
    if a.ndim != 3 or a.dtype != bool:
        raise ValueError(f"allowed: expected a (layer, query, key) boolean array, got {a.dtype} {a.shape}")
    n_q, n_k = a.shape[1:]
    any_row = a.any(axis=2)  # (layer, query)
    first = np.argmax(a, axis=2) - np.arange(n_q)  # key - query of each row's first and last allowed entry
    last = n_k - 1 - np.argmax(a[:, :, ::-1], axis=2) - np.arange(n_q)
    lo = np.where(any_row, first, n_k).min(axis=1)[:, None, None]
    hi = np.where(any_row, last, -n_q).max(axis=1)[:, None, None]
    d = np.arange(n_k)[None, :] - np.arange(n_q)[:, None]
    is_band = (((d >= lo) & (d <= hi)) == a).all(axis=(1, 2)) & any_row.any(axis=1)
    full = a.all(axis=(1, 2))
    rules, seen, layers = [], {}, []
    for i in range(a.shape[0]):  # bookkeeping of a few dozen layers: which distinct rule each has
        if full[i]:
            layers.append(-1)
            continue
        rule = {"band": [int(lo[i, 0, 0]), int(hi[i, 0, 0])]} if is_band[i] else {"bits": pack(np.packbits(a[i]))}
        key = json.dumps(rule)
        if key not in seen:
            seen[key] = len(rules)
            rules.append(rule)
        layers.append(seen[key])
    return {"rules": rules, "layers": layers} if rules else None


def allowed_of_rule(rule: dict, n_q: int, n_k: int) -> np.ndarray:
    """The (query, key) mask a rule of `mask_rules` stands for (what the page draws)."""
    if "band" in rule:
        lo, hi = rule["band"]
        d = np.arange(n_k)[None, :] - np.arange(n_q)[:, None]
        return (d >= lo) & (d <= hi)
    bits = np.frombuffer(gzip.decompress(base64.b64decode(rule["bits"])), dtype=np.uint8)
    return np.unpackbits(bits, count=n_q * n_k).reshape(n_q, n_k).astype(bool)


def _masked(x: np.ndarray, allowed) -> np.ndarray:
    """x with its masked entries NaN (they take no part in its 8-bit range)."""
    return x if allowed is None else np.where(allowed, x, np.nan)


def _quantised(mats) -> dict:
    """8-bit codes of matrices of any shapes, concatenated; one range each (NaN: masked, coded 0)."""
    mats = list(mats)
    if not mats:
        return {"data": "", "lo": [], "hi": []}
    codes, lo, hi = zip(*(quantise(m) for m in mats))
    flat = np.concatenate([c.reshape(-1) for c in codes])
    return {"data": pack(flat), "lo": [float(v) for v in lo], "hi": [float(v) for v in hi]}


def round_values(a, digits: int = 5):
    """JSON numbers with `digits` significant digits; NaN becomes null."""
    a = np.asarray(a, dtype=np.float64)
    out = np.vectorize(lambda v: float(f"{v:.{digits}g}") if np.isfinite(v) else None, otypes=[object])(a)
    return out.tolist()


def _chunked_means(x: np.ndarray, rows, cols, row_order=None, col_order=None, allowed=None, n_head: int = 1):
    """Block means of every head of x (unit, n, m), optionally permuted first, a few heads at a time;
    `allowed` (layer, n, m): the mask of unit u's layer u // n_head (None: nothing masked)."""
    step = max(1, min(_CHUNK, _CHUNK_BYTES // (8 * x.shape[1] * x.shape[2])))
    for a in range(0, x.shape[0], step):
        c = x[a:a + step]
        ok = None if allowed is None else allowed[np.arange(a, a + c.shape[0]) // n_head]
        if row_order is not None:
            c = c[:, row_order][:, :, col_order]
            ok = None if ok is None else ok[:, row_order][:, :, col_order]
        yield from block_mean(c, rows, cols, ok)


def _unit_allowed(s: Sample, u: int, row_order=None, col_order=None):
    """The mask of unit u (its layer's), in its token order or permuted; None: nothing masked."""
    if s.layer_allowed is None:
        return None
    a = s.layer_allowed[u // s.info["n_head"]]
    return a if row_order is None else a[np.ix_(row_order, col_order)]


def encode_sample(s: Sample, orgs: dict[int, HeadOrganization], p: Plan, position: int) -> dict:
    """One sample as the page's JSON: tokens, trees (leaf order and boundary depths), diffusion
    coordinates, the 2-D organizations, the model's masks (`mask_rules`; absent when nothing is
    masked), and the heads at full resolution and/or level of detail."""
    n_units, n_q, n_k = s.x.shape
    n_head = s.info["n_head"]
    units2d = list(orgs)
    out = {"sample": s.index, "n_query": n_q, "n_key": n_k, "tokens": s.tokens, "key_tokens": s.key_tokens,
           "info": {k: v for k, v in s.info.items() if k in ("label", "source_index")},
           "tree_q": _tree(s.tree_q), "tree_k": _tree(s.tree_k),
           "tree_h": s.tree_h.labels.tolist(), "diffusion": round_values(s.diffusion),
           "o2d": {str(u): {"rows": _tree(o.tree_r), "cols": _tree(o.tree_c),
                            "rel": float(o.relative_residual),
                            "rel_unorganized": float(o.relative_residual_unorganized)}
                   for u, o in orgs.items()}}
    rules = mask_rules(s.layer_allowed)
    if rules is not None:
        out["mask"] = rules
    full = sorted(p.full.get(position, []))
    if full:
        fr = [u for u in full if u in orgs]
        out["full"] = {"units": full, "raw": _quantised(_masked(s.x[u], _unit_allowed(s, u)) for u in full),
                       "resid_units": fr, "resid": _quantised(_masked(orgs[u].residual, _unit_allowed(
                           s, u, orgs[u].tree_r.order, orgs[u].tree_c.order)) for u in fr)}
    if p.full_mode:
        return out
    m = p.side
    er, ec = uniform_cut(n_q, m), uniform_cut(n_k, m)
    e3r, e3c = tree_cut(boundary_depth(s.tree_q), m), tree_cut(boundary_depth(s.tree_k), m)
    edges2d, org2, res2 = {}, [], []
    for u in units2d:
        o = orgs[u]
        r, c = tree_cut(boundary_depth(o.tree_r), m), tree_cut(boundary_depth(o.tree_c), m)
        edges2d[str(u)] = {"rows": r.tolist(), "cols": c.tolist()}
        ok = _unit_allowed(s, u, o.tree_r.order, o.tree_c.order)
        org2.append(block_mean(s.x[u][np.ix_(o.tree_r.order, o.tree_c.order)], r, c, ok))
        res2.append(block_mean(o.residual, r, c, ok))
    la = s.layer_allowed
    out["lod"] = {"raw": {"rows": er.tolist(), "cols": ec.tolist(),
                          **_quantised(_chunked_means(s.x, er, ec, allowed=la, n_head=n_head))},
                  "org3d": {"rows": e3r.tolist(), "cols": e3c.tolist(),
                            **_quantised(_chunked_means(s.x, e3r, e3c, s.tree_q.order, s.tree_k.order, la, n_head))},
                  "units2d": units2d, "edges2d": edges2d, "org2d": _quantised(org2), "resid": _quantised(res2)}
    return out


def full_head_bytes(s: Sample, orgs: dict[int, HeadOrganization], u: int) -> int:
    """Bytes that shipping head `u` of sample `s` at full resolution adds to the page (the head,
    and its residual where it has a 2-D organization)."""
    extra = {"raw": _quantised([_masked(s.x[u], _unit_allowed(s, u))])}
    if u in orgs:
        o = orgs[u]
        extra["resid"] = _quantised([_masked(o.residual, _unit_allowed(s, u, o.tree_r.order, o.tree_c.order))])
    return encoded_bytes(extra)


def encoded_bytes(encoded: dict) -> int:
    """Bytes of an encoded sample in the page (its compact JSON)."""
    return len(json.dumps(encoded, separators=(",", ":"), allow_nan=False))
