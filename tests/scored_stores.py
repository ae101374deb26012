"""Attention stores of small networks with pre-softmax scores, causal or not: random ones taken
through the real organize and decompose stages (what the Theorem 1 tests read), and planted ones
whose structure every analysis must find the same way (the stability and GPU tests)."""
from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from oattn_lib import store
from oattn_lib.stages.decompose import decompose
from oattn_lib.stages.extract import attention_dataset
from oattn_lib.stages.organize import organize


def scored_samples(root, rng, shape: tuple[int, int, int], causal: bool, n_samples: int = 2) -> list[tuple]:
    """(attention store, decomposed store) of `n_samples` samples of a (layers, heads, tokens)
    network whose scores rise along the rows; causal: the future masked in the probabilities."""
    n_layer, n_head, n = shape
    paths = []
    for s in range(n_samples):
        scores = (rng.standard_normal((n_layer, n_head, n, n)) + np.linspace(0, 2, n)[:, None]).astype(np.float32)
        sc = torch.from_numpy(scores)
        if causal:
            sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        probs = torch.softmax(sc, -1).numpy()
        ds = attention_dataset(scores, probs, np.arange(n), {"model": "m", "kind": "txl", "sample": s})
        a, o, d = (root / f"{causal}_{k}{s}.zarr" for k in ("att", "org", "dec"))
        store.write_store(ds, a)
        organize(a, o, "scores", params={"n_iters": 1})
        decompose(a, o, d, "scores", figure_heads=[[0, 0], [-1, -1]], questionnaire2d_iters=2, random_tree_seeds=1)
        paths.append((a, d))
    return paths


def planted(seed: int, n: int = 24, n_layer: int = 2, n_head: int = 4) -> np.ndarray:
    """(layer, head, query, key) scores with 3 query, 3 key and 2 head clusters, far apart, plus
    small noise, each head at its own scale (so its entropy ranks it clearly): a structure every
    analysis must find the same way."""
    rng = np.random.default_rng(seed)
    cq, ck = np.arange(n) % 3, (np.arange(n) // 2) % 3
    ch = np.arange(n_layer * n_head) % 2
    pattern = rng.permutation(18).reshape(3, 3, 2).astype(float)
    x = pattern[cq[:, None, None], ck[None, :, None], ch[None, None, :]] + 0.01 * rng.random((n, n, n_layer * n_head))
    x = x * (1.0 + 0.5 * rng.permutation(n_layer * n_head))[None, None, :]
    return x.transpose(2, 0, 1).reshape(n_layer, n_head, n, n).astype(np.float32)


def planted_store(path, scores: np.ndarray, causal: bool = False):
    """An attention store of (layer, head, query, key) `scores` with their (masked) softmax, two
    heads to a key/value group; causal: the future masked (`allowed`, and 0 in the probabilities)."""
    n_layer, n_head, n, _ = scores.shape
    allowed = np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
    s = np.where(allowed, scores, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    ds = xr.Dataset({"scores": (("layer", "head", "query", "key"), scores),
                     "probs": (("layer", "head", "query", "key"), (e / e.sum(-1, keepdims=True)).astype(np.float32)),
                     "allowed": (("layer", "query", "key"), np.broadcast_to(allowed, (n_layer, n, n)).copy())},
                    coords={"layer": np.arange(n_layer), "head": np.arange(n_head), "query": np.arange(n),
                            "key": np.arange(n), "kv_group": ("head", np.arange(n_head) // 2)},
                    attrs={"model": "planted", "kind": "attention"})
    store.write_store(ds, path)
    return path
