"""Stage `organize2d`: each sample's own 2-D organization of the heads the explorer shows in 2-D
(docs/method.md §5.3, §7, §12.1).

The heads are the figure heads, then the extremes of the mean Haar entropy over samples, lowest
and highest in turn, `explorer.heads_2d` in all (`heads2d.heads_for_2d`). The figure
heads' organizations are the decompose stage's, read from its store; the others are computed
here, one job per sample after the entropy stage, so that they run beside the rest of the run
(an LLM's prune) and the explorer's page job only reads them.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import xarray as xr

from .. import store
from ..heads2d import sample_organizations, units_2d
from ..trees import padded_labels
from .common import each_sample

log = logging.getLogger("oattn")

__all__ = ["organize2d", "organize2d_samples"]


def organize2d(attention_store, decomposed_store, entropy_store, out, *, quantity: str, crop=None,
               figure_heads, heads_2d: int, questionnaire2d_iters: int, config_slice: dict | None = None,
               code: str | None = None, device="cpu") -> None:
    """Write `out`: the 2-D organization (row and column trees), paraproduct residual and relative
    residuals of each head `units_2d` picks, for one sample, the questionnaires on the device
    `device` resolves to. A store without pre-softmax scores gets none (the reason in the attribute
    `not_run`)."""
    t0 = time.perf_counter()
    units, layers, heads = units_2d(entropy_store, figure_heads, heads_2d)
    orgs, computed, not_run = sample_organizations(attention_store, decomposed_store, units, layers, heads,
                                                   quantity=quantity, crop=crop,
                                                   questionnaire2d_iters=questionnaire2d_iters, device=device)
    kept = list(orgs)
    n_q, n_k = orgs[kept[0]].residual.shape if kept else (0, 0)
    att_attrs = store.read_store(attention_store, lazy=True).attrs
    ds = xr.Dataset(
        {"row_tree": (("unit2d", "level_r", "row"), padded_labels([orgs[u].tree_r for u in kept], n_q)),
         "col_tree": (("unit2d", "level_c", "col"), padded_labels([orgs[u].tree_c for u in kept], n_k)),
         "residual": (("unit2d", "row", "col"), np.stack([orgs[u].residual for u in kept]).astype(np.float32)
                      if kept else np.zeros((0, 0, 0), np.float32)),
         "rel_residual": ("unit2d", np.array([orgs[u].relative_residual for u in kept], dtype=np.float64)),
         "rel_residual_unorganized": ("unit2d", np.array([orgs[u].relative_residual_unorganized for u in kept],
                                                        dtype=np.float64))},
        coords={"unit2d": np.asarray(kept, dtype=np.int64),
                "unit2d_layer": ("unit2d", np.array([int(layers[u // len(heads)]) for u in kept], dtype=np.int64)),
                "unit2d_head": ("unit2d", np.array([int(heads[u % len(heads)]) for u in kept], dtype=np.int64))},
        attrs={**{k: v for k, v in att_attrs.items() if k in ("model", "sample", "kind")},
               **store.provenance_attrs(config_slice or {}, att_attrs.get("checkpoint_sha256"), code=code,
                                        quantity=quantity)})
    if not_run:
        ds.attrs["not_run"] = not_run
    store.write_store(ds, out)
    log.info("organized in 2-D: %d heads (%d computed, %d the decompose stage's figure heads), %.1f s",
             len(kept), computed, len(kept) - computed, time.perf_counter() - t0)


def organize2d_samples(attention_stores: list, decomposed_stores: list, entropy_store, outs: list,
                       **kwargs) -> None:
    """`organize2d` on each sample in turn (one job for all samples of a small model). Keyword
    arguments are `organize2d`'s."""
    each_sample("organize2d", {"attention stores": attention_stores, "decomposed stores": decomposed_stores}, outs,
                lambda att, dec, out: organize2d(att, dec, entropy_store, out, **kwargs))
