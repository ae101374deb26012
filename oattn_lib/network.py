"""The network tensor of a sample and the model's own mask, read from its attention store.

The tensor of docs/method.md §1.1 and the mask of §9.5.

`read_network` is the one reader of a sample's network tensor: the (query, key, unit) float32
array with its coordinates (`Network`), the scores' masked entries treated by one of the rules
`MASKED` names. `head_array` reads one head of a store, `allowed_mask` and `model_mask` the mask
the model was given, `softmax_heads` whether its heads are softmax heads, `load_organization`
the 3-D organization the organize stage stored, and `on_device` hands the tensor to the engine
on its device. The stages, the Python API, the explorer and the 2-D organizations of heads all
read through here, so that each computes on the tensor the others compute on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import xarray as xr

from . import store
from .runtime import resolve_device
from .temperature import attention_mask
from .trees import Organization, PartitionTree

__all__ = ["MASKED", "Network", "read_network", "fill_masked_rows", "on_device", "head_array", "load_organization",
           "allowed_mask", "model_mask", "softmax_heads"]


@dataclass(frozen=True, eq=False)
class Network:
    """The network 3-tensor of one sample, as every stage reads it (docs/method.md §1.1).

    Units run over the stored (layer, head) pairs, layer-major: layer i's heads are
    consecutive units.

    Attributes
    ----------
    array : ndarray of shape (n_query, n_key, n_unit), or (n_unit, n_query, n_key) where `units_first`
        float32, C-contiguous. (unit, query, key) is the layout of the attention store itself
        (`read_network(units_first=True)`).
    coords : dict
        The `query` and `key` positions, (n_query,) and (n_key,), and, per unit, `unit_layer`,
        `unit_head` and (grouped-query models) `unit_kv_group`, each as ("unit", (n_unit,) values),
        ready for an xarray Dataset.
    attrs : dict
        The attention store's attributes, with `masked` (the rule applied to masked scores) and
        `masked_filled` (the number of entries it set).
    units_first : bool
        Whether `array` is (unit, query, key).
    """
    array: np.ndarray
    coords: dict
    attrs: dict
    units_first: bool = False

    @property
    def unit_layer(self) -> np.ndarray:
        """The model's layer of each unit.

        Returns
        -------
        ndarray of shape (n_unit,)
            int64.
        """
        return self.coords["unit_layer"][1]

    @property
    def unit_head(self) -> np.ndarray:
        """The model's head of each unit within its layer.

        Returns
        -------
        ndarray of shape (n_unit,)
            int64.
        """
        return self.coords["unit_head"][1]

    def head(self, layer: int, head: int) -> np.ndarray:
        """One stored head, by the model's layer and head index.

        Parameters
        ----------
        layer, head : int
            The model's indices of the head.

        Returns
        -------
        ndarray of shape (n_query, n_key)
            A view of `array`.

        Raises
        ------
        KeyError
            Where (layer, head) is not a stored head, naming the stored layers and heads.
        """
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
    """The network tensor of one sample, from an attention store (docs/method.md §1.1, §9.5).

    From a path only `quantity` is read, a layer at a time into the network tensor, so that the
    peak is the tensor and one layer's heads, not the store's copy beside the tensor (a float16
    store's layers are made float32 as they come); NaN or inf is an error naming the store and
    the layer.

    Parameters
    ----------
    source : path or xarray.Dataset
        An attention store's path, or an opened attention dataset whose `quantity` has dims
        (layer, head, query, key).
    quantity : str
        "scores" (the pre-softmax scores) or "probs" (the probabilities).
    crop : (int, int), optional
        (start, stop): keeps rows and columns start:stop (the authors' ViT window).
    masked : {"row_mean", "keep"}
        `MASKED`: the entries of scores the model masks (its causal future) are set per row to
        the mean of that row's allowed entries ("row_mean"), or kept ("keep"). Probabilities are
        0 there, as the model computed them, whatever `masked` says.
    units_first : bool
        The tensor as (unit, query, key), the store's own order, for a reader that wants heads
        whole (the explorer): no transposition, and no second copy to reorder it.

    Returns
    -------
    Network
        `array` float32 of shape (n_query, n_key, n_unit), or (n_unit, n_query, n_key) where
        `units_first`, with n_unit = n_layer * n_head stored heads, layer-major.

    Raises
    ------
    ValueError
        For a `quantity`, `masked` or `crop` that is not allowed, naming it.
    KeyError
        Where a dataset has no variable `quantity`.
    store.StoreError
        Where the store cannot be read, lacks `quantity` or holds NaN or inf, naming the store
        (and the layer).
    """
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
    """Set, in place, every masked entry to the mean of its row's allowed entries (docs/method.md §9.5).

    The mean is over the same unit's row; a row with no allowed entry is left as it is.

    Parameters
    ----------
    array : ndarray of shape (n_query, n_key, n_unit)
        Floating; written in place.
    allowed : ndarray of shape (n_query, n_key, n_unit) or (n_query, n_key, 1)
        bool, True where the model may attend.

    Returns
    -------
    int
        The number of entries set.
    """
    ok = np.broadcast_to(allowed, array.shape)
    n = ok.sum(axis=1, keepdims=True)
    total = np.where(ok, array, 0).sum(axis=1, keepdims=True, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (total / n).astype(array.dtype)
    fill = ~ok & (n > 0)
    np.copyto(array, np.broadcast_to(mean, array.shape), where=fill)
    return int(fill.sum())


def on_device(a: np.ndarray, device):
    """The engine's input on the device the config's `device` resolves to.

    Parameters
    ----------
    a : ndarray
        Any shape.
    device : str or torch.device
        As the config's `device` ("auto", "cpu", "cuda", ...; `runtime.resolve_device`).

    Returns
    -------
    ndarray or torch.Tensor
        `a` itself on the CPU (where the EMD kernel is numba), a torch tensor of the same shape
        on an accelerator (the engine runs on its input's device).
    """
    dev = resolve_device(device)
    if dev.type == "cpu":
        return a
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def head_array(ds: xr.Dataset, name: str, layer: int, head: int, crop=None, where="") -> np.ndarray:
    """One head of a variable of an attention store, cropped like the network tensor.

    From a lazily opened store (`store.read_store(..., lazy=True)`) only that head's chunk is
    read.

    Parameters
    ----------
    ds : xarray.Dataset
        The attention store, whose `name` has dims (layer, head, query, key).
    name : str
        The variable ("scores", "probs", "allowed").
    layer, head : int
        The model's indices of the head.
    crop : (int, int), optional
        (start, stop) of the rows and columns kept.
    where : str
        The store's name in errors.

    Returns
    -------
    ndarray of shape (n_query, n_key)
        The variable's dtype.

    Raises
    ------
    store.StoreError
        Where a floating head holds NaN or inf, naming the store, variable and head.
    """
    v = ds[name].sel(layer=layer, head=head).transpose("query", "key")
    if crop is not None:
        v = v.isel(query=slice(int(crop[0]), int(crop[1])), key=slice(int(crop[0]), int(crop[1])))
    a = np.asarray(v.values)
    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
        raise store.StoreError(f"{where}: variable {name!r} contains NaN or inf (layer {layer}, head {head})")
    return a


def load_organization(path) -> tuple[Organization, xr.Dataset]:
    """The 3-D organization of a sample from the organize stage's store (docs/method.md §5.2).

    Parameters
    ----------
    path : str or Path
        The organized store.

    Returns
    -------
    organization : Organization
        Its query, key and unit trees and the float64 affinities `affinity_q` (n_query, n_query),
        `affinity_k` (n_key, n_key) and `affinity_h` (n_unit, n_unit).
    ds : xarray.Dataset
        The store itself, with its coordinates and attributes.

    Raises
    ------
    store.StoreError
        Where the store cannot be read or lacks a tree, naming it.
    """
    ds = store.read_store(path, require=("tree_q", "tree_k", "tree_h", "affinity_h"))
    return Organization(PartitionTree(ds["tree_q"].values), PartitionTree(ds["tree_k"].values),
                        PartitionTree(ds["tree_h"].values), ds["affinity_q"].values.astype(np.float64),
                        ds["affinity_k"].values.astype(np.float64),
                        ds["affinity_h"].values.astype(np.float64)), ds


def allowed_mask(att, layer: int | None = None, crop=None) -> np.ndarray:
    """The model's own mask, True where its heads may attend (docs/method.md §9.5).

    The store's `allowed` variable (the mask the model was given); a store written before it
    existed has it read from its probabilities (`temperature.attention_mask`: the entries every
    head of the layer gives exactly 0).

    Parameters
    ----------
    att : xarray.Dataset
        An attention store with `allowed` (layer, query, key) or `probs` (layer, head, query, key).
    layer : int, optional
        The model's layer; None: every stored layer.
    crop : (int, int), optional
        (start, stop) of the rows and columns kept, as for the network tensor.

    Returns
    -------
    ndarray of shape (n_query, n_key), or (n_layer, n_query, n_key) where `layer` is None
        bool.
    """
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
    """The allowed entries of the model's own mask for one head; None if nothing is masked.

    The mask is the store's `allowed` variable (the mask the model was given, docs/method.md
    §9.5); a store without one (written before it existed) has it read from the stored
    probabilities of the head's layer (`temperature.attention_mask`). Without a crop, the masked
    softmax of the stored scores must then be the head's stored probabilities, which is
    checked: the reference is what the model computed. The check allows for the rounding
    of a float16 store: a score s rounded by at most eps/2 |s| moves a probability by at
    most eps max|s| (softmax is 1-Lipschitz in the sup norm, scaled by p), plus eps/2
    for rounding the probability itself. A Tensor Attention model (its store's config has
    arch.attention other than softmax) has no softmax to check against; its mask is read
    the same way (its probs are exactly 0 where it masks).

    Parameters
    ----------
    att : xarray.Dataset
        The attention store.
    layer, head : int
        The model's indices of the head.
    logits : ndarray of shape (n_query, n_key)
        The head's stored scores, cropped by `crop`.
    crop : (int, int) or None
        (start, stop) of the rows and columns kept.

    Returns
    -------
    ndarray of shape (n_query, n_key) or None
        bool, True where the head may attend; None where it may attend everywhere.

    Raises
    ------
    ValueError
        Where the stored probabilities are not the masked softmax of the stored scores, naming
        the layer and head.
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
    """Whether the heads of an attention store are softmax heads (docs/method.md §10).

    Parameters
    ----------
    att : xarray.Dataset
        The attention store; its `config` attribute (JSON) names the model's `arch.attention`.

    Returns
    -------
    bool
        False for a model with a Tensor Attention variant.
    """
    config = json.loads(att.attrs.get("config", "{}"))
    return config.get("arch", {}).get("attention", "softmax") == "softmax"
