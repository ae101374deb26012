"""Head gates: scale each attention head's output, from outside the model (head ablation, docs/method.md §11.1).

A gate per (example, layer, head) scales that head's output before the layer's output
projection, so a gate of 0 removes the head's contribution and nothing else, a gate of 1
changes nothing (bit for bit), and a layer with every gate 0 passes only its residual path
plus the projection's bias. The gates are applied by hooks, per model kind:

- `txl`: a forward pre-hook on each layer's output projection `attn.o_net`, whose input is
  the concatenation of the heads' outputs;
- `vit` (torchvision): `nn.MultiheadAttention` uses its `out_proj` weight functionally, so
  hooks on `out_proj` never fire; a forward hook on the attention module adds
  sum_h (xi_h - 1) W_o[:, h] (P_h V_h), recomputed from the module's own weights — exactly
  zero at xi = 1, exactly the head's removal at xi = 0;
- `hf`: an attention function registered in transformers' `AttentionInterface` scales each
  head's output before the model's own output projection (BERT's `attention.output.dense`,
  Llama's `o_proj`, ...): `GATED_ATTENTION`, the recording eager attention of `models.hf_recording`
  times the gate (`attention="eager"`, the reference: every head's probabilities are
  materialised), or `GATED_SDPA`, each head's output from torch's fused
  `scaled_dot_product_attention` under the model's own mask times the gate, with the heads
  whose gate is 0 in every row not computed at all while no gradient is taken
  (`attention="sdpa"`, the fast path of the masked evaluation, docs/method.md §11.4).

Gates carry one row per example, so many masks are evaluated in one batched forward
(`row_outputs`): the rows of a batch are (mask, example) pairs.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["GATED_ATTENTION", "GATED_SDPA", "ATTENTIONS", "HeadLayout", "register_gated_attention", "head_layout",
           "check_attention", "check_gates", "head_gates", "row_outputs", "reference_embeddings", "wide"]

GATED_ATTENTION = "oattn_gated"
"""Name of the gated eager attention function registered in transformers' AttentionInterface."""
GATED_SDPA = "oattn_gated_sdpa"
"""Name of the gated fused (scaled_dot_product_attention) function registered beside it."""
ATTENTIONS = ("sdpa", "eager")
"""How an hf model's gated heads attend (`head_gates(attention=...)`): `sdpa` the fused kernel
(nothing of size tokens² kept; the heads gated off everywhere skipped), `eager` the recording
attention, every probability materialised. txl and vit gate their own attention either way."""


OBJECTIVES = ("txl", "vit", "hf", "lm")
"""What a gated forward measures (`row_outputs`): txl next-token NLL of the trained
Transformer-XL, vit class logits, hf the sentence embedding of an encoder (or of a model
without a language-model head), lm next-token NLL through a causal LM's own head."""


@dataclass(frozen=True)
class HeadLayout:
    """Where a model's heads are gated: one module per layer (txl: the output projection,
    vit: the attention module, hf: the module that calls the attention function), and what
    a forward measures (`objective`, one of OBJECTIVES: an hf model whose attention is causal,
    read off a two-token forward, and that has a language-model head is measured as `lm`)."""

    kind: str
    n_layer: int
    n_head: int
    modules: tuple
    objective: str = ""
    causal: bool = False  # hf: the model's attention mask is causal (a decoder)
    n_vocab: int = 0  # txl and lm: the logits per token (the largest activation of a long no-grad pass)

    def __post_init__(self):
        if not self.objective:
            object.__setattr__(self, "objective", self.kind)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: unknown {self.objective!r} (allowed: {', '.join(OBJECTIVES)})")

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_layer, self.n_head


# -- hf: the gated attention function ---------------------------------------------------------
_HF_GATES: contextvars.ContextVar = contextvars.ContextVar("oattn_head_gates", default=None)


def _layer_gates(module):
    """(rows, head) gates of the layer whose attention `module` is, or None (no gates active,
    or a module not in the layout)."""
    active = _HF_GATES.get()
    if active is None:
        return None
    gates, layer_of = active
    layer = layer_of.get(id(module))
    return None if layer is None else gates[:, layer]


