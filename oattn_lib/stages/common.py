"""Readers of stored artifacts that several stages share: the network tensor of a sample, its
organization."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import xarray as xr

from .. import store
from ..runtime import resolve_device
from ..temperature import attention_mask
from ..trees import Organization, PartitionTree

log = logging.getLogger("oattn")

__all__ = ["MASKED", "Network", "read_network", "fill_masked_rows", "on_device", "head_array", "load_organization",
           "allowed_mask", "model_mask", "softmax_heads", "each_sample"]


@dataclass(frozen=True, eq=False)
class Network:
    """The network 3-tensor of one sample, as every stage reads it.

    `array`: (query, key, unit) float32, C-contiguous, where unit runs over the stored
    (layer, head) pairs layer-major, or (unit, query, key) where `units_first` (the layout of
    the attention store itself, `read_network(units_first=True)`); `coords`: the `query` and `key` positions and, per unit,
    `unit_layer`, `unit_head` and (grouped-query models) `unit_kv_group`, each as
    (dimension, values) ready for an xarray Dataset; `attrs`: the attention store's attributes.
    """
    array: np.ndarray
    coords: dict
    attrs: dict
    units_first: bool = False

    @property
    def unit_layer(self) -> np.ndarray:
        return self.coords["unit_layer"][1]

    @property
    def unit_head(self) -> np.ndarray:
        return self.coords["unit_head"][1]

    def head(self, layer: int, head: int) -> np.ndarray:
        """The (query, key) view of one stored head, by the model's layer and head index."""
        hit = np.flatnonzero((self.unit_layer == layer) & (self.unit_head == head))
        if hit.size != 1:
            raise KeyError(f"layer {layer}, head {head}: not a stored head of this network "
                           f"(layers {sorted(set(self.unit_layer.tolist()))}, "
                           f"heads {sorted(set(self.unit_head.tolist()))})")
        return self.array[int(hit[0])] if self.units_first else self.array[:, :, int(hit[0])]


MASKED = ("row_mean", "keep")
"""How the analysed scores' masked entries enter the analysis (docs/method.md §9.5): set per row to
the mean of the row's allowed entries, or kept as the model computed them before its mask (the
paper's convention)."""


def read_network(source, quantity: str, crop=None, masked: str = "row_mean", *, units_first: bool = False) -> Network:
    """The network tensor of one sample (`Network`), from an attention store's path or from an
    opened attention dataset. `quantity`: "scores" (pre-softmax) or "probs". `crop` = (start,
    stop) keeps rows and columns start:stop (the authors' ViT window). `masked` (`MASKED`): the
    entries of scores the model masks (its causal future) are set per row to the mean of that
    row's allowed entries ("row_mean"), or kept ("keep"); probabilities are 0 there, as the
    model computed them, whatever `masked` says (docs/method.md §9.5).

    From a path only `quantity` is read (scores and probs of 270 heads at 1024 tokens are 1.1 GB
    each in float32), a layer at a time into the network tensor, and NaN or inf is an error
    naming the store and the layer: the peak is the tensor and one layer's heads, not the
    store's copy beside the tensor (a float16 store's layers are made float32 as they come).
    `units_first`: the tensor as (unit, query, key), the store's own order, for a reader that
    wants heads whole (the explorer): no transposition, and no second copy to reorder it."""
    if quantity not in ("scores", "probs"):
        raise ValueError(f"quantity: must be 'scores' or 'probs', got {quantity!r}")
    if masked not in MASKED:
        raise ValueError(f"extract.masked: {masked!r}; allowed: {', '.join(MASKED)}")
    if isinstance(source, xr.Dataset):
        ds = source
        if quantity not in ds:
            raise KeyError(f"attention dataset has no variable {quantity!r} (has {sorted(ds.data_vars)})")
    else:
        try:
            ds = store.read_store(source, require=(quantity,), variables=(quantity,), lazy=True)
        except store.StoreError as exc:
            if quantity == "scores" and "'scores' is missing" in str(exc):
                raise store.StoreError(f"{store.store_path(source)}: no pre-softmax scores to analyse (attention files "
                                       "of probabilities only); set extract.quantity: probs") from None
            raise
    x = ds[quantity].transpose("layer", "head", "query", "key")
    if crop is not None:
        a, b = int(crop[0]), int(crop[1])
        if not 0 <= a < b <= x.sizes["query"]:
            raise ValueError(f"extract.crop: {crop} does not fit {x.sizes['query']} tokens")
        x = x.isel(query=slice(a, b), key=slice(a, b))
    n_layer, n_head, nq, nk = x.shape
    layers, heads = x["layer"].values.astype(np.int64), x["head"].values.astype(np.int64)
    coords = {"query": x["query"].values, "key": x["key"].values,
              "unit_layer": ("unit", np.repeat(layers, n_head)), "unit_head": ("unit", np.tile(heads, n_layer))}
    if "kv_group" in x.coords:
        kv = np.broadcast_to(x["kv_group"].values, (n_head,)).astype(np.int64)
        coords["unit_kv_group"] = ("unit", np.tile(kv, n_layer))
    # units layer-major: layer i's heads are units i * n_head ... (i + 1) * n_head - 1
    array = np.empty((n_layer * n_head, nq, nk) if units_first else (nq, nk, n_layer * n_head), dtype=np.float32)
    for i in range(n_layer):
        if isinstance(source, xr.Dataset):
            values = x.isel(layer=i).values
        else:  # read from the store now, its errors naming the store, the variable and the layer
            try:
                values = store.load_variable(x.isel(layer=i).to_dataset(name=quantity), quantity, source, finite=True)
            except store.StoreError as exc:
                raise store.StoreError(f"{exc} (layer {int(layers[i])})") from None
        if units_first:
            array[i * n_head:(i + 1) * n_head] = values
        else:
            array[:, :, i * n_head:(i + 1) * n_head] = values.transpose(1, 2, 0)
        del values
    filled = 0
    if quantity == "scores" and masked == "row_mean":
        filled = _fill_masked(source, ds, array.transpose(1, 2, 0) if units_first else array,
                              coords["unit_layer"][1], crop)
    # what the analysis did with masked entries, recorded by every store made from the tensor
    attrs = {**ds.attrs, "masked": masked if quantity == "scores" else "zero", "masked_filled": int(filled)}
    return Network(array, coords, attrs, units_first)


