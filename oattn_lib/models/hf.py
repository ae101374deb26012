"""Attention scores and probabilities from Hugging Face transformers (docs/method.md §9.4).

For every layer and head we keep both the pre-softmax scores, (q k^T) * scaling before
any mask, and the post-softmax probabilities, softmax(scores + mask), as the model
computes them.  With transformers 5, `attn_implementation="eager"` only hands back the
probabilities (through `output_attentions`) and `"sdpa"` hands back nothing, so we
register our own attention function, `ATTN_IMPLEMENTATION`, through transformers'
`AttentionInterface`.  It computes exactly what eager attention computes and, while a
`record_attention()` block is open, keeps a float32 copy of the scores and
probabilities of every call in call order, that is, in layer order.

Mask format: we register transformers' `eager_mask` as the mask builder of our
implementation, so the attention function receives what eager receives: `None` when no
position is masked (a bidirectional encoder without padding), otherwise an additive
float mask of shape (batch, 1, query, key) holding 0 where attention is allowed and
`torch.finfo(dtype).min` where it is not.  A boolean mask (True = attend), which some
models build themselves, is converted to the same additive form.  Without a registered
mask builder transformers would pass no mask at all to a custom implementation, and
padded keys would silently receive attention.

Models that do not dispatch through the `AttentionInterface` are loaded with plain
eager attention; for them `hf_attention` returns the probabilities from
`output_attentions` and `scores=None` (the scores cannot be recovered from the
probabilities, since softmax forgets a per-row constant).

Decoders (causal LMs; docs/method.md §9.4, §9.5). `probs` are the model's masked softmax: entries above the
diagonal, or outside a sliding window (Mistral, the local layers of Gemma 2), are exactly
0, as are padded keys. `scores` are (q k^T) * scaling, soft-capped where the model caps
its logits (Gemma 2: softcap * tanh(s / softcap)), *before* the mask: they are defined at
every (query, key) entry, including the entries the mask removes, which the model
computes but never uses (no probability, no gradient, no effect on the output). Which
entries the model could attend is recorded per call as `allowed` ((batch, query, key),
True where the model's mask lets it attend: the additive mask is 0, or a finite bias,
rather than the dtype's minimum; None when the model passes no mask); the extract stage
stores it as the variable `allowed` (layer, query, key), so analysis never has to guess
the mask from zeros of the probabilities. Analyses that treat a head as a full matrix
(the organization, the Haar expansions) see the pre-mask scores there; those that compare
with the model's softmax (Theorem 1, docs/method.md §7.5) restrict it to `allowed`. A query row with
no allowed key at all (a padded query whose window holds only padding) is what the
model computes, a uniform row, and means nothing.

Grouped-query attention: a layer has n_heads query heads and n_kv_heads key/value heads,
query head h reading key/value head h // (n_heads // n_kv_heads) (transformers'
`repeat_kv` layout); `kv_groups` gives that index, stored as the `kv_group` coordinate of
the head axis.

Streaming: `record_attention(sink)` hands every call to `sink` as a `LayerAttention` while
the forward pass runs, keeping nothing, so that a caller can write each layer and let it
go (`hf_attention_stream`); peak memory is then the model plus about one layer's scores
and probabilities, whatever the number of layers.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .files import is_offline, minilm_path, resolve_hf

__all__ = ["ATTN_IMPLEMENTATION", "AttentionRecord", "LayerAttention", "record_attention", "kv_groups",
           "recording_attention_forward", "register_recording_attention", "supports_attention_interface",
           "load_hf", "attn_implementation", "hf_encode", "hf_attention", "hf_attention_stream", "hf_embeddings",
           "minilm_path"]

ATTN_IMPLEMENTATION = "oattn_eager_record"
"""Name under which the recording attention function is registered in transformers."""


# --------------------------------------------------------------------------- recording

@dataclass(frozen=True, eq=False)
class LayerAttention:
    """One call of the recording attention, as the forward pass produces it.

    index: the call's position (0, 1, ...: the layer, for a model calling attention once per
    layer); scores (batch, head, query, key) pre-mask, in the model's dtype; probs (batch,
    head, query, key) float32, the masked softmax; allowed (batch, query, key) bool, True
    where the model may attend, or None when it passes no mask; n_kv_heads: the call's
    key/value heads. The tensors are the ones the model computes with: copy what you keep.
    """
    index: int
    module: torch.nn.Module
    scores: torch.Tensor
    probs: torch.Tensor
    allowed: torch.Tensor | None
    n_kv_heads: int


@dataclass
class AttentionRecord:
    """Per-call scores and probabilities, (batch, head, query, key) float32 each, in call order,
    with each call's `allowed` mask ((batch, query, key) bool or None) and key/value head count.

    With a `sink`, every call goes to sink(LayerAttention) instead, and only `modules` and
    `n_kv_heads` are kept.
    """
    scores: list[torch.Tensor] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    modules: list[torch.nn.Module] = field(default_factory=list)
    allowed: list[torch.Tensor | None] = field(default_factory=list)
    n_kv_heads: list[int] = field(default_factory=list)
    sink: Callable[[LayerAttention], None] | None = None


# The attention function is called deep inside the model, where only the module and the
# tensors are available; a context variable scopes recording to one `with` block (and one
# thread or task) without storing anything on the model.
_ACTIVE: contextvars.ContextVar[AttentionRecord | None] = contextvars.ContextVar("oattn_attention_record", default=None)


@contextlib.contextmanager
def record_attention(sink: Callable[[LayerAttention], None] | None = None) -> Iterator[AttentionRecord]:
    """Collect the scores and probabilities of every recording-attention call in the block, or
    hand each call to `sink` as it happens (module docstring: streaming)."""
    record = AttentionRecord(sink=sink)
    token = _ACTIVE.set(record)
    try:
        yield record
    finally:
        _ACTIVE.reset(token)


def kv_groups(n_heads: int, n_kv_heads: int) -> np.ndarray:
    """The key/value head each query head reads, (n_heads,) int64: h // (n_heads // n_kv_heads)
    (transformers' grouped-query layout; n_kv_heads == n_heads gives every head its own)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads: {n_kv_heads} does not divide the {n_heads} query heads")
    return np.arange(n_heads, dtype=np.int64) // (n_heads // n_kv_heads)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # grouped-query attention: each key/value head serves n_rep consecutive query heads
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def recording_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: torch.Tensor | None,
                                scaling: float | None = None, dropout: float = 0.0,
                                softcap: float | None = None, **kwargs):
    """Eager attention, plus a float32 copy of scores and probabilities when recording.

    query (batch, heads, q, d), key/value (batch, kv_heads, k, d); returns the attention
    output (batch, q, heads, d) and the probabilities, as transformers' eager functions do.
    The softmax runs in float32 (as in eager Llama-style models; for float32 models, as
    in every eager model; float64 models in float64) and the probabilities are cast back to
    the query dtype.
    """
    if kwargs.get("s_aux") is not None or isinstance(getattr(module, "sinks", None), torch.Tensor):
        raise NotImplementedError(
            f"{type(module).__name__} uses attention sinks, which the recording attention does not "
            "implement; load the model with attn_implementation='eager' instead")
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"query has {query.shape[1]} heads, not a multiple of the {key.shape[1]} key/value heads")
    n_rep = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    if scaling is None:
        scaling = query.size(-1) ** -0.5

    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:  # Gemma-2 style logit soft-capping is part of the logits
        scores = torch.tanh(scores / softcap) * softcap
    logits, allowed = scores, None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]
        if mask.dtype == torch.bool:
            allowed = mask
            mask = torch.where(mask, torch.zeros((), dtype=scores.dtype, device=mask.device),
                               torch.finfo(scores.dtype).min)
        else:  # additive: 0 (or a finite bias) where allowed, the dtype's minimum where not
            allowed = mask > torch.finfo(mask.dtype).min / 2
        logits = scores + mask
    # float32 at least (float64 models keep their precision, which gradient checks need)
    probs_wide = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    del logits
    probs32 = probs_wide.float()
    probs = probs_wide.to(query.dtype)

    record = _ACTIVE.get()
    if record is not None:
        # the mask is shared by the heads (dim 1 has size 1); a per-head mask counts as allowed
        # where any head may attend
        allowed = None if allowed is None else allowed.any(dim=1).expand(query.shape[0], -1, -1)
        n_kv = int(query.shape[1] // n_rep)
        if record.sink is not None:
            record.sink(LayerAttention(len(record.modules), module, scores.detach(), probs32.detach(), allowed, n_kv))
        else:
            record.scores.append(scores.detach().float())
            record.probs.append(probs32.detach())
            record.allowed.append(allowed)
        record.modules.append(module)
        record.n_kv_heads.append(n_kv)

    weights = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, probs


def register_recording_attention() -> str:
    """Register the recording attention and its (eager, additive) mask builder; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, recording_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
    return ATTN_IMPLEMENTATION


def supports_attention_interface(model_or_class) -> bool:
    """Whether a transformers model dispatches its attention through `AttentionInterface`."""
    cls = model_or_class if isinstance(model_or_class, type) else type(model_or_class)
    if getattr(cls, "_supports_attention_backend", False):
        return True
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    try:
        return bool(can_set()) if can_set is not None else False
    except Exception:  # a heuristic on the source; unreadable source means no
        return False


# --------------------------------------------------------------------------- loading

def load_hf(path_or_name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
            local_files_only: bool | None = None, causal_lm: bool = False, *, gguf_file: str | None = None):
    """Load a transformers model and its tokenizer for attention extraction, in eval mode.

    `path_or_name` is a local directory, a hub name already in the local cache, or an alias:
    `minilm` (see `minilm_path`) or `smollm2` (see `models.files.smollm2_path`, a GGUF
    file). `gguf_file` names a GGUF file in that directory (or hub repository), which
    transformers dequantises to `dtype` (about 13 s for SmolLM2-135M; the workflow's
    `prepare_model` rule does it once). `causal_lm=True` loads the model with its language
    modelling head (`AutoModelForCausalLM`, for next-token scores) instead of the bare
    model (`AutoModel`); the attention is recorded the same way.
    `local_files_only=None` means: only local files when the path is a directory or
    HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set.
    Models that dispatch through the `AttentionInterface` get the recording attention
    (scores and probabilities); others get plain eager attention (probabilities only).
    Returns (model, tokenizer).
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    if not isinstance(path_or_name, (str, os.PathLike)):
        raise ValueError(f"path_or_name: expected a path or model name, got {type(path_or_name).__name__}")
    path_or_name, gguf_file = resolve_hf(str(path_or_name), gguf_file)
    if local_files_only is None:
        local_files_only = Path(path_or_name).is_dir() or is_offline()
    extra = {"gguf_file": gguf_file} if gguf_file else {}

    config = AutoConfig.from_pretrained(path_or_name, local_files_only=local_files_only, **extra)
    model_class = None
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING
        model_class = (MODEL_FOR_CAUSAL_LM_MAPPING if causal_lm else MODEL_MAPPING)[type(config)]
    except Exception:  # remote code or an unmapped config: decide after loading
        pass
    if model_class is None or supports_attention_interface(model_class):
        attn = register_recording_attention()
    else:
        attn = "eager"
    auto = AutoModelForCausalLM if causal_lm else AutoModel
    model = auto.from_pretrained(path_or_name, config=config, attn_implementation=attn, dtype=dtype,
                                 local_files_only=local_files_only, **extra)
    if attn != "eager" and not supports_attention_interface(model):
        model.set_attn_implementation("eager")
    model.to(device).eval()

    tokenizer = AutoTokenizer.from_pretrained(path_or_name, local_files_only=local_files_only, **extra)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # decoder-only tokenizers ship without one
    return model, tokenizer


# --------------------------------------------------------------------------- extraction

def attn_implementation(model) -> str | None:
    """The attention implementation a loaded transformers model dispatches to (or None)."""
    impl = getattr(model.config, "_attn_implementation", None)
    return impl if isinstance(impl, str) or impl is None else next(iter(impl.values()), None)


def _check_texts(texts, max_length: int) -> None:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError(f"texts: expected a non-empty list of strings, got {type(texts).__name__}"
                         + (f" of length {len(texts)}" if isinstance(texts, (list, tuple)) else ""))
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts: entry {bad[0]} is a {type(texts[bad[0]]).__name__}, not a string")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length: expected a positive integer, got {max_length!r}")