def _gated_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """The recording eager attention of `models.hf_recording`, each head's output times its gate."""
    from .hf_recording import recording_attention_forward

    out, probs = recording_attention_forward(module, query, key, value, attention_mask, **kwargs)
    gate = _layer_gates(module)
    if gate is not None:  # out: (batch, query, head, d_head)
        out = out * gate[:, None, :, None].to(out.dtype)
    return out, probs


def _gated_sdpa_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                        position_bias=None, is_causal=None, **kwargs):
    """Each head's output from `scaled_dot_product_attention`, times its gate (docs/method.md §11.4).

    query (batch, heads, q, d), key/value (batch, kv_heads, k, d) -> ((batch, q, heads, d), None).
    The mask is what transformers' sdpa path receives (`sdpa_mask`): None where the model's
    mask is purely causal (then `is_causal`, as transformers' own sdpa attention decides it) or
    absent, else a boolean (True = attend) or additive mask. Query head h reads key/value head
    h // (heads // kv_heads). Without a gradient, heads whose gate is 0 in every row are not
    computed (their gated output is 0 whatever it would have been). What fused attention does
    not implement (a logit soft-cap, T5's position bias, attention sinks) and a query with no
    key to attend (which eager gives a uniform row, and fused attention NaN) go through the
    gated eager attention instead.
    """
    eager = dict(scaling=scaling, dropout=dropout, softcap=softcap, position_bias=position_bias, **kwargs)
    if (softcap is not None or position_bias is not None or kwargs.get("s_aux") is not None
            or isinstance(getattr(module, "sinks", None), torch.Tensor)):
        return _gated_attention_forward(module, query, key, value, attention_mask, **eager)
    if (attention_mask is not None and attention_mask.dtype == torch.bool
            and not bool(attention_mask.any(-1).all())):
        return _gated_attention_forward(module, query, key, value, attention_mask, **eager)
    B, H, Tq, _ = query.shape
    if H % key.shape[1]:
        raise ValueError(f"query has {H} heads, not a multiple of the {key.shape[1]} key/value heads")
    n_rep = H // key.shape[1]
    gate = _layer_gates(module)
    heads = None  # every head
    if gate is not None and not (torch.is_grad_enabled() and gate.requires_grad):
        live = (gate != 0).any(0)
        if not bool(live.any()):  # the whole layer gated off in every row: nothing to compute
            return query.new_zeros((B, Tq, H, value.shape[-1])), None
        if not bool(live.all()):
            heads = live.nonzero().squeeze(1)
    if heads is None:
        kv = torch.arange(H, device=query.device) // n_rep if n_rep > 1 else None
        q = query
    else:
        kv = heads // n_rep
        q = query.index_select(1, heads)
    k = key if kv is None else key.index_select(1, kv)
    v = value if kv is None else value.index_select(1, kv)
    mask = attention_mask
    if mask is not None:
        mask = mask[..., : k.shape[-2]]
        if heads is not None and mask.shape[1] > 1:  # a per-head mask
            mask = mask.index_select(1, heads)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(Tq > 1 and mask is None and causal)
    if causal and k.shape[-2] > Tq:  # as transformers: fused causal attention aligns top-left
        k, v = k[:, :, :Tq], v[:, :, :Tq]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
                                       scale=scaling, is_causal=causal)
    if heads is not None:
        o = o.new_zeros((B, H, Tq, o.shape[-1])).index_copy(1, heads, o)
    out = o.transpose(1, 2)
    if gate is not None:  # (batch, query, head, d_head)
        out = out * gate[:, None, :, None].to(out.dtype)
    return out.contiguous(), None


def register_gated_attention() -> str:
    """Register the gated attention functions with their mask builders in transformers: the
    eager one (`GATED_ATTENTION`, the recording attention while no gates are active; transformers'
    additive `eager_mask`) and the fused one (`GATED_SDPA`; `sdpa_mask`, None where `is_causal`
    says it all); idempotent. Returns the eager one's name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    AttentionInterface.register(GATED_ATTENTION, _gated_attention_forward)
    AttentionMaskInterface.register(GATED_ATTENTION, eager_mask)
    AttentionInterface.register(GATED_SDPA, _gated_sdpa_forward)
    AttentionMaskInterface.register(GATED_SDPA, sdpa_mask)
    return GATED_ATTENTION


def check_attention(attention: str) -> str:
    """`attention` if it is one of ATTENTIONS; ValueError naming it otherwise."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention: unknown {attention!r} (allowed: {', '.join(ATTENTIONS)})")
    return attention


