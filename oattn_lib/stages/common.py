"""Readers of stored artifacts that several stages share: the network tensor of a sample, its
organization."""
from __future__ import annotations

import json
import logging

import numpy as np
import xarray as xr

from .. import store
from ..questionnaire import Organization
from ..runtime import resolve_device
from ..temperature import attention_mask
from ..trees import PartitionTree

log = logging.getLogger("oattn")

__all__ = ["network_tensor", "unit_coords", "plain", "on_device", "load_network", "load_organization",
           "model_mask", "softmax_heads"]


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
    """Each unit's layer and head, and its key/value head (`kv_group`) where the attention store
    records one (grouped-query models)."""
    out = {"unit_layer": ("unit", x["layer"].values.astype(np.int64)),
           "unit_head": ("unit", x["head"].values.astype(np.int64))}
    if "kv_group" in x.coords:
        out["unit_kv_group"] = ("unit", np.broadcast_to(x["kv_group"].values, x["unit"].shape).astype(np.int64))
    return out


def plain(x: xr.DataArray) -> np.ndarray:
    return np.ascontiguousarray(x.values, dtype=np.float32)


def on_device(a: np.ndarray, device):
    """The engine's input on the device the config's `device` resolves to: the numpy array itself
    on the CPU (where the EMD kernel is numba), a torch tensor on an accelerator (the engine runs
    on its input's device)."""
    dev = resolve_device(device)
    if dev.type == "cpu":
        return a
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


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


def model_mask(att, layer: int, head: int, logits: np.ndarray, crop) -> np.ndarray | None:
    """Allowed (query, key) entries of the model's own mask for one head; None if nothing is masked.

    The mask is read from the stored probabilities of the head's layer (`attention_mask`).
    Without a crop, the masked softmax of the stored scores must then be the head's stored
    probabilities, which is checked: the reference is what the model computed. A Tensor
    Attention model (its store's config has arch.attention other than softmax) has no
    softmax to check against; its mask is read the same way (its probs are exactly 0 where
    it masks).
    """
    probs = att["probs"].sel(layer=layer).transpose("head", "query", "key").values
    if crop is not None:
        a, b = int(crop[0]), int(crop[1])
        probs = probs[:, a:b, a:b]
    masked = attention_mask(probs)
    if not masked.any():
        return None
    if crop is None and softmax_heads(att):
        z = np.where(masked, -np.inf, logits)
        ref = np.exp(z - z.max(1, keepdims=True))
        ref /= ref.sum(1, keepdims=True)
        err = float(np.abs(ref - probs[list(att["head"].values).index(head)]).max())
        if err > 1e-4:
            raise ValueError(f"probs: layer {layer} head {head} is not the softmax of the stored scores under "
                             f"the mask read from the probabilities (max difference {err:.3g})")
    return ~masked


def softmax_heads(att) -> bool:
    """Whether the heads of an attention store are softmax heads: False for a model with a
    Tensor Attention variant (arch.attention in the store's config)."""
    config = json.loads(att.attrs.get("config", "{}"))
    return config.get("arch", {}).get("attention", "softmax") == "softmax"