def hf_encode(model, tokenizer, texts: list[str], max_length: int = 128) -> dict[str, torch.Tensor]:
    """The model inputs of `texts` as `hf_attention` builds them: tokenized together,
    truncated to `max_length` tokens, padded to the longest, on the model's device."""
    _check_texts(texts, max_length)
    enc = tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return {k: v.to(model.device) for k, v in enc.items()}


def _no_dispatch(model) -> RuntimeError:
    return RuntimeError(
        f"{type(model).__name__} was set to `{ATTN_IMPLEMENTATION}` but never called it; its attention "
        "does not dispatch through transformers' AttentionInterface. Load it with "
        "attn_implementation='eager' to get the probabilities")


def _no_weights(impl) -> ValueError:
    return ValueError(
        f"model: attention implementation `{impl}` exposes no attention weights; load the model with "
        f"`load_hf` or call `model.set_attn_implementation(register_recording_attention())`")


def _inputs(enc, tokenizer) -> dict:
    input_ids = enc["input_ids"].cpu()
    attention_mask = enc.get("attention_mask", torch.ones_like(enc["input_ids"])).cpu()
    tokens = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in input_ids]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "tokens": tokens}


def hf_attention(model, tokenizer, texts: list[str], max_length: int = 128) -> dict:
    """Scores and probabilities of every layer and head for a batch of texts (docs/method.md §9.4).

    Texts are tokenized together, truncated to `max_length` tokens and padded to the
    longest; padded keys are masked (probability exactly 0).  Rows of padded queries are
    whatever the model computes for them and carry no meaning: select positions with
    `attention_mask`.  Returns a dict with

    - `scores`: (batch, layer, head, query, key) float32, (q k^T) * scaling before any
      mask (module docstring: what they mean for a decoder); None when the model does not
      use the `AttentionInterface`;
    - `probs`: (batch, layer, head, query, key) float32, softmax(scores + mask);
    - `allowed`: (batch, layer, query, key) bool, True where the model may attend (its
      causal, sliding-window and padding mask); None without the `AttentionInterface`;
    - `kv_group`: (layer, head) int64, the key/value head each query head reads
      (`kv_groups`); None without the `AttentionInterface`;
    - `input_ids`, `attention_mask`: (batch, seq);
    - `tokens`: one list of seq token strings per text, padding included, aligned with
      the seq axis.

    All tensors are on the CPU.  Every layer is held in memory at once: for long inputs
    use `hf_attention_stream`.
    """
    enc = hf_encode(model, tokenizer, texts, max_length)
    impl = attn_implementation(model)
    allowed = kv = None
    with torch.no_grad():
        if impl == ATTN_IMPLEMENTATION:
            with record_attention() as record:
                model(**enc)
            if not record.probs:
                raise _no_dispatch(model)
            shapes = {tuple(p.shape) for p in record.probs}
            if len(shapes) > 1:
                raise RuntimeError(f"attention calls of different shapes {sorted(shapes)} (cross-attention or "
                                   "hybrid layers?); stack the calls of `record_attention()` yourself")
            scores = torch.stack(record.scores, dim=1).cpu()
            probs = torch.stack(record.probs, dim=1).cpu()
            b, _, h, nq, nk = probs.shape
            allowed = torch.stack([torch.ones(b, nq, nk, dtype=torch.bool) if a is None else a.cpu()
                                   for a in record.allowed], dim=1)
            kv = np.stack([kv_groups(h, n) for n in record.n_kv_heads])
        elif impl == "eager":
            out = model(**enc, output_attentions=True)
            if not getattr(out, "attentions", None):
                raise RuntimeError(f"{type(model).__name__} returned no attentions with output_attentions=True")
            scores = None
            probs = torch.stack([a.float() for a in out.attentions], dim=1).cpu()
        else:
            raise _no_weights(impl)
    return {"scores": scores, "probs": probs, "allowed": allowed, "kv_group": kv, **_inputs(enc, tokenizer)}


