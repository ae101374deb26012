"""Head ablation: does low Haar entropy mean a head can go? (issue 6, beyond the paper)

The paper suggests that heads with low l1 Haar entropy (SPEC 4) "do little processing and
could be discarded". This module tests that on a trained network against the importance
rankings a reviewer would ask for, all computed on the same (extracted) samples:

- Haar entropy, lowest first (the paper's proposal) and highest first;
- random orders (several seeds);
- gradient importance (Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than
  One?"): a gate xi_h multiplies each head's output, I_h = E_x |dL(x)/dxi_h| at xi = 1,
  normalised per layer by the L2 norm of the layer's importances, least important first;
- attention-distribution entropy (mean over queries of -sum_k p log p), lowest first;
- confidence (Voita et al. 2019, "Analyzing Multi-Head Self-Attention"): mean over queries
  of the largest attention weight, lowest first.

For each ranking the first k heads (k = 0, 10%, ..., 100% of the network) are masked, and
the network is measured on held-out data that no ranking saw: Transformer-XL perplexity,
ViT accuracy, and for a sentence encoder (`hf`) the mean cosine similarity of its sentence
embeddings to the unmasked model's.

Masking (`head_gates`): a gate per (example, layer, head) scales that head's output before
the layer's output projection, so a gate of 0 removes the head's contribution and nothing
else, a gate of 1 changes nothing (bit for bit), and a layer with every gate 0 passes only
its residual path plus the projection's bias. The gates are applied from outside, by hooks:

- `txl`: a forward pre-hook on each layer's output projection `attn.o_net`, whose input is
  the concatenation of the heads' outputs;
- `vit` (torchvision): `nn.MultiheadAttention` uses its `out_proj` weight functionally, so
  hooks on `out_proj` never fire; a forward hook on the attention module adds
  sum_h (xi_h - 1) W_o[:, h] (P_h V_h), recomputed from the module's own weights — exactly
  zero at xi = 1, exactly the head's removal at xi = 0;
- `hf`: an attention function registered in transformers' `AttentionInterface`
  (`GATED_ATTENTION`, the recording eager attention of `models.hf` times the gate) scales
  each head's output before the model's own output projection (BERT's
  `attention.output.dense`, Llama's `o_proj`, ...).

Gates carry one row per example, so many masks are evaluated in one batched forward:
the rows of a batch are (mask, held-out example) pairs.

The sentence encoder has no task loss; its gradient importance uses the random projection
L_v(x) = v . e(x) of the normalised sentence embedding e, v ~ N(0, I), so that
E_v |dL_v/dxi_h| = sqrt(2/pi) ||de/dxi_h||: the first-order change of the embedding when the
head's gate moves (the loss an embedding model is judged by, 1 - cos, is flat at xi = 1).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from .data.images import vit_images
from .models.checkpoint import load_trained
from .runtime import resolve_device
from .store import load_npz

log = logging.getLogger("oattn")

__all__ = ["GATED_ATTENTION", "HeadLayout", "HeldOut", "RANKINGS", "head_layout", "head_gates",
           "row_outputs", "evaluate_masks", "gate_gradients", "gradient_importance",
           "normalize_per_layer", "attention_entropy", "attention_confidence", "lowest_first",
           "random_order", "mask_counts", "masks_from_order", "auc", "relative_loss",
           "tolerated_fraction", "spearman_between", "stability", "prune"]

GATED_ATTENTION = "oattn_gated"
"""Name of the gated attention function registered in transformers' AttentionInterface."""

HAAR_LOW = "Haar entropy, lowest first"
HAAR_HIGH = "Haar entropy, highest first"
RANDOM = "random"
GRADIENT = "gradient importance (Michel et al.)"
ATTN_ENTROPY = "attention entropy, lowest first"
CONFIDENCE = "confidence (Voita et al.), lowest first"
RANKINGS = (HAAR_LOW, HAAR_HIGH, RANDOM, GRADIENT, ATTN_ENTROPY, CONFIDENCE)
"""The compared head rankings, in the order of Figure 7 and Tables 3-4."""

METRICS = {"txl": ("perplexity", False), "vit": ("accuracy", True),
           "hf": ("cosine similarity to the unmasked model", True)}
"""Held-out metric of each model kind and whether higher is better."""


# -- gates ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadLayout:
    """Where a model's heads are gated: one module per layer (txl: the output projection,
    vit: the attention module, hf: the module that calls the attention function)."""

    kind: str
    n_layer: int
    n_head: int
    modules: tuple

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_layer, self.n_head


_HF_GATES: contextvars.ContextVar = contextvars.ContextVar("oattn_head_gates", default=None)


def _gated_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """The recording eager attention of `models.hf`, each head's output times its gate."""
    from .models.hf import recording_attention_forward

    out, probs = recording_attention_forward(module, query, key, value, attention_mask, **kwargs)
    active = _HF_GATES.get()
    if active is not None:
        gates, layer_of = active
        layer = layer_of.get(id(module))
        if layer is not None:  # out: (batch, query, head, d_head)
            out = out * gates[:, layer][:, None, :, None].to(out.dtype)
    return out, probs


