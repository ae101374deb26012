"""What the explorer shows of one sample, read from the workflow's stores (the 2-D
organizations of the heads it shows in 2-D are `heads2d`'s).

Heads are indexed by unit u = layer * n_head + head (docs/method.md §1.1), whatever order a
store keeps them in: every array read here is mapped through the store's own `layer`,
`head` (attention) or `unit_layer`, `unit_head` (organized, decomposed) coordinates.
"""
from __future__ import annotations

import json
import logging
import re
import unicodedata
from dataclasses import dataclass

import numpy as np
import xarray as xr

from .. import store
from ..models import KINDS
from ..network import allowed_mask, head_array, load_organization, model_mask, read_network
from ..trees import PartitionTree

log = logging.getLogger("oattn")

__all__ = ["Sample", "read_sample", "token_labels", "shown_tokens", "SPACE_MARK", "unit_grid", "kv_groups",
           "layer_masks"]


@dataclass(frozen=True, eq=False)
class Sample:
    """One sample of a model, heads by unit: x (unit, query, key) the analysed quantity,
    logits {unit: (query, key)} the pre-softmax scores of the units asked for (`masks_of`), the network's 3-D organization, the
    diffusion coordinates of the heads (unit, component), the token labels, `allowed`:
    {unit: the model's own mask of the head (None: nothing masked)} for the units asked for, and
    `layer_allowed` (layer, query, key): every stored layer's mask (None: nothing masked; unit u
    has its layer's, u // n_head). `info` holds the model's indices of the stored layers and
    heads (`layers`, `heads`): unit u is layer layers[u // n_head], head heads[u % n_head]."""

    index: int
    x: np.ndarray
    logits: dict
    tree_q: PartitionTree
    tree_k: PartitionTree
    tree_h: PartitionTree
    diffusion: np.ndarray
    tokens: list[str]
    key_tokens: list[str]
    info: dict
    allowed: dict
    layer_allowed: np.ndarray | None = None


def unit_grid(layers, heads, n_head: int, stored_layers=None, stored_heads=None) -> np.ndarray:
    """Unit index (position in the stored layer x head grid) of every (layer, head) pair of a
    store's unit axis. `stored_layers` / `stored_heads`: the model's indices a store holds
    (extract.layers / extract.heads); None = 0, 1, ... (every one)."""
    lay, hd = np.asarray(layers, dtype=np.int64), np.asarray(heads, dtype=np.int64)
    if stored_layers is not None:
        lay = np.searchsorted(np.asarray(stored_layers), lay)
    if stored_heads is not None:
        hd = np.searchsorted(np.asarray(stored_heads), hd)
    return lay * n_head + hd


def _by_unit(values: np.ndarray, units: np.ndarray, n_units: int, what: str) -> np.ndarray:
    """`values` (unit, ...) reordered so that row u holds unit u: `values` itself where it is in
    that order already."""
    if np.unique(units).size != n_units or units.min() < 0 or units.max() >= n_units:
        raise ValueError(f"{what}: its (layer, head) coordinates do not cover the {n_units} heads once each")
    if np.array_equal(units, np.arange(n_units)):
        return values
    out = np.empty_like(values)
    out[units] = values
    return out


SPACE_MARK = "␣"
"""How the page shows a space before or after a token's text (the open box, U+2423)."""
# newline, tab and carriage return by their usual signs; other control characters by their
# Unicode control pictures (U+2400 + code, DEL U+2421)
_CONTROL_MARKS = {"\n": "↵", "\t": "⇥", "\r": "␍", "\x7f": "␡"}