@contextlib.contextmanager
def _hf_gated(model, attention: str = "eager") -> Iterator[None]:
    """Run `model` with the gated attention function of `attention` inside the block, then
    restore. A model that transformers does not run with sdpa gets the eager one."""
    from .hf_recording import attn_implementation, supports_attention_interface

    before = attn_implementation(model)
    register_gated_attention()
    name = GATED_SDPA if check_attention(attention) == "sdpa" and getattr(model, "_supports_sdpa", False) \
        else GATED_ATTENTION
    if before == name:
        yield
        return
    if not supports_attention_interface(model):
        raise ValueError(f"model: {type(model).__name__} does not dispatch its attention through "
                         "transformers' AttentionInterface, so its heads cannot be masked here")
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


# -- layouts and gates ------------------------------------------------------------------------
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
        return HeadLayout("txl", len(mods), n_head, tuple(mods), n_vocab=int(model.config.n_token))
    if kind == "vit":
        blocks = list(getattr(getattr(model, "encoder", None), "layers", ()))
        mods = [getattr(b, "self_attention", None) for b in blocks]
        if not mods or not all(isinstance(m, nn.MultiheadAttention) for m in mods):
            raise ValueError("model: expected a torchvision VisionTransformer (encoder.layers[i].self_attention)")
        return HeadLayout("vit", len(mods), mods[0].num_heads, tuple(mods))
    if kind == "hf":
        from .hf_recording import record_attention
        dev = next(model.parameters()).device
        ids = torch.zeros((1, 2), dtype=torch.long, device=dev)
        with _hf_gated(model), torch.no_grad(), record_attention() as rec:
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        if not rec.modules:
            raise ValueError(f"model: {type(model).__name__} never called the attention function")
        heads = {p.shape[1] for p in rec.probs}
        if len(heads) != 1:
            raise ValueError(f"model: layers with different head counts {sorted(heads)} are not supported")
        causal = attends_causally(rec.probs)
        get = getattr(model, "get_output_embeddings", None)
        head = get() if causal and get is not None else None
        objective = "lm" if head is not None else "hf"
        n_vocab = int(head.weight.shape[0]) if head is not None else 0
        return HeadLayout("hf", len(rec.modules), heads.pop(), tuple(rec.modules), objective, causal, n_vocab)
    raise ValueError(f"kind: unknown model kind {kind!r} (allowed: txl, vit, hf)")


def attends_causally(probs) -> bool:
    """Whether recorded probabilities of a two-token input (layer-wise (batch, head, 2, 2))
    never let the first token see the second: the model's mask is causal."""
    return all(bool((p[..., 0, 1] == 0).all()) for p in probs)


def check_gates(gates, layout: HeadLayout) -> torch.Tensor:
    """`gates` as a (rows, layer, head) tensor; (layer, head) becomes one row. ValueError
    naming the shape otherwise."""
    if not isinstance(gates, torch.Tensor):
        gates = torch.as_tensor(np.asarray(gates, dtype=np.float32))
    if gates.ndim == 2:
        gates = gates[None]
    if gates.ndim != 3 or tuple(gates.shape[1:]) != layout.shape:
        raise ValueError(f"gates: expected shape (rows, {layout.n_layer}, {layout.n_head}) or "
                         f"({layout.n_layer}, {layout.n_head}), got {tuple(gates.shape)}")
    return gates