def _register_gated_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GATED_ATTENTION, _gated_attention_forward)
    AttentionMaskInterface.register(GATED_ATTENTION, eager_mask)
    return GATED_ATTENTION


@contextlib.contextmanager
def _hf_gated(model) -> Iterator[None]:
    """Run `model` with the gated attention function inside the block, then restore."""
    from .models.hf import attn_implementation, supports_attention_interface

    before = attn_implementation(model)
    if before == GATED_ATTENTION:
        yield
        return
    if not supports_attention_interface(model):
        raise ValueError(f"model: {type(model).__name__} does not dispatch its attention through "
                         "transformers' AttentionInterface, so its heads cannot be masked here")
    model.set_attn_implementation(_register_gated_attention())
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def head_layout(model, kind: str) -> HeadLayout:
    """Layers, heads and the per-layer modules where `head_gates` acts."""
    from torch import nn

    if kind == "txl":
        mods = []
        for i, layer in enumerate(getattr(model, "layers", ())):
            o = getattr(getattr(layer, "attn", None), "o_net", None)
            if not isinstance(o, nn.Linear):
                raise ValueError(f"model: layer {i} has no output projection `attn.o_net` (nn.Linear)")
            mods.append(o)
        n_head = model.config.n_head
        if not mods or mods[0].in_features % n_head:
            raise ValueError(f"model: expected TransformerXL layers with n_head={n_head} heads")
        return HeadLayout("txl", len(mods), n_head, tuple(mods))
    if kind == "vit":
        blocks = list(getattr(getattr(model, "encoder", None), "layers", ()))
        mods = [getattr(b, "self_attention", None) for b in blocks]
        if not mods or not all(isinstance(m, nn.MultiheadAttention) for m in mods):
            raise ValueError("model: expected a torchvision VisionTransformer (encoder.layers[i].self_attention)")
        return HeadLayout("vit", len(mods), mods[0].num_heads, tuple(mods))
    if kind == "hf":
        from .models.hf import record_attention
        dev = next(model.parameters()).device
        ids = torch.zeros((1, 2), dtype=torch.long, device=dev)
        with _hf_gated(model), torch.no_grad(), record_attention() as rec:
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        if not rec.modules:
            raise ValueError(f"model: {type(model).__name__} never called the attention function")
        heads = {p.shape[1] for p in rec.probs}
        if len(heads) != 1:
            raise ValueError(f"model: layers with different head counts {sorted(heads)} are not supported")
        return HeadLayout("hf", len(rec.modules), heads.pop(), tuple(rec.modules))
    raise ValueError(f"kind: unknown model kind {kind!r} (allowed: txl, vit, hf)")


def _check_gates(gates, layout: HeadLayout) -> torch.Tensor:
    if not isinstance(gates, torch.Tensor):
        gates = torch.as_tensor(np.asarray(gates, dtype=np.float32))
    if gates.ndim == 2:
        gates = gates[None]
    if gates.ndim != 3 or tuple(gates.shape[1:]) != layout.shape:
        raise ValueError(f"gates: expected shape (rows, {layout.n_layer}, {layout.n_head}) or "
                         f"({layout.n_layer}, {layout.n_head}), got {tuple(gates.shape)}")
    return gates


