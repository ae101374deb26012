"""Stage `prepare_data`: a model's dataset (token-id splits and vocabulary, images, or held-out texts)."""
from __future__ import annotations

from ..models import adapter_for
from ..store import save_json, save_npz

__all__ = ["prepare_data"]


def prepare_data(kind: str, data: dict, out_npz, out_meta, data_root="resources") -> None:
    """Build a model's dataset: token-id splits and vocabulary, images, or held-out texts, as
    the adapter of `kind` (`models.kinds`) makes it from the `data` config slice."""
    arrays, meta = adapter_for(kind).prepare_data(data, data_root)
    save_npz(out_npz, **arrays)
    save_json(out_meta, meta)
