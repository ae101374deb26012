"""Models whose attention the project analyses (docs/method.md §9).

`transformer_xl`: a Transformer-XL language model written from Dai et al. 2019 (no longer in
transformers), returning per-head pre-mask scores and post-mask probabilities.
`vision_transformer`: torchvision's VisionTransformer and a hook-based capture of its attention.
`hf_recording`: any transformers model, loaded with a recording attention function; `files` finds model
files without importing torch; `checkpoint` builds, saves and safely loads trained models;
`gating` scales (masks) each head's output in all three kinds of model.

`kinds`: one adapter per kind of model (`kinds.ModelKind`), which the config, the rules and
the stages ask instead of testing a model's `kind`; `adapter(model_cfg)` and
`adapter_for(kind)` look one up.

Names are imported on first use (PEP 562), so importing `oattn_lib.models.files` at
workflow start-up does not import torch.
"""
from __future__ import annotations

from .._lazy import lazy_exports
from .kinds import KINDS, ModelKind, Unsupported, adapter, adapter_for

_EXPORTS = {
    "transformer_xl": ("TransformerXL", "TXLConfig", "TXLOutput"),
    "vision_transformer": ("build_vit", "vit_attention"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ += ["KINDS", "ModelKind", "Unsupported", "adapter", "adapter_for"]
