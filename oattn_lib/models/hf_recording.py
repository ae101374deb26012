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

A model loaded elsewhere (`from_pretrained(..., attn_implementation="sdpa")`, a model built
from a config) is recorded inside `recording_installed(model)`, which switches it to the
recording attention with transformers' `set_attn_implementation` and gives it back its own
implementation on leaving.

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

Bigger models. The compute dtype (`load_hf(dtype=...)`: float32, bfloat16, float16 on a GPU)
is the dtype of the weights and of the forward pass; what is recorded is float32 whatever it
is: the scores are the model's (bfloat16 or float16) logits widened, the probabilities a
float32 softmax of them with the mask added in float32 (the mask's own minimum, in float16,
would overflow). A model whose float32 weights do not fit one device is spread over
several with `load_hf(device_map=...)`; each layer's attention is then moved to the CPU
as it is recorded. A 7B model needs 28 GB of weights in float32, 14 GB in bfloat16.

Encoder-decoder models (T5, BART and their kin; docs/method.md §9.4) call the attention
function from three kinds of module: encoder self-attention, decoder (causal)
self-attention and cross-attention (queries: decoder positions, keys: encoder positions,
a rectangular head). `hf_attention_stream` names each call's stack and its layer within
it, and `hf_seq2seq_attention` returns one record per stack. T5 adds a learnt relative
position bias to its logits, passed to the attention function as `position_bias`: it is
part of the recorded scores.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .files import is_offline, minilm_path, resolve_hf

__all__ = ["ATTN_IMPLEMENTATION", "AttentionRecord", "LayerAttention", "record_attention", "kv_groups",
           "recording_attention_forward", "register_recording_attention", "supports_attention_interface",
           "recording_installed",
           "COMPUTE_DTYPES", "compute_dtype", "model_devices", "gguf_parsed_once", "gguf_parses", "load_hf", "attn_implementation", "hf_encode",
           "hf_attention", "hf_attention_stream", "STACKS", "hf_seq2seq_encode",
           "hf_seq2seq_attention", "hf_embeddings", "minilm_path"]

ATTN_IMPLEMENTATION = "oattn_eager_record"
"""Name under which the recording attention function is registered in transformers."""


# --------------------------------------------------------------------------- recording

