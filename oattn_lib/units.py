"""Heads as an attention store holds them: which (layer, head) pairs of the model it stored.

An extraction may store a subset of the model's layers and heads (`extract.layers`,
`extract.heads`); the store's `layer` and `head` coordinates are then the model's indices of
the stored ones. Config keys that pick heads (`decompose.figure_heads`) name positions
among the stored ones, so the same config works for a full store and a subset.
"""
from __future__ import annotations

__all__ = ["resolve_unit"]


def resolve_unit(layer: int, head: int, layers, heads, owner: str = "the") -> tuple[int, int]:
    """The model's (layer, head) that a `decompose.figure_heads` pair names: positions among the
    stored layers and heads (`layers`, `heads`: a store's coordinates, in order), negative
    ones counting from the end, as Python indexes a list. With every layer and head stored,
    a position is the model's index. Raises ValueError when out of range (`owner` names
    whose layers the message talks about)."""
    layers, heads = [int(v) for v in layers], [int(v) for v in heads]
    if not (-len(layers) <= layer < len(layers) and -len(heads) <= head < len(heads)):
        raise ValueError(f"({layer}, {head}) is outside {owner} stored {len(layers)} layers x {len(heads)} heads; "
                         f"allowed: layer in -{len(layers)}..{len(layers) - 1}, head in "
                         f"-{len(heads)}..{len(heads) - 1}")
    return layers[layer], heads[head]
