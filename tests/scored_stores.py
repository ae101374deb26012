"""Attention stores of small random networks with pre-softmax scores, causal or not, written and
taken through the real organize and decompose stages: what the Theorem 1 tests read."""
from __future__ import annotations

import numpy as np
import torch

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