@dataclass(frozen=True, eq=False)
class LayerAttention:
    """One call of the recording attention, as the forward pass produces it.

    index: the call's position (0, 1, ...: the layer, for a model calling attention once per
    layer); scores (batch, head, query, key) float32, pre-mask; probs (batch, head, query,
    key) float32, the masked softmax; allowed (batch, query, key) bool, True where the model
    may attend, or None when it passes no mask; n_kv_heads: the call's key/value heads.
    `hf_attention_stream` also sets `stack` ("encoder", "decoder" or "cross" for an
    encoder-decoder model, None for a single stack) and `layer` (the call's layer within its
    stack). The tensors are the ones the model computes with (float32 copies for a model
    computing in a narrower dtype): copy what you keep.
    """
    index: int
    module: torch.nn.Module
    scores: torch.Tensor
    probs: torch.Tensor
    allowed: torch.Tensor | None
    n_kv_heads: int
    stack: str | None = None
    layer: int | None = None


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
                                softcap: float | None = None, position_bias: torch.Tensor | None = None,
                                **kwargs):
    """Eager attention, plus a float32 copy of scores and probabilities when recording.

    query (batch, heads, q, d), key/value (batch, kv_heads, k, d); returns the attention
    output (batch, q, heads, d) and the probabilities, as transformers' eager functions do.
    `position_bias` ((1 or batch, heads, q, k), T5's relative position bias) is added to the
    logits, as T5's eager attention adds it, and is part of the recorded scores.
    The mask is added and the softmax runs in float32 (as in eager Llama-style models; for
    float32 models, as in every eager model; float64 models in float64), whatever the
    model's compute dtype, and the probabilities are cast back to the query dtype: a
    bfloat16 or float16 model attends with what eager Llama would give it, and the recorded
    probabilities are that float32 softmax of its (bfloat16 or float16) logits.
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
    if position_bias is not None:  # T5: the relative position bias is part of the logits
        scores = scores + position_bias
    if softcap is not None:  # Gemma-2 style logit soft-capping is part of the logits
        scores = torch.tanh(scores / softcap) * softcap
    # float32 at least (float64 models keep their precision, which gradient checks need); the
    # mask is added in that dtype too: in float16, a score plus the mask's minimum overflows
    # to -inf, and a row with no allowed key would become NaN instead of what float32 gives
    wide = torch.promote_types(scores.dtype, torch.float32)
    logits, allowed = scores.to(wide), None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]
        if mask.dtype == torch.bool:
            allowed, bias = mask, torch.zeros((), dtype=wide, device=mask.device)
        else:  # additive: 0 (or a finite bias) where allowed, the mask dtype's minimum where not
            allowed, bias = mask > torch.finfo(mask.dtype).min / 2, mask.to(wide)
        # masked entries get the minimum of the softmax's dtype, whatever the mask's dtype, so that
        # they vanish (and a row with no allowed key is uniform) in bfloat16 and float16 as in float32
        logits = logits + torch.where(allowed, bias, torch.finfo(wide).min)
    probs_wide = torch.softmax(logits, dim=-1)
    del logits
    probs32 = probs_wide.float()
    probs = probs_wide.to(query.dtype)

    record = _ACTIVE.get()
    if record is not None:
        # the mask is shared by the heads (dim 1 has size 1); a per-head mask counts as allowed
        # where any head may attend
        allowed = None if allowed is None else allowed.any(dim=1).expand(query.shape[0], -1, -1)
        n_kv = int(query.shape[1] // n_rep)
        scores32 = scores.detach().float()
        if record.sink is not None:
            record.sink(LayerAttention(len(record.modules), module, scores32, probs32.detach(), allowed, n_kv))
        else:
            record.scores.append(scores32)
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


def _attention_configs(model) -> dict[int, object]:
    """id -> config of every config whose `_attn_implementation` decides how part of `model` attends:
    the model's own, its sub-configs at any depth (a composite model's text and vision towers) and
    the config of every transformers sub-model, as `set_attn_implementation` visits them."""
    from transformers import PreTrainedModel

    found: dict[int, object] = {}
    todo = [model.config] + [m.config for m in model.modules() if isinstance(m, PreTrainedModel)]
    while todo:
        config = todo.pop()
        if id(config) in found:
            continue
        found[id(config)] = config
        todo += [sub for key in getattr(config, "sub_configs", {}) if (sub := getattr(config, key, None)) is not None]
    return found


@contextlib.contextmanager
def recording_installed(model) -> Iterator[object]:
    """Within the block, `model` attends through the recording attention, whatever implementation
    it was loaded with; on leaving, also on an error, it gets its own implementation back.

    A model the user loaded (`from_pretrained(..., attn_implementation="sdpa")`, a model built
    from a config) can then be recorded like one of `load_hf`'s (`hf_attention`,
    `hf_attention_stream`, `oattn_lib.api.extract`). The recording attention computes what eager
    attention computes (`recording_attention_forward`), so inside the block the model's outputs
    are its eager outputs.

    The switch is transformers' own `model.set_attn_implementation(ATTN_IMPLEMENTATION)`, which
    sets the model's config, its sub-configs at any depth and the config of every sub-model (a
    composite model's towers). Before it, the implementation of each of those configs is noted,
    and on leaving each is written back as it was, the field `set_attn_implementation` itself
    writes: a composite model whose towers attended differently (say, eager text and sdpa
    vision) comes back exactly so, which one call of `set_attn_implementation` with a single
    name could not do. A model already set to the recording attention (`load_hf`) is left as it
    is.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A loaded model whose attention dispatches through transformers' `AttentionInterface`.

    Yields
    ------
    model
        The same model, switched.

    Raises
    ------
    ValueError
        `model` does not dispatch its attention through the `AttentionInterface`
        (`supports_attention_interface`), or the switch did not take; the message names its class.
    """
    name = type(model).__name__
    if not supports_attention_interface(model) or not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"model: {name} does not dispatch its attention through transformers' "
                         "AttentionInterface, so its scores cannot be recorded; load it with "
                         "attn_implementation='eager' and read the probabilities with hf_attention")
    configs = _attention_configs(model)
    before = {key: config._attn_implementation for key, config in configs.items()}
    try:
        model.set_attn_implementation(register_recording_attention())
        if attn_implementation(model) != ATTN_IMPLEMENTATION:
            raise ValueError(f"model: {name} kept attention implementation {attn_implementation(model)!r} after "
                             f"set_attn_implementation({ATTN_IMPLEMENTATION!r})")
        yield model
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = before[key]


# --------------------------------------------------------------------------- loading

COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                  "float64": torch.float64}
"""The dtypes a model can be loaded in for extraction (`load_hf(dtype=...)`), by name."""


def compute_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a compute dtype given by name ("bfloat16") or as a torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in COMPUTE_DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in COMPUTE_DTYPES:
        return COMPUTE_DTYPES[dtype]
    raise ValueError(f"compute_dtype: {dtype!r} is not a compute dtype; allowed: {', '.join(COMPUTE_DTYPES)}")


def _map_devices(device_map) -> set[str]:
    """Device types a `device_map` names ("auto" and the like: cuda when there is a GPU)."""
    if isinstance(device_map, str) and device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        return {"cuda"} if torch.cuda.is_available() else {"cpu"}
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    return {"cuda" if isinstance(v, int) else "disk" if v == "disk" else torch.device(v).type for v in values}


def model_devices(model) -> set[torch.device]:
    """The devices a loaded model's parameters are on (several with a `device_map`)."""
    return {p.device for p in model.parameters()}


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within the block, transformers parses each GGUF file once and builds each tensor-name map
    once, however many times it asks.

    Loading a model from a GGUF file, transformers reads the file's every metadata field (the
    whole vocabulary, one string at a time: `gguf.GGUFReader`) for the config, again for the
    tokenizer and again for the weights, and builds gguf's tensor-name map of the architecture
    (`gguf.get_tensor_name_map`) for every submodule of the model. Both are pure functions of
    their arguments (the reader maps the file read-only and is only read), so the block keeps
    the readers per file and mode and the maps per architecture and block count, by replacing
    the two names on the `gguf` module, which transformers imports them from at each call; they
    are restored on leaving. The repeated parses are a large part of a GGUF model's load
    (bench/gguf_load.py measures it; bench/gguf_load.csv records it)."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers, maps = {}, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    def tensor_name_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = name_map(arch, n_blocks)
        return maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, tensor_name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