def _fill_masked(source, ds, array: np.ndarray, unit_layer: np.ndarray, crop) -> int:
    """`fill_masked_rows` of the network tensor `array` (query, key, unit) with the model's own mask
    of each unit's layer; nothing where no mask is known (a dataset of scores alone, as the API
    builds) or nothing is masked. One layer at a time: a layer's units are consecutive. Returns the
    number of entries set."""
    att = ds if isinstance(source, xr.Dataset) else store.read_store(source, lazy=True)
    if "allowed" not in att.variables and "probs" not in att.variables:
        return 0
    ok = allowed_mask(att, None, crop)
    if ok.all():
        return 0
    if ok.ndim == 2:  # one mask for every layer
        return fill_masked_rows(array, ok[:, :, None])
    filled = 0
    for i, layer in enumerate(att["layer"].values):
        units = np.flatnonzero(unit_layer == layer)
        if units.size and not ok[i].all():
            filled += fill_masked_rows(array[:, :, units[0]:units[-1] + 1], ok[i][:, :, None])
    return filled


def fill_masked_rows(array: np.ndarray, allowed: np.ndarray) -> int:
    """Set, in place, every masked entry of `array` (query, key, unit) to the mean of its row's
    allowed entries in the same unit (docs/method.md §9.5); `allowed` (query, key, unit) or
    (query, key, 1) bool. A row with no allowed entry is left as it is. Returns the number of
    entries set."""
    ok = np.broadcast_to(allowed, array.shape)
    n = ok.sum(axis=1, keepdims=True)
    total = np.where(ok, array, 0).sum(axis=1, keepdims=True, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (total / n).astype(array.dtype)
    fill = ~ok & (n > 0)
    np.copyto(array, np.broadcast_to(mean, array.shape), where=fill)
    return int(fill.sum())


def on_device(a: np.ndarray, device):
    """The engine's input on the device the config's `device` resolves to: the numpy array itself
    on the CPU (where the EMD kernel is numba), a torch tensor on an accelerator (the engine runs
    on its input's device)."""
    dev = resolve_device(device)
    if dev.type == "cpu":
        return a
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def head_array(ds: xr.Dataset, name: str, layer: int, head: int, crop=None, where="") -> np.ndarray:
    """One head (query, key) of variable `name` of an attention store, cropped like the network
    tensor; from a lazily opened store (`store.read_store(..., lazy=True)`) only that head's
    chunk is read. NaN or inf is an error naming the store, variable and head."""
    v = ds[name].sel(layer=layer, head=head).transpose("query", "key")
    if crop is not None:
        v = v.isel(query=slice(int(crop[0]), int(crop[1])), key=slice(int(crop[0]), int(crop[1])))
    a = np.asarray(v.values)
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        raise store.StoreError(f"{where}: variable {name!r} contains NaN or inf (layer {layer}, head {head})")
    return a


def load_organization(path):
    ds = store.read_store(path, require=("tree_q", "tree_k", "tree_h", "affinity_h"))
    return Organization(PartitionTree(ds["tree_q"].values), PartitionTree(ds["tree_k"].values),
                        PartitionTree(ds["tree_h"].values), ds["affinity_q"].values.astype(np.float64),
                        ds["affinity_k"].values.astype(np.float64),
                        ds["affinity_h"].values.astype(np.float64)), ds


def allowed_mask(att, layer: int | None = None, crop=None) -> np.ndarray:
    """The model's own mask, True where its heads may attend: (query, key) of `layer`, or
    (layer, query, key) of every stored layer with `layer` None; cropped like the network tensor.
    The store's `allowed` variable (the mask the model was given, docs/method.md §9.5); a store written before
    it existed has it read from its probabilities (`attention_mask`: the entries every head of
    the layer gives exactly 0)."""
    sel = {} if layer is None else {"layer": layer}
    if "allowed" in att.variables:
        ok = att["allowed"].sel(**sel).transpose(..., "query", "key").values.astype(bool)
    else:
        probs = att["probs"].sel(**sel).transpose(..., "head", "query", "key").values
        ok = ~(attention_mask(probs) if layer is not None else np.stack([attention_mask(p) for p in probs]))
    if crop is not None:
        a, b = int(crop[0]), int(crop[1])
        ok = ok[..., a:b, a:b]
    return ok


def model_mask(att, layer: int, head: int, logits: np.ndarray, crop) -> np.ndarray | None:
    """Allowed (query, key) entries of the model's own mask for one head; None if nothing is masked.

    The mask is the store's `allowed` variable (the mask the model was given, docs/method.md §9.5); a
    store without one (written before it existed) has it read from the stored
    probabilities of the head's layer (`attention_mask`). Without a crop, the masked
    softmax of the stored scores must then be the head's stored probabilities, which is
    checked: the reference is what the model computed. The check allows for the rounding
    of a float16 store: a score s rounded by at most eps/2 |s| moves a probability by at
    most eps max|s| (softmax is 1-Lipschitz in the sup norm, scaled by p), plus eps/2
    for rounding the probability itself. A Tensor Attention model (its store's config has
    arch.attention other than softmax) has no softmax to check against; its mask is read
    the same way (its probs are exactly 0 where it masks).
    """
    masked = ~allowed_mask(att, layer, crop)
    if not masked.any():
        return None
    if crop is None and softmax_heads(att):
        z = np.where(masked, -np.inf, logits)
        ref = np.exp(z - z.max(1, keepdims=True))
        ref /= ref.sum(1, keepdims=True)
        got = att["probs"].sel(layer=layer, head=head).transpose("query", "key").values.astype(np.float64)
        tol = 1e-4
        if np.float16 in (att["probs"].dtype, att["scores"].dtype):
            eps = float(np.finfo(np.float16).eps)
            tol += eps * (1.0 + float(np.abs(np.where(masked, 0.0, logits)).max()))
        err = float(np.abs(ref - got).max())
        if err > tol:
            raise ValueError(f"probs: layer {layer} head {head} is not the softmax of the stored scores under "
                             f"the model's mask (max difference {err:.3g}, tolerance {tol:.3g})")
    return ~masked


def softmax_heads(att) -> bool:
    """Whether the heads of an attention store are softmax heads: False for a model with a
    Tensor Attention variant (arch.attention in the store's config)."""
    config = json.loads(att.attrs.get("config", "{}"))
    return config.get("arch", {}).get("attention", "softmax") == "softmax"


def each_sample(stage: str, inputs: dict[str, list], outs: list, run) -> None:
    """`run(*the sample's inputs, its output)` on each sample in turn (one job for all samples of a
    small model: the job's start-up is paid once); `inputs`: {what: one path per sample}. A
    count that differs is an error naming the stage and every count."""
    if any(len(v) != len(outs) for v in inputs.values()):
        counts = ", ".join(f"{len(v)} {what}" for what, v in inputs.items())
        raise ValueError(f"{stage}: {counts} and {len(outs)} outputs; expected one of each per sample")
    for i, paths in enumerate(zip(*inputs.values(), outs)):
        if len(outs) > 1:
            log.info("sample %d of %d: %s", i + 1, len(outs), paths[0])
        run(*paths)
