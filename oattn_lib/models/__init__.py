"""Models whose attention the project analyses (SPEC 7).

`txl`: a Transformer-XL language model written from Dai et al. 2019 (no longer in
transformers), returning per-head pre-mask scores and post-mask probabilities.
`vit`: torchvision's VisionTransformer and a hook-based capture of its attention.
"""
from .txl import TransformerXL, TXLConfig, TXLOutput
from .vit import build_vit, vit_attention

__all__ = ["TransformerXL", "TXLConfig", "TXLOutput", "build_vit", "vit_attention"]