@contextlib.contextmanager
def gguf_parses() -> Iterator[list[str]]:
    """Within the block, the path of every GGUF file parsed (each `gguf.GGUFReader` made) is
    appended to the list it yields: what a load costs in parses (bench/gguf_load.py, and the
    tests of `gguf_parsed_once`, whose kept readers are made through it)."""
    import gguf

    parsed, reader_class = [], gguf.GGUFReader

    class Counted(reader_class):
        def __init__(self, path, *args, **kwargs):
            parsed.append(str(path))
            super().__init__(path, *args, **kwargs)

    gguf.GGUFReader = Counted
    try:
        yield parsed
    finally:
        gguf.GGUFReader = reader_class


def load_hf(path_or_name: str, device: str | torch.device | None = None, dtype: str | torch.dtype = torch.float32,
            local_files_only: bool | None = None, causal_lm: bool = False, *, gguf_file: str | None = None,
            device_map: str | dict | None = None):
    """Load a transformers model and its tokenizer for attention extraction, in eval mode.

    `path_or_name` is a local directory, a hub name already in the local cache, or an alias:
    `minilm` (see `minilm_path`) or `smollm2` (see `models.files.smollm2_path`, a GGUF
    file). `gguf_file` names a GGUF file in that directory (or hub repository), which
    transformers dequantises to `dtype`, reading the file once (`gguf_parsed_once`; the
    workflow's `prepare_model` rule does it once per run). `causal_lm=True` loads the model with its language
    modelling head (`AutoModelForCausalLM`, for next-token scores) instead of the bare
    model (`AutoModel`); the attention is recorded the same way.
    `local_files_only=None` means: only local files when the path is a directory or
    HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set.

    `dtype` (a torch dtype or its name, `COMPUTE_DTYPES`) is the compute dtype: the weights
    are loaded, and the forward pass runs, in it. Half precision halves the model's memory
    (a 7B model: 28 GB in float32, 14 GB in bfloat16); the recorded scores and
    probabilities are float32 either way, the probabilities a float32 softmax of the
    model's logits (`recording_attention_forward`). float16 runs on a GPU only (its CPU
    kernels are slow and overflow-prone): ValueError on the CPU; use bfloat16 there.

    `device` (default "cpu") moves the whole model to one device. `device_map` ("auto", or
    a dict from module names to devices, as accelerate takes it) instead spreads the layers
    of a model too large for one device over the GPUs (and the CPU), as transformers'
    `from_pretrained(device_map=...)` does; give one of the two. `hf_attention` and
    `hf_attention_stream` cope with layers on several devices (each layer's attention is
    moved to the CPU as it is recorded). With "auto" on a machine without a GPU every layer
    is on the CPU and the attention is that of the plain load.

    Models that dispatch through the `AttentionInterface` get the recording attention
    (scores and probabilities); others get plain eager attention (probabilities only).
    Returns (model, tokenizer).
    """
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise ValueError(f"path_or_name: expected a path or model name, got {type(path_or_name).__name__}")
    dtype = compute_dtype(dtype)
    if device is not None and device_map is not None:
        raise ValueError(f"device and device_map: give one, got device={device!r} and device_map={device_map!r}")
    if device_map is not None and not isinstance(device_map, (str, dict)):
        raise ValueError(f"device_map: expected 'auto' or a dict of module names to devices, got "
                         f"{type(device_map).__name__}")
    placed = {torch.device(device or "cpu").type} if device_map is None else _map_devices(device_map)
    if dtype == torch.float16 and placed & {"cpu", "disk"}:
        raise ValueError(f"compute_dtype: float16 runs on a GPU only, and this model would run on "
                         f"{', '.join(sorted(placed))}; use bfloat16 (or float32) on the CPU")
    path_or_name, gguf_file = resolve_hf(str(path_or_name), gguf_file)
    if local_files_only is None:
        local_files_only = Path(path_or_name).is_dir() or is_offline()
    with gguf_parsed_once() if gguf_file else contextlib.nullcontext():
        return _load_hf(path_or_name, gguf_file, device, device_map, dtype, local_files_only, causal_lm)


