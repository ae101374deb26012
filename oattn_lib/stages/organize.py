"""Stage `organize`: the 3-D questionnaire of one sample (docs/method.md §5.2)."""
from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from .. import store
from ..questionnaire import questionnaire3d
from ..network import Network, on_device, read_network
from .common import each_sample

log = logging.getLogger("oattn")

__all__ = ["organize", "organized_dataset", "organize_samples"]


def organize(attention_store, out, quantity: str, crop=None, params: dict | None = None,
             config_slice: dict | None = None, code: str | None = None, device="cpu",
             masked: str = "row_mean") -> None:
    """Run the 3-D questionnaire on one sample and store trees and affinities (docs/method.md §5.2), on the
    device `device` resolves to (`runtime.resolve_device`); `masked`: the rule for the scores'
    masked entries (`network.read_network`, docs/method.md §9.5)."""
    net = read_network(attention_store, quantity, crop, masked)
    out_ds = organized_dataset(net, quantity, params, config_slice=config_slice, code=code, device=device)
    del net
    store.write_store(out_ds, out)
    log.info("organized: levels q=%d k=%d h=%d", *(out_ds.sizes[f"level_{a}"] for a in "qkh"))


def organized_dataset(net: Network, quantity: str, params: dict | None = None, *,
                      config_slice: dict | None = None, code: str | None = None, device="cpu") -> xr.Dataset:
    """The organized store's dataset (docs/method.md §12.1) of one sample's network tensor `net`
    (`network.read_network`): the 3-D questionnaire's trees and affinities (docs/method.md §5.2) with
    the units' coordinates. `params` are `questionnaire.questionnaire3d`'s keyword arguments.

    Returns tree_q (level_q, query), tree_k (level_k, key), tree_h (level_h, unit) int64 labels;
    affinity_q (query, query_), affinity_k (key, key_), affinity_h (unit, unit_) float32."""
    attrs = net.attrs
    org = questionnaire3d(on_device(net.array, device), **dict(params or {}))
    return xr.Dataset(
        {"tree_q": (("level_q", "query"), org.tree_q.labels),
         "tree_k": (("level_k", "key"), org.tree_k.labels),
         "tree_h": (("level_h", "unit"), org.tree_h.labels),
         "affinity_q": (("query", "query_"), org.affinity_q.astype(np.float32)),
         "affinity_k": (("key", "key_"), org.affinity_k.astype(np.float32)),
         "affinity_h": (("unit", "unit_"), org.affinity_h.astype(np.float32))},
        coords=net.coords,
        attrs={**{k: v for k, v in attrs.items() if k in ("model", "sample", "kind", "checkpoint_sha256", "masked",
                                                          "masked_filled")},
               **store.provenance_attrs(config_slice or {}, attrs.get("checkpoint_sha256"), code=code,
                                        quantity=quantity)})


def organize_samples(attention_stores: list, outs: list, quantity: str, crop=None, **kwargs) -> None:
    """`organize` on each sample in turn: attention_stores[i] to outs[i] (one job for all samples of
    a small model: the job's start-up is paid once). Keyword arguments are `organize`'s."""
    each_sample("organize", {"attention stores": attention_stores}, outs,
                lambda att, out: organize(att, out, quantity, crop, **kwargs))
