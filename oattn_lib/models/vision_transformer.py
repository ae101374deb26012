"""Attention capture for torchvision's VisionTransformer (docs/method.md §9.3).

torchvision's `EncoderBlock` calls `nn.MultiheadAttention(..., need_weights=False)`, so the
attention matrices never leave the module. `vit_attention` hooks the output of each
block's `ln_1` (the attention input) and recomputes, from the block's own
`in_proj_weight`/`in_proj_bias`, the scaled scores q k^T / sqrt(d_head) (ViT has no mask)
and their softmax. Tokens are (class token, patch 0, patch 1, ...) in row-major patch
order: 1 + (image_size / patch_size)^2 of them, 197 for ViT-B/16 at 224 px.

`build_vit(attention=...)` swaps every block's attention for a `TensorMultiheadAttention`
(Tensor Attention, non-causal linear form; same parameters); for such a block
`recompute_attention` returns the normalised T as probs and its raw kernel S S^T or
S^T S as scores (`oattn_lib.tensor_attention`).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import VisionTransformer

from .files import vit_b_16_weights_file

__all__ = ["build_vit", "vit_attention", "recompute_attention", "build_vit_b_16",
           "vit_b_16_weights_path", "fetch_vit_b_16_weights"]


def build_vit(image_size: int = 32, patch_size: int = 4, num_layers: int = 4, num_heads: int = 4,
              hidden_dim: int = 64, mlp_dim: int = 128, num_classes: int = 10,
              dropout: float = 0.0, attention_dropout: float = 0.0,
              seed: int | None = None, attention: str = "softmax") -> VisionTransformer:
    """A torchvision VisionTransformer; `seed` fixes the initialisation without touching
    the global random state.

    `attention`: "softmax" (torchvision's) or a non-causal tensor-attention variant
    (`tensor_attention.parse_attention`, no "_tril"): every block's `self_attention`
    becomes a `TensorMultiheadAttention` holding the weights the softmax model would
    have, so a seed gives every variant the same initial weights (and the same global
    random state afterwards).
    """
    from ..tensor_attention import TensorMultiheadAttention, parse_attention

    spec = parse_attention(attention)
    if spec is not None and spec.tril:
        raise ValueError(f"attention: {attention!r} is a masked (causal-model) form; a ViT "
                         "attends without a mask")
    if spec is not None and attention_dropout:
        raise ValueError(f"attention_dropout: not supported with attention={attention!r}; expected 0, "
                         f"got {attention_dropout!r}")
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
        model = make()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = make()
    if spec is not None:
        with torch.random.fork_rng(devices=[]):  # the swap draws nothing from the caller's RNG
            for blk in model.encoder.layers:
                old = blk.self_attention
                new = TensorMultiheadAttention(hidden_dim, num_heads, attention=spec.name,
                                               batch_first=old.batch_first)
                new.load_state_dict(old.state_dict())
                blk.self_attention = new
    return model


def recompute_attention(mha: torch.nn.MultiheadAttention, x: torch.Tensor):
    """Scores, probabilities and values of a batch-first self-attention on input x.

    x (batch, token, embed) -> scores, probs (batch, head, query, key), v (batch, head, key, d_head).
    For a `TensorMultiheadAttention`: probs = the normalised T, scores = its raw kernel.
    """
    from ..tensor_attention import TensorMultiheadAttention

    if isinstance(mha, TensorMultiheadAttention):
        return mha.attention_maps(x)
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


# --------------------------------------------------------------------------- ViT-B/16
def _vit_b_16_weights():
    # IMAGENET1K_V1: the original supervised ImageNet-1k weights at 224 px (torchvision's DEFAULT)
    from torchvision.models import ViT_B_16_Weights
    return ViT_B_16_Weights.IMAGENET1K_V1


def vit_b_16_weights_path() -> Path:
    """Where torchvision keeps the ViT-B/16 ImageNet weights:
    ``<torch.hub.get_dir()>/checkpoints/vit_b_16-c867db91.pth`` (``$TORCH_HOME/hub`` when
    TORCH_HOME is set, else ``~/.cache/torch/hub``; `models.files.vit_b_16_weights_file` finds
    the same file without importing torch, for planning)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / vit_b_16_weights_file().name


def fetch_vit_b_16_weights() -> Path:
    """Download the ViT-B/16 ImageNet weights into the torch hub cache (what the workflow's
    download rule runs on the login node); nothing happens when they are already there.

    The download goes to a temporary file, is checked against the SHA-256 prefix in the
    file name (torch.hub's check), then renamed into place. Raises FileNotFoundError
    naming the path and the URL when the download fails.
    """
    path = vit_b_16_weights_path()
    if path.is_file():
        return path
    url = _vit_b_16_weights().url
    path.parent.mkdir(parents=True, exist_ok=True)
    hash_prefix = torch.hub.HASH_REGEX.search(path.name)
    try:
        torch.hub.download_url_to_file(url, str(path), hash_prefix=hash_prefix.group(1) if hash_prefix else None,
                                       progress=False)
    except Exception as exc:  # URLError/HTTPError/timeouts (OSError), hash mismatch (RuntimeError)
        raise FileNotFoundError(_weights_missing(path, url, f"the download failed: {exc}")) from exc
    return path


def _weights_missing(path: Path, url: str, why: str) -> str:
    return (f"ViT-B/16 ImageNet weights not found: looked in {str(path)!r} (the torch hub cache, "
            f"torch.hub.get_dir() = {torch.hub.get_dir()!r}) and {why}. Provide them on a machine "
            f"with internet access with `python -c \"from oattn_lib.models.vision_transformer import "
            f"fetch_vit_b_16_weights; fetch_vit_b_16_weights()\"` (or download {url} to that "
            "path); set TORCH_HOME to use another cache directory.")


def build_vit_b_16(num_classes: int = 10, pretrained: bool = False, download: bool = True) -> VisionTransformer:
    """torchvision's ViT-B/16 (12 layers x 12 heads, width 768, 16-px patches, 224-px input,
    197 tokens) with a fresh `num_classes`-way classification head.

    pretrained=True loads the ImageNet-1k weights (``ViT_B_16_Weights.IMAGENET1K_V1``)
    from the torch hub cache (`vit_b_16_weights_path`), downloading them first when they
    are absent and `download` is true; without them (offline, or download=False) it
    raises FileNotFoundError naming the path it looked in. The new head is zero-initialised,
    as torchvision initialises its heads; with pretrained=False every weight is torchvision's
    random initialisation (seed it with torch.manual_seed).
    """
    from torchvision.models import vit_b_16

    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"num_classes: expected a positive integer, got {num_classes!r}")
    if not pretrained:
        return vit_b_16(weights=None, num_classes=num_classes)
    weights = _vit_b_16_weights()
    path = vit_b_16_weights_path()
    if not path.is_file():
        if not download:
            raise FileNotFoundError(_weights_missing(path, weights.url, "download=False"))
        fetch_vit_b_16_weights()
    model = vit_b_16(weights=weights, progress=False)  # reads the cached file, no network
    head = model.heads.head
    model.heads.head = nn.Linear(head.in_features, num_classes)
    nn.init.zeros_(model.heads.head.weight)
    nn.init.zeros_(model.heads.head.bias)
    return model