def _load_hf(path_or_name, gguf_file, device, device_map, dtype, local_files_only, causal_lm):
    """`load_hf` on checked arguments."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

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
    if device_map is not None:
        extra["device_map"] = device_map
    model = auto.from_pretrained(path_or_name, config=config, attn_implementation=attn, dtype=dtype,
                                 local_files_only=local_files_only, **extra)
    if attn != "eager" and not supports_attention_interface(model):
        model.set_attn_implementation("eager")
    if device_map is None:
        model.to(device or "cpu")
    elif dtype == torch.float16 and ({str(v) for v in getattr(model, "hf_device_map", {}).values()} & {"cpu", "disk"}
                                     or any(d.type == "cpu" for d in model_devices(model))):
        raise ValueError("compute_dtype: float16 runs on a GPU only, and device_map placed some layers on the "
                         f"CPU ({getattr(model, 'hf_device_map', None)}); use bfloat16, or give the GPUs room")
    model.eval()

    return model, load_tokenizer(path_or_name, gguf_file, local_files_only=local_files_only)


def load_tokenizer(path_or_name: str, gguf_file: str | None = None, *, local_files_only: bool | None = None):
    """The tokenizer of a model (a directory, an alias, a hub id, or `gguf_file` in a directory),
    without its weights; a pad token where it has none (the end-of-sequence token)."""
    from transformers import AutoTokenizer

    path_or_name, gguf_file = resolve_hf(str(path_or_name), gguf_file)
    if local_files_only is None:
        local_files_only = Path(path_or_name).is_dir() or is_offline()
    tokenizer = AutoTokenizer.from_pretrained(path_or_name, local_files_only=local_files_only,
                                              **({"gguf_file": gguf_file} if gguf_file else {}))
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # decoder-only tokenizers ship without one
    return tokenizer


# --------------------------------------------------------------------------- extraction

def attn_implementation(model) -> str | None:
    """The attention implementation a loaded transformers model dispatches to (or None)."""
    impl = getattr(model.config, "_attn_implementation", None)
    return impl if isinstance(impl, str) or impl is None else next(iter(impl.values()), None)


def _check_texts(texts, max_length: int, name: str = "texts") -> None:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError(f"{name}: expected a non-empty list of strings, got {type(texts).__name__}"
                         + (f" of length {len(texts)}" if isinstance(texts, (list, tuple)) else ""))
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"{name}: entry {bad[0]} is a {type(texts[bad[0]]).__name__}, not a string")
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


def _stacked(calls: list[LayerAttention]) -> dict:
    """scores, probs (batch, layer, head, query, key), allowed (batch, layer, query, key; all True
    where a call had no mask) and kv_group (layer, head) of calls of one shape, on the CPU."""
    shapes = {tuple(c.probs.shape) for c in calls}
    if len(shapes) > 1:
        raise RuntimeError(f"attention calls of different shapes {sorted(shapes)} (hybrid layers?); stack the "
                           "calls of `hf_attention_stream` yourself")
    b, h, nq, nk = calls[0].probs.shape
    return {"scores": torch.stack([c.scores.cpu() for c in calls], dim=1),
            "probs": torch.stack([c.probs.cpu() for c in calls], dim=1),
            "allowed": torch.stack([torch.ones(b, nq, nk, dtype=torch.bool) if c.allowed is None else c.allowed.cpu()
                                    for c in calls], dim=1),
            "kv_group": np.stack([kv_groups(h, c.n_kv_heads) for c in calls])}


def _is_seq2seq(model) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


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

    All tensors are on the CPU (each layer is moved there as it is recorded, so a model
    spread over several devices works too), float32 whatever the model's compute dtype.
    Every layer is held in memory at once: for long inputs use `hf_attention_stream`.
    Encoder-decoder models: `hf_seq2seq_attention`.
    """
    if _is_seq2seq(model):
        raise ValueError(f"model: {type(model).__name__} is an encoder-decoder model; use hf_seq2seq_attention "
                         "(a source and a target text)")
    enc = hf_encode(model, tokenizer, texts, max_length)
    impl = attn_implementation(model)
    if impl == ATTN_IMPLEMENTATION:
        calls: list[LayerAttention] = []
        hf_attention_stream(model, enc, calls.append, to_cpu=True)
        out = _stacked(calls)
    elif impl == "eager":
        with torch.no_grad():
            res = model(**enc, output_attentions=True)
        if not getattr(res, "attentions", None):
            raise RuntimeError(f"{type(model).__name__} returned no attentions with output_attentions=True")
        out = {"scores": None, "probs": torch.stack([a.float().cpu() for a in res.attentions], dim=1),
               "allowed": None, "kv_group": None}
    else:
        raise _no_weights(impl)
    return {**out, **_inputs(enc, tokenizer)}


