"""Readers of stored artifacts that several stages share: the network tensor of a sample, its
organization."""
from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from .. import store
from ..questionnaire import Organization
from ..trees import PartitionTree

log = logging.getLogger("oattn")

__all__ = ["network_tensor", "unit_coords", "plain", "load_network", "load_organization"]


def network_tensor(ds: xr.Dataset, quantity: str, crop=None) -> xr.DataArray:
    """The network 3-tensor (query, key, unit) of one sample; unit = (layer, head) pairs.

    `crop` = (start, stop) keeps rows and columns start:stop (the authors' ViT window).
    """
    if quantity not in ("scores", "probs"):
        raise ValueError(f"quantity: must be 'scores' or 'probs', got {quantity!r}")
    x = ds[quantity]
    if crop is not None:
        a, b = int(crop[0]), int(crop[1])
        if not 0 <= a < b <= x.sizes["query"]:
            raise ValueError(f"extract.crop: {crop} does not fit {x.sizes['query']} tokens")
        x = x.isel(query=slice(a, b), key=slice(a, b))
    x = x.stack(unit=("layer", "head")).transpose("query", "key", "unit")
    return x


def unit_coords(x: xr.DataArray) -> dict:
    return {"unit_layer": ("unit", x["layer"].values.astype(np.int64)),
            "unit_head": ("unit", x["head"].values.astype(np.int64))}


def plain(x: xr.DataArray) -> np.ndarray:
    return np.ascontiguousarray(x.values, dtype=np.float32)


def load_network(attention_store, quantity, crop):
    ds = store.read_store(attention_store, require=(quantity,), finite=(quantity,))
    x = network_tensor(ds, quantity, crop)
    return ds, x


def load_organization(path):
    ds = store.read_store(path, require=("tree_q", "tree_k", "tree_h", "affinity_h"))
    return Organization(PartitionTree(ds["tree_q"].values), PartitionTree(ds["tree_k"].values),
                        PartitionTree(ds["tree_h"].values), ds["affinity_q"].values.astype(np.float64),
                        ds["affinity_k"].values.astype(np.float64),
                        ds["affinity_h"].values.astype(np.float64)), ds
