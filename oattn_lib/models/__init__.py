"""Models whose attention the project analyses (SPEC 7).

`txl`: a Transformer-XL language model written from Dai et al. 2019 (no longer in
transformers), returning per-head pre-mask scores and post-mask probabilities.
`vit`: torchvision's VisionTransformer and a hook-based capture of its attention.
`hf`: any transformers model through a recording attention function; `files` finds model
files without importing torch; `checkpoint` builds, saves and safely loads trained models;
`gating` scales (masks) each head's output in all three kinds of model.

Names are imported on first use (PEP 562), so importing `oattn_lib.models.files` at
workflow start-up does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "txl": ("TransformerXL", "TXLConfig", "TXLOutput"),
    "vit": ("build_vit", "vit_attention"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