STACKS = ("encoder", "decoder", "cross")
"""The attention of an encoder-decoder model: encoder self-attention, decoder (causal)
self-attention, and cross-attention (queries: decoder positions; keys: encoder positions)."""

# the decoder modules' names for cross-attention (T5, BART and its kin, BERT-style decoders), used
# when a module's forward does not say so through a `key_value_states` argument
_CROSS_NAMES = ("encoder_attn", "encdecattention", "crossattention", "cross_attn", "cross_attention")


def _stack_of(model) -> dict[int, str]:
    """id(module) -> "encoder" or "decoder" for every module of an encoder-decoder model's stacks."""
    encoder, decoder = model.get_encoder(), model.get_decoder()
    if encoder is model or decoder is model or encoder is decoder:
        raise ValueError(f"model: cannot find the encoder and decoder stacks of {type(model).__name__}")
    return {**{id(m): "decoder" for m in decoder.modules()}, **{id(m): "encoder" for m in encoder.modules()}}


@contextlib.contextmanager
def _cross_flags(decoder) -> Iterator[dict[int, bool]]:
    """id(module) -> whether its current call attends to the encoder's states, for the decoder
    modules whose forward takes `key_value_states` (T5, BART and their kin pass the encoder's
    states so to cross-attention, and nothing to self-attention): set by a forward pre-hook,
    so a decoder self-attention and a cross-attention are told apart whatever their names
    and sequence lengths."""
    import inspect

    flags: dict[int, bool] = {}
    handles = []

    def hook(module, args, kwargs, signature):
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = kwargs
        flags[id(module)] = bound.get("key_value_states") is not None

    for m in decoder.modules():
        try:
            signature = inspect.signature(m.forward)
        except (TypeError, ValueError):
            continue
        if "key_value_states" in signature.parameters:
            handles.append(m.register_forward_pre_hook(
                lambda mod, a, kw, sig=signature: hook(mod, a, kw, sig), with_kwargs=True))
    try:
        yield flags
    finally:
        for h in handles:
            h.remove()


