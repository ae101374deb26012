"""Stores in the workflow's layout with synthetic heads, for the explorer's benchmark and tests:
any size (1024 tokens, GQA's kv_group coordinate) without training or organizing a model.

Heads are low-rank logits plus a locality band (so they have structure to look at); the trees
are balanced trees over random orders (the explorer's cost does not depend on them). A store
can hold the model's own mask (`allowed`, as extract writes it: causal decoders) and a subset
of the model's layers and heads (its `layer` / `head` coordinates are then the model's indices).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from ..models import adapter_for
from ..store import write_store
from ..trees import balanced_tree

__all__ = ["synthetic_model"]


def _indices(values, n: int, what: str) -> np.ndarray:
    if values is None:
        return np.arange(n)
    v = np.asarray(values, dtype=np.int64)
    if v.shape != (n,) or np.any(np.diff(v) <= 0) or v[0] < 0:
        raise ValueError(f"{what}: expected {n} increasing indices >= 0, got {values}")
    return v


def synthetic_model(root, name: str, kind: str, n: int, n_layer: int, n_head: int, n_samples: int,
                    kv_group=None, seed: int = 0, allowed=None, layers=None, heads=None, tokens=None) -> dict:
    """Write root/name/{attention,organized,decomposed}/sample<i>.zarr, entropy.zarr and
    tables/table{1,2}.csv; return what the explorer stage needs to read them (`name`, `kind`,
    `quantity`, `base`, `n_samples`). `kv_group`: (n_head,) KV group of each head, stored as the
    attention store's `kv_group` coordinate. `allowed`: the model's mask, (n, n) or
    (n_layer, n, n) bool, False where a head may not attend (for example
    `np.tril(np.ones((n, n), bool))`, a causal decoder): stored as the `allowed` variable, with
    the probabilities the masked softmax of the (pre-mask) scores, as extract stores them.
    `layers` / `heads`: the model's indices of the n_layer layers and n_head heads stored (a
    subset store, extract.layers / extract.heads); default 0, 1, ... `tokens`: the n token strings
    stored as `token_text`, as a tokenizer gives them (default w0, w1, ...). The organized stores
    analyse the quantity a model of `kind` usually is (`models.kinds.ModelKind.typical_quantity`)."""
    quantity = adapter_for(kind).typical_quantity
    rng = np.random.default_rng(seed)
    base = Path(root) / name
    units = n_layer * n_head
    lay_ids, head_ids = _indices(layers, n_layer, "layers"), _indices(heads, n_head, "heads")
    layer, head = lay_ids[np.arange(units) // n_head], head_ids[np.arange(units) % n_head]
    extra = {} if kv_group is None else {"kv_group": ("head", np.asarray(kv_group, dtype=np.int64))}
    tokens = [f"w{i}" for i in range(n)] if tokens is None else [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"tokens: {len(tokens)} given for {n} tokens")
    ok = np.ones((n_layer, n, n), dtype=bool) if allowed is None else \
        np.broadcast_to(np.asarray(allowed, dtype=bool), (n_layer, n, n))
    for s in range(n_samples):
        q, k = rng.normal(size=(2, n_layer, n_head, n, 8))
        band = -0.05 * np.abs(np.arange(n)[:, None] - np.arange(n)[None])
        scores = (np.einsum("lhqd,lhkd->lhqk", q, k) / np.sqrt(8) + band).astype(np.float32)
        z = np.where(ok[:, None], scores, -np.inf)
        top = z.max(-1, keepdims=True)
        probs = np.exp(z - np.where(np.isfinite(top), top, 0.0))
        probs /= np.maximum(probs.sum(-1, keepdims=True), np.finfo(np.float64).tiny)
        write_store(xr.Dataset({"scores": (("layer", "head", "query", "key"), scores),
                                "probs": (("layer", "head", "query", "key"), probs.astype(np.float32)),
                                "allowed": (("layer", "query", "key"), np.ascontiguousarray(ok))},
                               coords={"layer": lay_ids, "head": head_ids,
                                       "query": np.arange(n), "key": np.arange(n),
                                       "token": ("query", np.arange(n)), **extra},
                               attrs={"model": name, "kind": kind, "sample": s,
                                      "model_layers": int(lay_ids[-1]) + 1, "model_heads": int(head_ids[-1]) + 1,
                                      "token_text": json.dumps(tokens)}),
                    base / f"attention/sample{s}.zarr")
        trees = {ax: balanced_tree(rng.permutation(m)).labels for ax, m in (("q", n), ("k", n), ("h", units))}
        unit_coords = {"unit_layer": ("unit", layer), "unit_head": ("unit", head)}
        write_store(xr.Dataset({"tree_q": (("level_q", "query"), trees["q"]),
                                "tree_k": (("level_k", "key"), trees["k"]),
                                "tree_h": (("level_h", "unit"), trees["h"]),
                                "affinity_q": (("query", "query_"), np.eye(n, dtype=np.float32)),
                                "affinity_k": (("key", "key_"), np.eye(n, dtype=np.float32)),
                                "affinity_h": (("unit", "unit_"), np.eye(units, dtype=np.float32))},
                               coords=unit_coords, attrs={"quantity": quantity}),
                    base / f"organized/sample{s}.zarr")
        write_store(xr.Dataset({"diffusion_coords": (("unit", "component"), rng.normal(size=(units, 3)))},
                               coords=unit_coords), base / f"decomposed/sample{s}.zarr")
    ent = rng.gamma(2.0, size=(n_samples, n_layer, n_head))
    write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), ent),
                            "head_sparsity": (("sample", "layer", "head"), ent * 3)},
                           coords={"sample": np.arange(n_samples), "layer": lay_ids,
                                   "head": head_ids}), base / "entropy.zarr")
    (base / "tables").mkdir(parents=True, exist_ok=True)
    # Table 1 names heads by the model's indices, as the tables stage does
    pd.DataFrame({"set": ["bottom"], "rank": [1], "layer": [int(lay_ids[-1])], "head": [int(head_ids[-1])],
                  "count": ["1/1"],
                  "mean_entropy": [1.0]}).to_csv(base / "tables/table1.csv", index=False)
    pd.DataFrame({"sample": range(n_samples), "network_entropy": rng.gamma(2.0, size=n_samples)}).to_csv(
        base / "tables/table2.csv", index=False)
    return {"name": name, "kind": kind, "quantity": quantity, "base": base,
            "n_samples": n_samples}