@contextlib.contextmanager
def head_gates(model, layout: HeadLayout, gates, attention: str = "eager") -> Iterator[None]:
    """Scale every head's output by its gate inside the block.

    gates: (rows, layer, head) or (layer, head); rows is 1 (one mask for the whole batch)
    or the batch size (one mask per example). None gates nothing. Gradients flow to the
    gates. 0 removes the head; 1 leaves the model bit for bit as it is with `attention`
    "eager" (hf: the recording attention it was loaded with), and as its fused attention
    computes it with "sdpa" (the same function, to float rounding: docs/method.md §11.4).
    """
    check_attention(attention)
    if gates is None:
        if layout.kind == "hf" and attention == "sdpa":
            with _hf_gated(model, attention):
                yield
        else:
            yield
        return
    g = check_gates(gates, layout)
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
            from .vision_transformer import recompute_attention

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
                with _hf_gated(model, attention):
                    yield
            finally:
                _HF_GATES.reset(token)
        else:
            raise ValueError(f"layout.kind: unknown model kind {layout.kind!r}")
    finally:
        for h in handles:
            h.remove()


# -- one gated forward --------------------------------------------------------------------------
def wide(x: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision tensors; float32 and float64 stay as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def next_token_nll(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean negative log-likelihood (nats/token) of ids[:, 1:] under logits[:, :-1], per row:
    (n,). mask (n, tokens) bool: the real tokens of right-padded rows, whose padding is
    neither predicted nor counted (None: all real). The log-softmax runs in float32."""
    lp = F.log_softmax(wide(logits[:, :-1]), dim=-1)
    nll = -lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    if mask is None:
        return nll.mean(1)
    m = mask[:, 1:].to(nll.dtype)
    return (nll * m).sum(1) / m.sum(1).clamp_min(1)


def row_outputs(model, layout: HeadLayout, inputs: torch.Tensor, gates=None, mask=None,
                attention: str = "eager") -> torch.Tensor:
    """One forward with per-row gates: txl and lm mean next-token NLL per row (nats/token,
    (n,)); vit logits (n, classes); hf L2-normalised mean-pooled sentence embeddings (n, hidden).
    attention: how an hf model's heads attend (ATTENTIONS; `head_gates`).

    inputs: txl (n, tgt_len + 1) token windows (input = [:, :-1], targets = [:, 1:]); vit
    (n, channel, height, width) images; hf and lm (n, tokens) input ids (lm: tokens 1.. are
    predicted from the ones before), right-padded where `mask` (n, tokens) bool marks the
    real tokens: the model's attention mask, and the tokens the NLL and the mean pooling count.
    """
    with head_gates(model, layout, gates, attention):
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
                lp = F.log_softmax(wide(o), dim=-1).gather(-1, y.reshape(-1, 1)).squeeze(-1)
            return -wide(lp).reshape(y.shape).mean(1)
        if layout.kind == "vit":
            return model(inputs)
        attention_mask = torch.ones_like(inputs) if mask is None else mask.to(inputs.dtype)
        if layout.objective == "lm":
            logits = model(input_ids=inputs, attention_mask=attention_mask).logits
            return next_token_nll(logits, inputs, mask)
        # the all-MiniLM-L6-v2 recipe (models.hf_recording.hf_embeddings): the mean over the real tokens
        hidden = wide(model(input_ids=inputs, attention_mask=attention_mask).last_hidden_state)
        if mask is None:
            return F.normalize(hidden.mean(1), p=2, dim=1)
        m = mask.to(hidden.dtype)[..., None]
        return F.normalize((hidden * m).sum(1) / m.sum(1).clamp_min(1), p=2, dim=1)


@torch.no_grad()
def reference_embeddings(model, layout: HeadLayout, inputs: torch.Tensor, batch_size: int = 64,
                         mask: torch.Tensor | None = None, attention: str = "sdpa") -> torch.Tensor:
    """hf: the unmasked model's sentence embeddings of `inputs` (the cosine reference); mask:
    (n, tokens) bool of the real tokens of padded inputs (None: all). attention: as in
    `ablation.evaluate_masks`, whose unmasked rows then compute what the reference computes."""
    check_attention(attention)
    model.eval()
    dev = next(model.parameters()).device
    return torch.cat([row_outputs(model, layout, inputs[i:i + batch_size].to(dev),
                                  mask=None if mask is None else mask[i:i + batch_size].to(dev),
                                  attention=attention).cpu()
                      for i in range(0, inputs.shape[0], batch_size)])