def hf_attention_stream(model, inputs: dict, on_layer: Callable[[LayerAttention], None], *,
                        to_cpu: bool | None = None) -> int:
    """`hf_attention` one layer at a time: `on_layer(LayerAttention)` receives each attention
    call while the forward pass on `inputs` (`hf_encode`, or any keyword arguments of the
    model) runs: scores, probs, allowed and key/value heads of that layer (module
    docstring), and nothing is kept, so memory stays at about one layer. Returns the
    number of attention calls (layers). Needs the recording attention (`load_hf`).

    `to_cpu`: move each call's tensors to the CPU before `on_layer` sees them; None (the
    default) does so when the model's parameters are on more than one device (`load_hf`
    with a `device_map`), so that `on_layer` sees one device whatever layer it is given.

    Encoder-decoder models (`inputs` from `hf_seq2seq_encode`): each call's `stack` is
    "encoder", "decoder" (causal self-attention) or "cross" (queries: decoder positions,
    keys: encoder positions) and `layer` counts the calls of its stack; the encoder runs
    first, then each decoder layer's self-attention and cross-attention.
    """
    impl = attn_implementation(model)
    if impl != ATTN_IMPLEMENTATION:
        if impl == "eager":
            raise ValueError(f"model: {type(model).__name__} does not use transformers' AttentionInterface, so its "
                             "attention cannot be streamed; use hf_attention (probabilities only)")
        raise _no_weights(impl)
    if to_cpu is None:
        to_cpu = len({d for d in model_devices(model) if d.type != "meta"}) > 1
    stacks = _stack_of(model) if _is_seq2seq(model) else None
    names = {id(m): n for n, m in model.named_modules()} if stacks else {}
    counts: dict[str | None, int] = {}

    def sink(call: LayerAttention) -> None:
        stack = None
        if stacks is not None:
            stack = stacks.get(id(call.module))
            if stack is None:
                raise RuntimeError(f"attention call of {names.get(id(call.module), type(call.module).__name__)} is "
                                   "in neither the encoder nor the decoder")
            if stack == "decoder":
                cross = flags.get(id(call.module))
                if cross is None:
                    cross = names.get(id(call.module), "").rsplit(".", 1)[-1].lower() in _CROSS_NAMES
                stack = "cross" if cross else "decoder"
        layer = counts.get(stack, 0)
        counts[stack] = layer + 1
        tensors = {}
        if to_cpu:
            tensors = {"scores": call.scores.cpu(), "probs": call.probs.cpu(),
                       "allowed": None if call.allowed is None else call.allowed.cpu()}
        on_layer(replace(call, stack=stack, layer=layer, **tensors))

    if stacks is not None:
        inputs = {"use_cache": False, **inputs}  # no key/value cache: nothing is generated
    with torch.no_grad(), (_cross_flags(model.get_decoder()) if stacks else contextlib.nullcontext({})) as flags, \
            record_attention(sink=sink) as record:
        model(**inputs)
    if not record.modules:
        raise _no_dispatch(model)
    return len(record.modules)


def hf_seq2seq_encode(model, tokenizer, source_texts: list[str], target_texts: list[str],
                      max_length: int = 128) -> dict[str, torch.Tensor]:
    """The inputs of an encoder-decoder model for (source, target) pairs, on the model's device.

    Sources and targets are tokenized (each side together, truncated to `max_length` tokens,
    padded to the longest); the decoder reads the target as in training with teacher
    forcing: shifted right by one, after the model's `decoder_start_token_id`, so that
    decoder position i has seen the target tokens before i. Returns `input_ids`,
    `attention_mask` (batch, source) and `decoder_input_ids`, `decoder_attention_mask`
    (batch, target).
    """
    _check_texts(source_texts, max_length, "source_texts")
    _check_texts(target_texts, max_length, "target_texts")
    if len(source_texts) != len(target_texts):
        raise ValueError(f"target_texts: {len(target_texts)} targets for {len(source_texts)} source texts")
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(getattr(model, "generation_config", None), "decoder_start_token_id", None)
    if start is None:
        raise ValueError(f"model: {type(model).__name__} has no decoder_start_token_id in its config")
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else tokenizer.pad_token_id

    def tok(texts):
        return tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")

    src, tgt = tok(source_texts), tok(target_texts)
    ids, mask = tgt["input_ids"], tgt.get("attention_mask", torch.ones_like(tgt["input_ids"]))
    dec_ids = torch.full_like(ids, pad)
    dec_ids[:, 0], dec_ids[:, 1:] = start, ids[:, :-1]
    dec_mask = torch.ones_like(mask)
    dec_mask[:, 1:] = mask[:, :-1]
    enc = {"input_ids": src["input_ids"], "attention_mask": src.get("attention_mask", torch.ones_like(src["input_ids"])),
           "decoder_input_ids": dec_ids, "decoder_attention_mask": dec_mask}
    return {k: v.to(model.device) for k, v in enc.items()}