def _byte_level_chars() -> dict[str, int]:
    """The byte each character of a byte-level BPE piece stands for (GPT-2's bytes_to_unicode:
    printable bytes are their own character, the others U+0100 onwards in byte order, so that a
    space is `Ġ` and a newline `Ċ`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(shifted)}}


_BYTE_LEVEL = _byte_level_chars()
_SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_WORDPIECE_SPECIAL = re.compile(r"\[[A-Z]+\]")


def _visible(text: str) -> str:
    """`text` with its leading and trailing spaces shown as `SPACE_MARK` and its control characters
    (newline, tab, ...) as visible signs."""
    core = text.strip(" ")
    lead = len(text) - len(text.lstrip(" "))
    trail = len(text) - lead - len(core)
    core = "".join(_CONTROL_MARKS.get(c) or (chr(0x2400 + ord(c)) if ord(c) < 0x20 else c) for c in core)
    return SPACE_MARK * lead + core + SPACE_MARK * trail


def _punctuation(piece: str) -> bool:
    """Whether a WordPiece piece is punctuation, which BERT's tokenizer splits off whether or not a
    space preceded it (its own test: ASCII symbols, or a Unicode punctuation category)."""
    return all(33 <= ord(c) <= 47 or 58 <= ord(c) <= 64 or 91 <= ord(c) <= 96 or 123 <= ord(c) <= 126
               or unicodedata.category(c).startswith("P") for c in piece)


def _bytes_text(data: bytes) -> str:
    # a piece may hold part of a character's UTF-8 bytes: those show as \xNN
    return data.decode("utf-8", errors="backslashreplace")


def shown_tokens(pieces) -> list[str]:
    """The text of each of a sample's tokens as the explorer shows it, from the token strings a store
    holds (the tokenizer's pieces), the tokenizer's convention told from the pieces themselves:

    - byte-level BPE (GPT-2, SmolLM2; some piece holds `Ġ` a space, `Ċ` a newline or `ĉ` a
      tab): each character stands for one byte, the bytes decoded as UTF-8;
    - SentencePiece (T5, Llama; some piece holds `▁`): `▁` is a space, `<0xNN>` the byte NN;
    - WordPiece (BERT, MiniLM; some piece starts with `##`, or is `[CLS]` or `[SEP]`): `##` marks a
      piece that continues a word; any other piece starts a new word, after a space, but the
      first, the bracketed special tokens and punctuation (split off with or without a space:
      the pieces do not say);
    - anything else (the words of a word-level vocabulary, text given as it is): unchanged.

    A space before or after the text shows as `SPACE_MARK` (`Ġnamed` and `▁named` are
    `␣named`, `##ed` is `ed`), a newline as `↵`, a tab as `⇥`, other control characters as their
    Unicode control pictures.

    Parameters
    ----------
    pieces : sequence of str
        The tokens of one sample, in order.

    Returns
    -------
    list of str
        The shown text of each piece, in order.
    """
    pieces = [str(t) for t in pieces]
    if any("▁" in t for t in pieces):
        texts = [_SENTENCEPIECE_BYTE.sub(lambda m: _bytes_text(bytes([int(m.group(1), 16)])), t).replace("▁", " ")
                 for t in pieces]
    elif any(c in t for t in pieces for c in "ĠĊĉ"):
        texts = [_bytes_text(b"".join(bytes([_BYTE_LEVEL[c]]) if c in _BYTE_LEVEL else c.encode() for c in t))
                 for t in pieces]
    elif any((t.startswith("##") and len(t) > 2) or t in ("[CLS]", "[SEP]") for t in pieces):
        texts = [t[2:] if t.startswith("##") and len(t) > 2 else
                 t if i == 0 or _WORDPIECE_SPECIAL.fullmatch(t) or _punctuation(t) else " " + t
                 for i, t in enumerate(pieces)]
    else:
        texts = pieces
    return [_visible(t) for t in texts]


def token_labels(ds: xr.Dataset, n: int) -> list[str]:
    """Hover and axis labels of a sample's tokens: their text where the store has it
    (`shown_tokens`), image patch positions (row, column) for a ViT, token ids otherwise."""
    if "token_text" in ds.attrs:
        text = json.loads(ds.attrs["token_text"])
        if len(text) >= n:
            return shown_tokens(text)[:n]
    tok = ds["token"].values[:n] if "token" in ds.coords else np.arange(n)
    kind = KINDS.get(ds.attrs.get("kind"))
    if kind is not None and kind.image_patches:
        side = int(round(np.sqrt(max(n - 1, 1))))
        return ["[CLS]" if t < 0 else (f"patch {t} (row {t // side}, col {t % side})" if side * side == n - 1
                                       else f"patch {t}") for t in tok]
    return [f"token {t}" for t in tok]


def kv_groups(ds: xr.Dataset, n_layer: int, n_head: int) -> np.ndarray | None:
    """(layer, head) KV-group index of a GQA model's heads, None where the store has none."""
    if "kv_group" not in ds.coords:
        return None
    g = ds["kv_group"]
    g = g.broadcast_like(xr.DataArray(np.zeros((n_layer, n_head)), dims=("layer", "head"),
                                      coords={"layer": ds["layer"], "head": ds["head"]}))
    return g.transpose("layer", "head").values.astype(np.int64)


def layer_masks(ds: xr.Dataset, crop=None) -> np.ndarray | None:
    """The model's own mask of every stored layer, (layer, query, key) bool in the store's layer
    order, True where the heads may attend (`network.allowed_mask`); None where nothing is
    masked, or for a store with neither `allowed` nor probabilities."""
    if "allowed" not in ds.variables and "probs" not in ds.variables:
        return None
    ok = allowed_mask(ds, None, crop)
    return None if ok.all() else ok


def read_sample(index: int, attention_store, organized_store, decomposed_store, quantity: str,
                crop=None, masks_of=()) -> Sample:
    """The explorer's view of one sample (docs/method.md §9, §5.2, §8), heads by unit index; the model's mask of
    the units `masks_of` (`network.model_mask`: causal heads are compared with their masked
    softmax, docs/method.md §7.5)."""
    # the analysed quantity of every head; the scores (pre-softmax logits) only of the heads
    # `masks_of`, a head at a time: at 270 heads x 1024 tokens each variable is 1.1 GB
    ds = store.read_store(attention_store, require=(quantity, "scores") if len(masks_of) else (quantity,), lazy=True)
    n_layer, n_head = ds.sizes["layer"], ds.sizes["head"]
    n_units = n_layer * n_head
    # read unit-first, the store's own order: one copy of the heads (1.1 GB at 270 x 1024²), not
    # the network tensor and its transposition beside it
    net = read_network(attention_store, quantity, crop, units_first=True)
    stored = (ds["layer"].values, ds["head"].values)  # the model's indices of the stored layers and heads
    units = unit_grid(net.unit_layer, net.unit_head, n_head, *stored)
    xv = _by_unit(net.array, units, n_units, f"{attention_store}: {quantity}")
    del net
    layer_head = {int(u): (int(stored[0][u // n_head]), int(stored[1][u % n_head])) for u in masks_of}
    lv = {u: (xv[u] if quantity == "scores" else
              head_array(ds, "scores", *lh, crop, where=str(attention_store)).astype(np.float32))
          for u, lh in layer_head.items()}
    org, ods = load_organization(organized_store)
    # the head tree labels heads in the organized store's unit order; relabel them by unit
    ounits = unit_grid(ods["unit_layer"].values, ods["unit_head"].values, n_head, *stored)
    tree_h = PartitionTree(_by_unit(org.tree_h.labels.T, ounits, n_units, f"{organized_store}: tree_h").T)
    dec = store.read_store(decomposed_store, require=("diffusion_coords",), variables=("diffusion_coords",))
    dunits = unit_grid(dec["unit_layer"].values, dec["unit_head"].values, n_head, *stored)
    diff = _by_unit(dec["diffusion_coords"].transpose("unit", "component").values.astype(np.float64), dunits,
                    n_units, f"{decomposed_store}: diffusion_coords")
    if org.tree_q.n != xv.shape[1] or org.tree_k.n != xv.shape[2]:
        raise ValueError(f"{organized_store}: trees of {org.tree_q.n} x {org.tree_k.n} tokens, the attention "
                         f"store {attention_store} has {xv.shape[1]} x {xv.shape[2]} (crop {crop})")
    start = int(crop[0]) if crop is not None else 0
    labels = token_labels(ds, ds.sizes["query"])
    tokens = labels[start:start + xv.shape[1]]
    info = {k: ds.attrs[k] for k in ("label", "source_index") if k in ds.attrs}
    info["kv_group"] = kv_groups(ds, n_layer, n_head)
    info["n_layer"], info["n_head"] = n_layer, n_head
    info["layers"], info["heads"] = [int(v) for v in stored[0]], [int(v) for v in stored[1]]
    for k in ("model_layers", "model_heads"):
        info[k] = int(ds.attrs[k]) if k in ds.attrs else None
    allowed = {u: model_mask(ds, *lh, lv[u], crop) for u, lh in layer_head.items()}
    masks = layer_masks(ds, crop)
    if masks is not None and masks.shape[1:] != xv.shape[1:]:
        raise ValueError(f"{attention_store}: allowed is {masks.shape[1:]} (crop {crop}), {quantity} "
                         f"{xv.shape[1:]}")
    # the tokens label the queries; the keys of a cross-attention head by their own tokens
    # (`key_token_text`), or by position where the store has none and they are not the queries
    key_text = json.loads(ds.attrs["key_token_text"]) if "key_token_text" in ds.attrs else []
    if len(key_text) >= start + xv.shape[2]:
        keys = shown_tokens(key_text)[start:start + xv.shape[2]]
    elif ds.sizes["key"] == ds.sizes["query"] and not key_text:
        keys = labels[start:start + xv.shape[2]]
    else:
        keys = [f"key {j}" for j in range(start, start + xv.shape[2])]
    return Sample(index, xv, lv, org.tree_q, org.tree_k, tree_h, diff, tokens, keys, info, allowed, masks)


