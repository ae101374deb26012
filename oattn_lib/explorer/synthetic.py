"""Stores in the workflow's layout with synthetic heads, for the explorer's benchmark and tests:
any size (1024 tokens, GQA's kv_group coordinate) without training or organizing a model.

Heads are low-rank logits plus a locality band (so they have structure to look at); the trees
are balanced trees over random orders (the explorer's cost does not depend on them).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from ..store import write_store
from ..trees import balanced_tree

__all__ = ["synthetic_model"]


def synthetic_model(root, name: str, kind: str, n: int, n_layer: int, n_head: int, n_samples: int,
                    kv_group=None, seed: int = 0) -> dict:
    """Write root/name/{attention,organized,decomposed}/sample<i>.zarr, entropy.zarr and
    tables/table{1,2}.csv; return what the explorer stage needs to read them (`name`, `kind`,
    `quantity`, `base`, `n_samples`). `kv_group`: (n_head,) KV group of each head, stored as the
    attention store's `kv_group` coordinate."""
    rng = np.random.default_rng(seed)
    base = Path(root) / name
    units = n_layer * n_head
    layer, head = np.divmod(np.arange(units), n_head)
    extra = {} if kv_group is None else {"kv_group": ("head", np.asarray(kv_group, dtype=np.int64))}
    for s in range(n_samples):
        q, k = rng.normal(size=(2, n_layer, n_head, n, 8))
        band = -0.05 * np.abs(np.arange(n)[:, None] - np.arange(n)[None])
        scores = (np.einsum("lhqd,lhkd->lhqk", q, k) / np.sqrt(8) + band).astype(np.float32)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        write_store(xr.Dataset({"scores": (("layer", "head", "query", "key"), scores),
                                "probs": (("layer", "head", "query", "key"), probs.astype(np.float32))},
                               coords={"layer": np.arange(n_layer), "head": np.arange(n_head),
                                       "query": np.arange(n), "key": np.arange(n),
                                       "token": ("query", np.arange(n)), **extra},
                               attrs={"model": name, "kind": kind, "sample": s,
                                      "token_text": json.dumps([f"w{i}" for i in range(n)])}),
                    base / f"attention/sample{s}.zarr")
        trees = {ax: balanced_tree(rng.permutation(m)).labels for ax, m in (("q", n), ("k", n), ("h", units))}
        unit_coords = {"unit_layer": ("unit", layer), "unit_head": ("unit", head)}
        write_store(xr.Dataset({"tree_q": (("level_q", "query"), trees["q"]),
                                "tree_k": (("level_k", "key"), trees["k"]),
                                "tree_h": (("level_h", "unit"), trees["h"]),
                                "affinity_q": (("query", "query_"), np.eye(n, dtype=np.float32)),
                                "affinity_k": (("key", "key_"), np.eye(n, dtype=np.float32)),
                                "affinity_h": (("unit", "unit_"), np.eye(units, dtype=np.float32))},
                               coords=unit_coords, attrs={"quantity": "scores" if kind == "txl" else "probs"}),
                    base / f"organized/sample{s}.zarr")
        write_store(xr.Dataset({"diffusion_coords": (("unit", "component"), rng.normal(size=(units, 3)))},
                               coords=unit_coords), base / f"decomposed/sample{s}.zarr")
    ent = rng.gamma(2.0, size=(n_samples, n_layer, n_head))
    write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), ent),
                            "head_sparsity": (("sample", "layer", "head"), ent * 3)},
                           coords={"sample": np.arange(n_samples), "layer": np.arange(n_layer),
                                   "head": np.arange(n_head)}), base / "entropy.zarr")
    (base / "tables").mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"set": ["bottom"], "rank": [1], "layer": [0], "head": [0], "count": ["1/1"],
                  "mean_entropy": [1.0]}).to_csv(base / "tables/table1.csv", index=False)
    pd.DataFrame({"sample": range(n_samples), "network_entropy": rng.gamma(2.0, size=n_samples)}).to_csv(
        base / "tables/table2.csv", index=False)
    return {"name": name, "kind": kind, "quantity": "scores" if kind == "txl" else "probs", "base": base,
            "n_samples": n_samples}