@contextlib.contextmanager
def head_gates(model, layout: HeadLayout, gates) -> Iterator[None]:
    """Scale every head's output by its gate inside the block.

    gates: (rows, layer, head) or (layer, head); rows is 1 (one mask for the whole batch)
    or the batch size (one mask per example). None gates nothing. Gradients flow to the
    gates. 0 removes the head, 1 leaves the model bit for bit as it is.
    """
    if gates is None:
        yield
        return
    g = _check_gates(gates, layout)
    handles = []
    try:
        if layout.kind == "txl":
            H = layout.n_head

            def pre_hook(mod, args, layer):
                x = args[0]
                B, T, width = x.shape
                gl = g[:, layer].to(x.dtype)[:, None, :, None]
                return (x.reshape(B, T, H, width // H).mul(gl).reshape(B, T, width),) + tuple(args[1:])

            for i, m in enumerate(layout.modules):
                handles.append(m.register_forward_pre_hook(lambda mod, args, i=i: pre_hook(mod, args, i)))
            yield
        elif layout.kind == "vit":
            from .models.vit import recompute_attention

            def hook(mod, args, kwargs, output, layer):
                x = args[0] if args else kwargs["query"]
                B, N, E = x.shape
                _, probs, v = recompute_attention(mod, x)
                heads = probs @ v  # (batch, head, token, d_head): each head's output before out_proj
                w = (g[:, layer].to(heads.dtype) - 1.0)[:, :, None, None]
                delta = (heads * w).transpose(1, 2).reshape(B, N, E) @ mod.out_proj.weight.T
                return (output[0] + delta,) + tuple(output[1:])

            for i, m in enumerate(layout.modules):
                handles.append(m.register_forward_hook(
                    lambda mod, args, kwargs, out, i=i: hook(mod, args, kwargs, out, i), with_kwargs=True))
            yield
        elif layout.kind == "hf":
            token = _HF_GATES.set((g, {id(m): i for i, m in enumerate(layout.modules)}))
            try:
                with _hf_gated(model):
                    yield
            finally:
                _HF_GATES.reset(token)
        else:
            raise ValueError(f"layout.kind: unknown model kind {layout.kind!r}")
    finally:
        for h in handles:
            h.remove()


# -- batched forward passes -----------------------------------------------------------------
@dataclass(frozen=True)
class HeldOut:
    """Examples a metric is measured on (or a ranking's samples).

    inputs: txl (n, tgt_len + 1) token windows (input = [:, :-1], targets = [:, 1:]); vit
    (n, channel, height, width) images; hf (n, tokens) input ids without padding.
    targets: vit labels (n,); hf reference embeddings (n, hidden) of the unmasked model
    (evaluation) or projection vectors (gradients); None for txl.
    """

    inputs: torch.Tensor
    targets: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


def _wide(x: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision tensors; float32 and float64 stay as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def row_outputs(model, layout: HeadLayout, inputs: torch.Tensor, gates=None) -> torch.Tensor:
    """One forward with per-row gates: txl mean NLL per row (nats/token, (n,)); vit logits
    (n, classes); hf L2-normalised mean-pooled sentence embeddings (n, hidden)."""
    with head_gates(model, layout, gates):
        if layout.kind == "txl":
            x, y = inputs[:, :-1], inputs[:, 1:]
            got = {}
            handle = model.crit.register_forward_hook(lambda m, a, o: got.__setitem__("out", o))
            try:
                model(x, y, mems=None)
            finally:
                handle.remove()
            o = got["out"]
            if hasattr(o, "output"):  # adaptive softmax: log-probability of each target
                lp = o.output
            else:
                lp = F.log_softmax(_wide(o), dim=-1).gather(-1, y.reshape(-1, 1)).squeeze(-1)
            return -_wide(lp).reshape(y.shape).mean(1)
        if layout.kind == "vit":
            return model(inputs)
        # the all-MiniLM-L6-v2 recipe (models.hf.hf_embeddings) on unpadded windows
        hidden = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).last_hidden_state
        return F.normalize(_wide(hidden).mean(1), p=2, dim=1)


def _row_scores(kind: str, out: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    if kind == "txl":
        return out  # NLL; the perplexity is exp of its mean
    if kind == "vit":
        return (out.argmax(-1) == targets).double()
    return (out * targets).sum(-1)  # cosine: both are unit vectors


def _aggregate(kind: str, per_row: torch.Tensor) -> torch.Tensor:
    """(configs, examples) row scores -> (configs,) metric."""
    m = per_row.double().mean(-1)
    return m.exp() if kind == "txl" else m


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def evaluate_masks(model, layout: HeadLayout, data: HeldOut, gates, batch_size: int = 64) -> np.ndarray:
    """The held-out metric under each of `gates` (configs, layer, head): (configs,).

    Rows (mask, example) are batched `batch_size` at a time, every mask in the same
    forward passes as the others.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    g = _check_gates(gates, layout)
    C, E = g.shape[0], len(data)
    if E == 0:
        raise ValueError("data: no held-out examples")
    dev = _device(model)
    per_row = torch.empty(C * E, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, C * E, batch_size):
            idx = torch.arange(start, min(start + batch_size, C * E))
            c, e = idx // E, idx % E
            out = row_outputs(model, layout, data.inputs[e].to(dev), g[c].to(dev))
            tgt = None if data.targets is None else data.targets[e].to(dev)
            per_row[idx] = _row_scores(layout.kind, out, tgt).double().cpu()
    finally:
        model.train(was_training)
    return _aggregate(layout.kind, per_row.view(C, E)).numpy()


@torch.no_grad()
def reference_embeddings(model, layout: HeadLayout, inputs: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """hf: the unmasked model's sentence embeddings of `inputs` (the cosine reference)."""
    model.eval()
    dev = _device(model)
    return torch.cat([row_outputs(model, layout, inputs[i:i + batch_size].to(dev)).cpu()
                      for i in range(0, inputs.shape[0], batch_size)])


def _row_loss(kind: str, out: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    if kind == "txl":
        return out
    if kind == "vit":
        return F.cross_entropy(_wide(out), targets, reduction="none")
    return (out * targets).sum(-1)  # v . e(x): a random projection of the embedding


def gate_gradients(model, layout: HeadLayout, data: HeldOut, batch_size: int = 64,
                   gates=None) -> torch.Tensor:
    """dL(x)/dxi for every row x of `data`, at `gates` (default: all 1): (rows, layer, head).

    L: txl the mean NLL of the row's tokens; vit the cross-entropy with the row's label;
    hf the projection targets[row] . e(x) of the sentence embedding. The model runs in
    eval mode (no dropout).
    """
    dev = _device(model)
    n = len(data)
    at = None if gates is None else _check_gates(gates, layout)
    grads = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, batch_size):
            sl = slice(start, min(start + batch_size, n))
            m = sl.stop - sl.start
            base = torch.ones((m, *layout.shape)) if at is None else at.expand(n, -1, -1)[sl]
            g = base.to(dev, next(model.parameters()).dtype).clone().requires_grad_(True)
            with torch.enable_grad():
                out = row_outputs(model, layout, data.inputs[sl].to(dev), g)
                tgt = None if data.targets is None else data.targets[sl].to(dev)
                loss = _row_loss(layout.kind, out, tgt).sum()
                (grad,) = torch.autograd.grad(loss, g)
            grads.append(grad.detach().cpu())
    finally:
        model.train(was_training)
    return torch.cat(grads)


def gradient_importance(model, layout: HeadLayout, samples: HeldOut, projections: int = 8,
                        seed: int = 0, batch_size: int = 64) -> np.ndarray:
    """Michel et al.'s head importance |dL/dxi_h| at xi = 1 for each sample: (sample, layer, head).

    hf: L = v . e(x) for `projections` Gaussian v per sample (seeded), averaged; the mean
    over samples, normalised per layer (`normalize_per_layer`), is the ranking score.
    """
    if layout.kind != "hf":
        return gate_gradients(model, layout, samples, batch_size).abs().double().numpy()
    n = len(samples)
    gen = torch.Generator().manual_seed(int(seed))
    dim = reference_embeddings(model, layout, samples.inputs[:1]).shape[-1]
    v = torch.randn((n * projections, dim), generator=gen)
    rows = HeldOut(samples.inputs.repeat_interleave(projections, 0), v)
    g = gate_gradients(model, layout, rows, batch_size).abs().double()
    return g.view(n, projections, *layout.shape).mean(1).numpy()


def normalize_per_layer(importance) -> np.ndarray:
    """Divide each layer's head importances by their L2 norm (Michel et al. 2019, sec. 4.2).
    importance: (..., layer, head)."""
    x = np.asarray(importance, dtype=np.float64)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


# -- attention-based rankings ---------------------------------------------------------------
def attention_entropy(probs) -> np.ndarray:
    """Mean over queries of the attention distribution's entropy -sum_k p log p (nats).
    probs (..., query, key) -> (...); 0 log 0 = 0 (masked keys)."""
    p = np.asarray(probs, dtype=np.float64)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -plogp.sum(-1).mean(-1)


def attention_confidence(probs) -> np.ndarray:
    """Voita et al.'s confidence: mean over queries of the largest attention weight.
    probs (..., query, key) -> (...)."""
    return np.asarray(probs, dtype=np.float64).max(-1).mean(-1)


# -- orders and masks -----------------------------------------------------------------------
def lowest_first(scores) -> np.ndarray:
    """Head order (flat layer * n_head + head indices), lowest score first; ties by index."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not np.isfinite(s).all():
        raise ValueError("scores: contains NaN or inf")
    return np.argsort(s, kind="stable")


def random_order(n_units: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n_units)


def mask_counts(n_units: int, step: float = 0.1) -> np.ndarray:
    """Numbers of masked heads: round(f * n) for f = 0, step, 2 step, ..., 1 (duplicates dropped)."""
    if not 0 < step <= 1:
        raise ValueError(f"step: must be in (0, 1], got {step}")
    fr = np.append(np.arange(0.0, 1.0, step), 1.0)
    return np.unique(np.round(fr * n_units).astype(int))


def masks_from_order(order, ks, shape: tuple[int, int]) -> np.ndarray:
    """Gates (len(ks), layer, head): the first k heads of `order` at 0, the rest at 1."""
    order = np.asarray(order)
    n = shape[0] * shape[1]
    if sorted(order.tolist()) != list(range(n)):
        raise ValueError(f"order: expected a permutation of {n} heads, got {order.size} entries")
    g = np.ones((len(ks), n), dtype=np.float32)
    for i, k in enumerate(ks):
        g[i, order[:k]] = 0.0
    return g.reshape(len(ks), *shape)


# -- summaries ------------------------------------------------------------------------------
def auc(fractions, y) -> np.ndarray:
    """Trapezoidal area under y(fraction) over [0, 1]; y (..., n_k)."""
    return np.trapezoid(np.asarray(y, dtype=np.float64), np.asarray(fractions, dtype=np.float64), axis=-1)


def relative_loss(y, base: float, higher_is_better: bool) -> np.ndarray:
    """Relative loss of the metric against the unmasked `base` (positive = worse)."""
    y = np.asarray(y, dtype=np.float64)
    return (base - y) / abs(base) if higher_is_better else (y - base) / abs(base)


def tolerated_fraction(fractions, y, base: float, higher_is_better: bool, tol: float = 0.01) -> np.ndarray:
    """Largest fraction masked such that it and every smaller fraction lose at most `tol`
    (relative) of the metric; y (..., n_k) -> (...)."""
    f = np.asarray(fractions, dtype=np.float64)
    ok = relative_loss(y, base, higher_is_better) <= tol + 1e-12
    prefix = np.cumprod(ok, axis=-1).astype(bool)
    return np.where(prefix, f, 0.0).max(-1)


def spearman_between(scores) -> np.ndarray:
    """Spearman rank correlation between every pair of rows of scores (rows, heads)."""
    from scipy.stats import rankdata
    r = rankdata(np.asarray(scores, dtype=np.float64), axis=1)
    return np.corrcoef(r)


def stability(scores, fraction: float = 0.1) -> dict:
    """How a ranking's per-sample scores (sample, heads) agree across samples: mean and min
    Spearman over pairs, mean and min Jaccard of the `fraction` of heads masked first
    (lowest scores)."""
    from .entropy import jaccard_stability
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] < 2:
        raise ValueError(f"scores: expected (samples >= 2, heads), got shape {s.shape}")
    off = ~np.eye(s.shape[0], dtype=bool)
    rho = spearman_between(s)[off]
    jac = jaccard_stability(s, fraction, "bottom")[off]
    return {"spearman_mean": float(rho.mean()), "spearman_min": float(rho.min()),
            "jaccard_mean": float(jac.mean()), "jaccard_min": float(jac.min())}


# -- data: the rankings' samples and the held-out sets --------------------------------------
def _ranking_samples(kind: str, model_cfg: dict, attention: list, arrays: dict, meta: dict):
    """The extracted samples (what every ranking is computed on) and their source ids."""
    if kind == "txl":
        T = attention[0].sizes["query"]
        test = arrays["test"]
        idx = np.array([int(a.attrs["source_index"]) for a in attention])
        for a, i in zip(attention, idx):
            if not np.array_equal(test[i * T:(i + 1) * T], a["token"].values):
                raise ValueError(f"sample {a.attrs.get('sample')}: its tokens are not test segment {i}; "
                                 "the dataset changed since extraction")
        if (idx + 1).max() * T + 1 > test.size:
            raise ValueError("the last extracted test segment has no next token to predict")
        wins = np.stack([test[i * T:(i + 1) * T + 1] for i in idx])
        return HeldOut(torch.from_numpy(wins.astype(np.int64))), idx
    if kind == "vit":
        size = model_cfg.get("data", {}).get("image_size", 32)
        idx = np.array([int(a.attrs["source_index"]) for a in attention])
        labels = arrays["test_labels"][idx]
        stored = [a.attrs.get("label") for a in attention]
        if any(s is not None and int(s) != int(l) for s, l in zip(stored, labels)):
            raise ValueError("the extracted samples' labels do not match the test images; the dataset "
                             "changed since extraction")
        imgs = vit_images({"test_images": arrays["test_images"][idx]}, meta, "test", size)
        return HeldOut(imgs.float(), torch.from_numpy(labels.astype(np.int64))), idx
    ids = np.stack([a["token"].values for a in attention]).astype(np.int64)
    return HeldOut(torch.from_numpy(ids)), None


def _txl_held_out(test: np.ndarray, T: int, used: np.ndarray, n: int, rng) -> HeldOut:
    """Test windows of T + 1 tokens (T inputs, T targets) sharing no token with the
    rankings' windows [i T, (i + 1) T] (so neighbours of a used segment are left out too)."""
    n_seg = (test.size - 1) // T
    banned = set()
    for i in used:
        banned.update((int(i) - 1, int(i), int(i) + 1))
    free = np.array([i for i in range(n_seg) if i not in banned])
    if free.size == 0:
        raise ValueError("prune.held_out.txl_segments: no test segment is left after the extracted ones")
    pick = np.sort(rng.choice(free, size=min(n, free.size), replace=False))
    return HeldOut(torch.from_numpy(np.stack([test[i * T:(i + 1) * T + 1] for i in pick]).astype(np.int64))), pick


def _vit_held_out(arrays, meta, size: int, used: np.ndarray, n: int, rng):
    free = np.setdiff1d(np.arange(arrays["test_labels"].shape[0]), used)
    pick = np.sort(rng.choice(free, size=min(n, free.size), replace=False))
    imgs = vit_images({"test_images": arrays["test_images"][pick]}, meta, "test", size)
    return HeldOut(imgs.float(), torch.from_numpy(arrays["test_labels"][pick].astype(np.int64))), pick


def _special_tokens(tokenizer) -> tuple[list, list]:
    """The ids the tokenizer puts before and after a single text ([CLS] / [SEP] for BERT)."""
    plain = list(tokenizer("a b", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a b")["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    raise ValueError(f"tokenizer: cannot locate the text between its special tokens ({full} vs {plain})")


def _hf_held_out(tokenizer, texts: list, sample_ids: np.ndarray, max_length: int, n: int, rng):
    """Windows of exactly max_length tokens (special tokens included) cut from the held-out
    texts that are not among the extracted samples (matched by their token ids)."""
    first = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    extracted = {tuple(int(x) for x in s) for s in sample_ids}
    used = [i for i, ids in enumerate(first) if tuple(ids) in extracted]
    if len({tuple(first[i]) for i in used}) != len(extracted):
        raise ValueError("the extracted samples are not among the dataset's held-out texts; the dataset "
                         "changed since extraction")
    prefix, suffix = _special_tokens(tokenizer)
    body = max_length - len(prefix) - len(suffix)
    if body < 1:
        raise ValueError(f"extract.max_length: {max_length} leaves no room for text between special tokens")
    windows, source = [], []
    for i, t in enumerate(texts):
        if i in used:
            continue
        ids = tokenizer(t, add_special_tokens=False, verbose=False)["input_ids"]
        for s in range(0, len(ids) - body + 1, body):
            windows.append(prefix + list(ids[s:s + body]) + suffix)
            source.append(i)
    if not windows:
        raise ValueError(f"prune.held_out.hf_windows: no held-out text has {max_length} tokens")
    pick = np.sort(rng.choice(len(windows), size=min(n, len(windows)), replace=False))
    return torch.tensor([windows[i] for i in pick], dtype=torch.long), sorted({source[i] for i in pick}), used


# -- the stage ------------------------------------------------------------------------------
def _load(kind: str, model_cfg: dict, meta: dict, checkpoint, dev):
    if kind == "hf":
        from .models.hf import load_hf
        net, tok = load_hf(model_cfg["path"], device=dev)
        net.set_attn_implementation(_register_gated_attention())  # = the recording attention until gated
        return net, tok
    net, _ = load_trained(checkpoint, n_token=len(meta["vocab"]) if kind == "txl" else None,
                          image_size=model_cfg.get("data", {}).get("image_size", 32))
    return net.to(dev).eval(), None


def _verdict(name: str, kind: str, table3: list, base: float, tol: float, n_units: int) -> str:
    """The finding as measured: does masking lowest-Haar-entropy first beat random orders?"""
    metric, higher = METRICS[kind]
    row = {r["ranking"]: r for r in table3}
    sign = 1.0 if higher else -1.0
    low, high, grad, rnd = row[HAAR_LOW], row[HAAR_HIGH], row[GRADIENT], row[RANDOM]
    a_rand = np.asarray(rnd["auc_seeds"])
    n_r = a_rand.size
    if sign * low["auc"] > (sign * a_rand).max():
        vs_rand, predicts = f"better than every one of the {n_r} random orders", True
    elif sign * low["auc"] < (sign * a_rand).min():
        vs_rand, predicts = f"worse than every one of the {n_r} random orders", False
    else:
        vs_rand, predicts = f"within the spread of the {n_r} random orders", False

    def cmp(other):
        return "better" if sign * low["auc"] > sign * other["auc"] else "worse"

    def heads(frac):
        return f"{frac:.0%} ({int(round(frac * n_units))} of {n_units} heads)"

    auc_of = "log perplexity" if kind == "txl" else metric
    best = max(table3, key=lambda r: sign * r["auc"])
    verdict = ("**Low Haar entropy predicts prunable heads here**" if predicts else
               "**Low Haar entropy does not predict prunable heads here**")
    return (f"{verdict} ({name}, measured on held-out data). Masking heads lowest Haar entropy first gives a "
            f"curve of held-out {metric} {vs_rand}: area under the curve of {auc_of} {low['auc']:.4g} against "
            f"{a_rand.mean():.4g} for random orders (min {a_rand.min():.4g}, max {a_rand.max():.4g}; "
            f"{'higher' if higher else 'lower'} is better); {cmp(high)} than highest first "
            f"({high['auc']:.4g}) and {cmp(grad)} than gradient importance ({grad['auc']:.4g}). "
            f"Lowest entropy first masks up to {heads(low['tolerated_fraction'])} with at most {tol:.0%} "
            f"relative loss of the {metric} (unmasked {base:.4g}); random orders "
            f"{rnd['tolerated_fraction']:.0%} on average, gradient importance {heads(grad['tolerated_fraction'])}. "
            f"Best ranking by area: {best['ranking']}.")


def _blank_nan(df):
    return df.astype(object).where(df.notna(), None)


def prune(kind: str, model_cfg: dict, data_npz, data_meta, checkpoint, attention_stores: list,
          entropy_store, outs: dict, *, fraction_step: float = 0.1, random_seeds: int = 5,
          seed: int = 0, held_out: dict | None = None, grad_projections: int = 8,
          batch_size: int = 64, tolerance: float = 0.01, stability_fraction: float = 0.1,
          device="auto") -> None:
    """Head-ablation study of one model (issue 6): Figure 7, Tables 3 and 4, the curves.

    outs: paths for `curves` (csv), `rankings` (csv), `finding` (rst, the measured verdict
    the report captions include), `fig7` (png), `table3_csv`, `table3_md`, `table4_csv`,
    `table4_md`.
    """
    import pandas as pd

    from . import plots, store

    held_out = {"txl_segments": 32, "vit_images": 300, "hf_windows": 24, **(held_out or {})}
    dev = resolve_device(device)
    name = model_cfg.get("name", kind)
    meta = json.loads(Path(data_meta).read_text())
    arrays = load_npz(data_npz) if kind != "hf" else {}
    attention = [store.read_store(p, require=("probs",), finite=("probs",)) for p in attention_stores]
    ent = store.read_store(entropy_store, require=("head_entropy",), finite=("head_entropy",))
    haar = ent["head_entropy"].transpose("sample", "layer", "head").values.astype(np.float64)
    S = haar.shape[0]
    if S != len(attention):
        raise ValueError(f"entropy store has {S} samples but {len(attention)} attention stores were given")

    net, tok = _load(kind, model_cfg, meta, checkpoint, dev)
    layout = head_layout(net, kind)
    L, H = layout.shape
    N = L * H
    if haar.shape[1:] != (L, H):
        raise ValueError(f"entropy store has {haar.shape[1:]} (layer, head), the model {layout.shape}")
    rng = np.random.default_rng(seed)

    # the rankings' samples and the disjoint held-out set
    samples, used = _ranking_samples(kind, model_cfg, attention, arrays, meta)
    if kind == "txl":
        T = attention[0].sizes["query"]
        data, picked = _txl_held_out(arrays["test"], T, used, held_out["txl_segments"], rng)
        log.info("held out: %d test segments of %d tokens (segments %s), none within one segment of the "
                 "extracted segments %s", len(data), T, picked.tolist(), used.tolist())
    elif kind == "vit":
        size = model_cfg.get("data", {}).get("image_size", 32)
        data, picked = _vit_held_out(arrays, meta, size, used, held_out["vit_images"], rng)
        log.info("held out: %d test images, none of the extracted images %s", len(data), used.tolist())
    else:
        max_len = samples.inputs.shape[1]
        ids, texts_used, extracted = _hf_held_out(tok, meta["test_texts"], samples.inputs.numpy(), max_len,
                                                  held_out["hf_windows"], rng)
        data = HeldOut(ids, reference_embeddings(net, layout, ids, batch_size))
        log.info("held out: %d windows of %d tokens from texts %s; the extracted samples are texts %s",
                 len(data), max_len, texts_used, extracted)

    # per-sample scores of every ranking (low = masked first)
    probs = [a["probs"].transpose("layer", "head", "query", "key").values for a in attention]
    grad = gradient_importance(net, layout, samples, grad_projections, seed, batch_size)
    per_sample = {HAAR_LOW: haar, HAAR_HIGH: -haar, GRADIENT: normalize_per_layer(grad),
                  ATTN_ENTROPY: np.stack([attention_entropy(p) for p in probs]),
                  CONFIDENCE: np.stack([attention_confidence(p) for p in probs])}
    del probs
    mean_scores = {HAAR_LOW: haar.mean(0), HAAR_HIGH: -haar.mean(0),
                   GRADIENT: normalize_per_layer(grad.mean(0)),
                   ATTN_ENTROPY: per_sample[ATTN_ENTROPY].mean(0), CONFIDENCE: per_sample[CONFIDENCE].mean(0)}
    orders = {k: [lowest_first(v)] for k, v in mean_scores.items()}
    orders[RANDOM] = [random_order(N, seed + s) for s in range(random_seeds)]
    orders = {k: orders[k] for k in RANKINGS}

    # every mask of every ranking, each distinct mask evaluated once, all in batched forwards
    ks = mask_counts(N, fraction_step)
    fractions = ks / N
    all_masks = np.concatenate([masks_from_order(o, ks, (L, H)) for k in RANKINGS for o in orders[k]])
    uniq, inverse = np.unique(all_masks.reshape(len(all_masks), -1), axis=0, return_inverse=True)
    log.info("%d rankings x %d mask sizes = %d masks, %d distinct; %d held-out examples each",
             sum(len(v) for v in orders.values()), len(ks), len(all_masks), len(uniq), len(data))
    metric_u = evaluate_masks(net, layout, data, torch.from_numpy(uniq.reshape(-1, L, H)), batch_size)
    metric_all = metric_u[inverse.reshape(-1)]
    curves, pos = {}, 0
    for k in RANKINGS:
        n_o = len(orders[k])
        c = metric_all[pos:pos + n_o * len(ks)].reshape(n_o, len(ks))
        curves[k] = c if k == RANDOM else c[0]
        pos += n_o * len(ks)
    base = float(curves[HAAR_LOW][0])
    metric, higher = METRICS[kind]

    # Table 3: area under each curve, largest fraction within the tolerance
    area = (lambda y: auc(fractions, np.log(y))) if kind == "txl" else (lambda y: auc(fractions, y))
    rows3 = []
    for k in RANKINGS:
        c = np.atleast_2d(curves[k])
        a, tf = area(c), tolerated_fraction(fractions, c, base, higher, tolerance)
        rows3.append({"ranking": k, "n_orders": c.shape[0], "auc": float(a.mean()),
                      "auc_sd": float(a.std(ddof=1)) if c.shape[0] > 1 else float("nan"),
                      "auc_seeds": a.tolist(), "tolerated_fraction": float(tf.mean()),
                      "tolerated_fraction_sd": float(tf.std(ddof=1)) if c.shape[0] > 1 else float("nan"),
                      "tolerated_seeds": tf.tolist(), f"{metric} at 50%": float(c[:, np.argmin(abs(fractions - .5))].mean())})
    finding = _verdict(name, kind, rows3, base, tolerance, N)

    # Table 4: stability of each ranking across samples
    rows4 = []
    grad_mean = mean_scores[GRADIENT].reshape(-1)
    for k in RANKINGS:
        if k == RANDOM:
            sc = np.argsort(np.stack(orders[RANDOM]), axis=1).astype(float)  # score = position in the order
            st = stability(sc, stability_fraction) if random_seeds > 1 else dict.fromkeys(
                ("spearman_mean", "spearman_min", "jaccard_mean", "jaccard_min"), float("nan"))
            rho_g = float("nan")
            across = "seeds"
        else:
            st = stability(per_sample[k].reshape(S, -1), stability_fraction) if S > 1 else dict.fromkeys(
                ("spearman_mean", "spearman_min", "jaccard_mean", "jaccard_min"), float("nan"))
            rho_g = float(spearman_between(np.stack([mean_scores[k].reshape(-1), grad_mean]))[0, 1])
            across = "samples"
        rows4.append({"ranking": k, "across": across, **st, "spearman_with_gradient": rho_g})
    t4 = pd.DataFrame(rows4)
    rh = t4.set_index("ranking")
    stab = (f"Across the {S} samples the Haar-entropy ranking has mean Spearman "
            f"{rh.loc[HAAR_LOW, 'spearman_mean']:.2f} and its bottom-{stability_fraction:.0%} set mean Jaccard "
            f"{rh.loc[HAAR_LOW, 'jaccard_mean']:.2f} (gradient importance {rh.loc[GRADIENT, 'spearman_mean']:.2f} / "
            f"{rh.loc[GRADIENT, 'jaccard_mean']:.2f}; random orders between seeds "
            f"{rh.loc[RANDOM, 'spearman_mean']:.2f} / {rh.loc[RANDOM, 'jaccard_mean']:.2f}); the mean Haar "
            f"entropy correlates with gradient importance at Spearman "
            f"{rh.loc[HAAR_LOW, 'spearman_with_gradient']:.2f}.")
    log.info("%s", finding)
    log.info("%s", stab)

    # outputs
    pd_curves = pd.DataFrame([{"ranking": k, "order": j, "k": int(kk), "fraction": float(f),
                               metric: float(np.atleast_2d(curves[k])[j, i])}
                              for k in RANKINGS for j in range(len(orders[k]))
                              for i, (kk, f) in enumerate(zip(ks, fractions))])
    store.atomic_write_text(outs["curves"], pd_curves.to_csv(index=False))
    pd_rank = pd.DataFrame([{"ranking": k, "order": j, "position": p, "layer": int(u // H), "head": int(u % H),
                             "score": float(mean_scores[k].reshape(-1)[u]) if k != RANDOM else float("nan")}
                            for k in RANKINGS for j, o in enumerate(orders[k]) for p, u in enumerate(o)])
    store.atomic_write_text(outs["rankings"], pd_rank.to_csv(index=False))

    t3 = pd.DataFrame([{k: v for k, v in r.items() if k not in ("auc_seeds", "tolerated_seeds")} for r in rows3])
    t3.insert(0, "model", name)
    t4.insert(0, "model", name)
    store.atomic_write_text(outs["table3_csv"], t3.to_csv(index=False))
    store.atomic_write_text(outs["table4_csv"], t4.to_csv(index=False))
    auc_of = "log perplexity" if kind == "txl" else metric
    md3 = t3.drop(columns=["model"]).rename(columns={
        "auc": f"AUC ({auc_of})", "auc_sd": "AUC sd", "n_orders": "orders",
        "tolerated_fraction": f"max fraction within {tolerance:.0%}", "tolerated_fraction_sd": "sd"})
    store.atomic_write_text(outs["table3_md"], (
        f"{finding}\n\n" + _blank_nan(md3).to_markdown(index=False, floatfmt=".4g", missingval="") +
        f"\n\n{name}: {N} heads ({L} layers x {H}), masked k = {ks.tolist()}; metric: held-out {metric} "
        f"({'higher' if higher else 'lower'} is better), unmasked {base:.4g}, on {len(data)} held-out examples. "
        f"AUC: trapezoidal area over the fraction masked (0 to 1); random: mean and sd over "
        f"{random_seeds} seeds. Max fraction: the largest fraction such that it and every smaller one lose "
        f"at most {tolerance:.0%} (relative) of the unmasked {metric}.\n"))
    md4 = t4.drop(columns=["model"]).rename(columns={
        "spearman_mean": "Spearman mean", "spearman_min": "Spearman min",
        "jaccard_mean": f"Jaccard bottom {stability_fraction:.0%} mean", "jaccard_min": "Jaccard min",
        "spearman_with_gradient": "Spearman with gradient importance"})
    store.atomic_write_text(outs["table4_md"], (
        f"{stab}\n\n" + _blank_nan(md4).to_markdown(index=False, floatfmt=".3g", missingval="") +
        f"\n\n{name}: per-sample scores of each ranking over {S} samples (random: the {random_seeds} seeds' "
        f"orders, the chance level); bottom set = the {stability_fraction:.0%} of the {N} heads each "
        "ranking masks first. Last column: Spearman correlation of the ranking's mean score with the "
        "per-layer-normalised gradient importance.\n"))
    # reST: a trailing underscore would make the model name a link target
    rst_name = name.replace("_", "\\_")
    store.atomic_write_text(outs["finding"], f"*Measured on {rst_name}:* "
                            + f"{finding} {stab}".replace(name, rst_name) + "\n")

    fig = plots.fig7_ablation(fractions, curves, f"held-out {metric}",
                              title=f"{name}: held-out {metric} vs. fraction of heads masked")
    if kind == "txl":  # perplexity grows exponentially as heads go
        from matplotlib.ticker import FuncFormatter
        ax = fig.axes[0]
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FuncFormatter(lambda v, _: f"{v:g}"))
    plots.save(fig, outs["fig7"])
