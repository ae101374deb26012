"""Attention capture for torchvision's VisionTransformer (SPEC 7).

torchvision's `EncoderBlock` calls `nn.MultiheadAttention(..., need_weights=False)`, so the
attention matrices never leave the module. `vit_attention` hooks the output of each
block's `ln_1` (the attention input) and recomputes, from the block's own
`in_proj_weight`/`in_proj_bias`, the scaled scores q k^T / sqrt(d_head) (ViT has no mask)
and their softmax. Tokens are (class token, patch 0, patch 1, ...) in row-major patch
order: 1 + (image_size / patch_size)^2 of them, 197 for ViT-B/16 at 224 px.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.models import VisionTransformer

__all__ = ["build_vit", "vit_attention", "recompute_attention"]


def build_vit(image_size: int = 32, patch_size: int = 4, num_layers: int = 4, num_heads: int = 4,
              hidden_dim: int = 64, mlp_dim: int = 128, num_classes: int = 10,
              dropout: float = 0.0, attention_dropout: float = 0.0,
              seed: int | None = None) -> VisionTransformer:
    """A torchvision VisionTransformer; `seed` fixes the initialisation without touching
    the global random state."""
    if image_size % patch_size:
        raise ValueError(f"image_size: {image_size} is not a multiple of patch_size {patch_size}")
    if hidden_dim % num_heads:
        raise ValueError(f"hidden_dim: {hidden_dim} is not a multiple of num_heads {num_heads}")

    def make():
        return VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=num_layers,
                                 num_heads=num_heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim,
                                 dropout=dropout, attention_dropout=attention_dropout,
                                 num_classes=num_classes)

    if seed is None:
        return make()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def recompute_attention(mha: torch.nn.MultiheadAttention, x: torch.Tensor):
    """Scores, probabilities and values of a batch-first self-attention on input x.

    x (batch, token, embed) -> scores, probs (batch, head, query, key), v (batch, head, key, d_head).
    """
    B, N, E = x.shape
    H = mha.num_heads
    dh = E // H
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (t.reshape(B, N, H, dh).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / dh ** 0.5
    return scores, torch.softmax(scores, dim=-1), v


def vit_attention(model: VisionTransformer, images: torch.Tensor, return_block_io: bool = False):
    """Run `model` in eval mode on images (batch, 3, H, W) and capture every head.

    Returns (logits (batch, classes), scores, probs) with scores, probs
    (batch, layer, head, query, key) float32 on the images' device. With
    `return_block_io` also the per-block MultiheadAttention outputs and the
    recomputed ones (probs @ v through out_proj), for checking the recomputation.
    """
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"model: expected a torchvision VisionTransformer, got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images: expected a (batch, channel, height, width) tensor, got shape "
                         f"{tuple(getattr(images, 'shape', ()))}")
    if images.shape[-2:] != (model.image_size, model.image_size):
        raise ValueError(f"images: expected {model.image_size}x{model.image_size} pixels, "
                         f"got shape {tuple(images.shape)}")
    blocks = list(model.encoder.layers)
    inputs: list[torch.Tensor] = [None] * len(blocks)
    outputs: list[torch.Tensor] = [None] * len(blocks)
    handles = []
    for i, blk in enumerate(blocks):
        handles.append(blk.ln_1.register_forward_hook(
            lambda mod, args, out, i=i: inputs.__setitem__(i, out)))
        handles.append(blk.self_attention.register_forward_hook(
            lambda mod, args, out, i=i: outputs.__setitem__(i, out[0])))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(images)
            scores, probs, mha_out, recomputed = [], [], [], []
            for blk, x, y in zip(blocks, inputs, outputs):
                s, p, v = recompute_attention(blk.self_attention, x)
                scores.append(s.float())
                probs.append(p.float())
                if return_block_io:
                    B, H, N, dh = v.shape
                    o = (p @ v).transpose(1, 2).reshape(B, N, H * dh)
                    recomputed.append(blk.self_attention.out_proj(o))
                    mha_out.append(y)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = (logits, torch.stack(scores, 1), torch.stack(probs, 1))
    if return_block_io:
        return out + (mha_out, recomputed)
    return out