def hf_seq2seq_attention(model, tokenizer, source_texts: list[str], target_texts: list[str],
                         max_length: int = 128, *, inputs: dict | None = None) -> dict:
    """Attention of an encoder-decoder model (T5, BART, ...) for (source, target) pairs
    (docs/method.md §9.4), as three records, one per `STACKS` entry:

    - "encoder": self-attention of the encoder, query and key over the source;
    - "decoder": causal self-attention of the decoder over the (shifted) target;
    - "cross": cross-attention, a rectangular head: query = decoder positions, key =
      encoder positions; allowed everywhere except at padded source keys.

    Each is a dict like `hf_attention`'s: `scores`, `probs` (batch, layer, head, query,
    key) float32, `allowed` (batch, layer, query, key) bool and `kv_group` (layer, head);
    T5's relative position bias is part of its scores (`recording_attention_forward`).
    Models that do not dispatch through the `AttentionInterface` give the probabilities
    of `output_attentions` (eager) and None for the rest. The result also holds
    `input_ids`, `attention_mask`, `tokens` (source) and `decoder_input_ids`,
    `decoder_attention_mask`, `decoder_tokens` (the decoder's input, `hf_seq2seq_encode`),
    on the CPU. `inputs` replaces the tokenization: a dict of those four id and mask
    tensors (then `tokenizer` may be None, and the token strings are None).
    """
    if not _is_seq2seq(model):
        raise ValueError(f"model: {type(model).__name__} is not an encoder-decoder model; use hf_attention")
    if inputs is None:
        inputs = hf_seq2seq_encode(model, tokenizer, source_texts, target_texts, max_length)
    else:
        missing = [k for k in ("input_ids", "decoder_input_ids") if k not in inputs]
        if missing:
            raise ValueError(f"inputs: missing {', '.join(missing)}")
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
    impl = attn_implementation(model)
    if impl == ATTN_IMPLEMENTATION:
        calls: dict[str, list[LayerAttention]] = {s: [] for s in STACKS}
        hf_attention_stream(model, inputs, lambda c: calls[c.stack].append(c), to_cpu=True)
        empty = [s for s in STACKS if not calls[s]]
        if empty:
            raise RuntimeError(f"{type(model).__name__}: no {', '.join(empty)} attention was recorded")
        out = {s: _stacked(calls[s]) for s in STACKS}
    elif impl == "eager":
        with torch.no_grad():
            res = model(**inputs, output_attentions=True, use_cache=False)
        out = {}
        for s, field_ in zip(STACKS, ("encoder_attentions", "decoder_attentions", "cross_attentions")):
            att = getattr(res, field_, None)
            if not att:
                raise RuntimeError(f"{type(model).__name__} returned no {field_} with output_attentions=True")
            out[s] = {"scores": None, "probs": torch.stack([a.float().cpu() for a in att], dim=1),
                      "allowed": None, "kv_group": None}
    else:
        raise _no_weights(impl)

    def ids_and_tokens(ids, mask):
        ids = ids.cpu()
        mask = torch.ones_like(ids) if mask is None else mask.cpu()
        tokens = None if tokenizer is None else [tokenizer.convert_ids_to_tokens(r.tolist()) for r in ids]
        return ids, mask, tokens

    src = ids_and_tokens(inputs["input_ids"], inputs.get("attention_mask"))
    dec = ids_and_tokens(inputs["decoder_input_ids"], inputs.get("decoder_attention_mask"))
    return {**out, "input_ids": src[0], "attention_mask": src[1], "tokens": src[2],
            "decoder_input_ids": dec[0], "decoder_attention_mask": dec[1], "decoder_tokens": dec[2]}


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
