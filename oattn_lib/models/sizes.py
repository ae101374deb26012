"""The size of a model's attention before it runs: tokens per sample, layers and heads, and the
units a store of it holds, from the config entry and the model's files (no torch), for the
workflow's plan, its disk check and the resource requests."""
from __future__ import annotations

from .kinds import adapter

__all__ = ["n_tokens", "n_units", "stored_units"]


def n_tokens(model: dict) -> int | None:
    """Tokens per sample (query = key axis length) when known before running the model and the
    same for every sample; None otherwise."""
    ex = model["extract"]
    n = adapter(model).n_tokens(model)
    crop = ex.get("crop")
    if crop and n is not None:
        n = min(n, crop[1]) - crop[0]
    return n


def n_units(model: dict) -> tuple[int, int] | None:
    """(layers, heads) of the model when known before running it: from the config (txl,
    vit) or from the model's files (hf: config.json or the GGUF header, `models.files.hf_layout`);
    None for an hf model whose files cannot be read here (a hub id)."""
    return adapter(model).n_units(model)


def stored_units(model: dict) -> tuple[list[int], list[int]] | None:
    """The layer and head indices an attention store of the model holds (extract.layers,
    extract.heads; every one when null), in the model's order; None when the model's size
    is not known before running it."""
    units = n_units(model)
    if units is None:
        return None
    ex = model["extract"]
    layers = sorted(ex.get("layers") or range(units[0]))
    heads = sorted(ex.get("heads") or range(units[1]))
    return layers, heads