def hf_attention_stream(model, inputs: dict, on_layer: Callable[[LayerAttention], None]) -> int:
    """`hf_attention` one layer at a time: `on_layer(LayerAttention)` receives each attention
    call while the forward pass on `inputs` (`hf_encode`, or any keyword arguments of the
    model) runs: scores, probs, allowed and key/value heads of that layer (module
    docstring), and nothing is kept, so memory stays at about one layer. Returns the
    number of attention calls (layers). Needs the recording attention (`load_hf`).
    """
    impl = attn_implementation(model)
    if impl != ATTN_IMPLEMENTATION:
        if impl == "eager":
            raise ValueError(f"model: {type(model).__name__} does not use transformers' AttentionInterface, so its "
                             "attention cannot be streamed; use hf_attention (probabilities only)")
        raise _no_weights(impl)
    with torch.no_grad(), record_attention(sink=on_layer) as record:
        model(**inputs)
    if not record.modules:
        raise _no_dispatch(model)
    return len(record.modules)


def hf_embeddings(model, tokenizer, texts: list[str], max_length: int = 128, batch_size: int = 64) -> torch.Tensor:
    """Sentence embeddings (batch, hidden): mean of the last hidden states over the real
    tokens, L2-normalised (the all-MiniLM-L6-v2 recipe).  float32, on the CPU."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    _check_texts(texts, max_length)
    chunks = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = hf_encode(model, tokenizer, texts[start:start + batch_size], max_length)
            hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            chunks.append(torch.nn.functional.normalize(mean, p=2, dim=1).cpu())
    return torch.cat(chunks)
