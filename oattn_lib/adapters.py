"""Attention from the tools users already run, as `oattn_lib.api.extract` returns it.

The attention of docs/method.md §9.1 and §9.4: one xarray Dataset per sample, laid out as an
attention store (§12.1), which goes straight into `api.organize`, `api.entropies` and the rest of
the API.

- `from_transformer_lens`: a TransformerLens `ActivationCache` of `HookedTransformer.run_with_cache`
  and its model; a batch with padding becomes one Dataset per row, each cut to its own tokens.
- `from_nnsight`: an nnsight model wrapping a Hugging Face model, run on a list of prompts.

Both tools are optional: `pip install 'oattn[lens]'` and `pip install 'oattn[nnsight]'`
bring them. Each function imports its tool when called and says which extra is missing.
"""
from __future__ import annotations

import importlib

import numpy as np
import xarray as xr

__all__ = ["from_transformer_lens", "from_nnsight"]

_HEAD_DIMS = ("layer", "head", "query", "key")


def _require(module: str, extra: str):
    """`module`, imported; ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is not installed; it comes with oattn's optional extra `{extra}`: "
                          f"pip install 'oattn[{extra}]'") from exc


# -- TransformerLens ---------------------------------------------------------------------------
def from_transformer_lens(cache, model, prompts_or_tokens=None, *, attention_mask=None) -> list[xr.Dataset]:
    """Scores and probabilities of every head from a TransformerLens run, one Dataset per sample.

    Laid out as `oattn_lib.api.extract` lays them out (docs/method.md §9.1).

    What TransformerLens holds, and what is taken from it. Its attention computes
    `s = softcap(q k^T / attn_scale)` (`calculate_attention_scores`, key/value heads repeated
    to the query heads for grouped-query attention; plus the ALiBi bias where the model uses
    it), then, for a causal model, replaces every entry outside the causal mask, the local
    window of a local layer and the keys the `attention_mask` marks as padding by -inf, and
    hooks the result as `hook_attn_scores`; `hook_pattern` is its softmax (NaN rows of fully
    masked padded queries set to 0). So `hook_attn_scores` holds the model's scores where the
    model may attend and nothing of them elsewhere. Here:

    - `probs` is `hook_pattern`;
    - `allowed` is rebuilt from the model, never read from the -inf entries: the causal mask
      (`cfg.attention_dir`), each layer's local window (`attn_type == "local"`,
      `cfg.window_size`), cut to the sample's own tokens;
    - `scores` is `hook_attn_scores` where allowed, and elsewhere the pre-mask scores
      recomputed by the layer's own `calculate_attention_scores` from the cached queries and
      keys that entered it (`hook_rot_q`, `hook_rot_k` for rotary models, `hook_q`,
      `hook_k` otherwise), plus the ALiBi bias. The recomputation is the forward pass's own
      code on its own inputs; it is checked against `hook_attn_scores` on every allowed
      entry, and the probabilities are checked to be exactly 0 at every entry not allowed, so a
      model that transforms its queries or keys after those hooks (QK norms of models without
      rotary embeddings, log-n scaling) or a run whose padding mask differs from the one given
      here is refused rather than recorded wrongly.

    Parameters
    ----------
    cache : transformer_lens.ActivationCache
        From `model.run_with_cache(...)`, with every layer's `hook_attn_scores`,
        `hook_pattern` and queries and keys (the defaults keep them all), batched or with the
        batch dimension removed.
    model : transformer_lens.HookedTransformer
        The model that made `cache` (TransformerLens 3; version 4 removed HookedTransformer,
        and the caches of its TransformerBridge are not read here).
    prompts_or_tokens : str, list of str, or int array of shape (batch, pos), optional
        What the model was run on: texts (tokenized with `model.to_tokens`, as `run_with_cache`
        tokenizes them by default) or the token ids. They give each sample's `token` and
        `token_text` coordinates and `prompt` attribute; None: ids -1 and empty texts.
    attention_mask : int or bool array of shape (batch, pos), optional
        1 at real tokens, 0 at padding, as given to `run_with_cache`. Default: TransformerLens'
        own (`utilities.get_attention_mask`, from the tokenizer's pad token and padding side)
        where the tokens and a tokenizer are known, else no padding. Each sample keeps its real
        tokens only, left or right padded.

    Returns
    -------
    list of xarray.Dataset
        One per batch row, in order, each with the sample's own number of tokens: `scores`,
        `probs` float32 (layer, head, query, key), `allowed` bool (layer, query, key);
        coordinates `layer`, `head`, `kv_group` (head: the key/value head of each query head),
        `query`, `key` (positions among the sample's tokens), `token`, `token_text` (query);
        attributes `model` (`cfg.model_name`), `kind` ("attention": computed elsewhere),
        `prompt`, `text`, `sample` (the batch row), `dtype`, `model_layers`, `model_heads`,
        `model_kv_heads`.

    Raises
    ------
    ValueError
        `model` is not a HookedTransformer, the cache lacks a hook named in the message, the
        tokens or mask do not fit the cache, a row has no real token, the model has attention
        sinks or relative position biases, or the checks above fail.
    ImportError
        transformer-lens is not installed (`pip install 'oattn[lens]'`).
    """
    _require("transformer_lens", "lens")
    import torch

    from .models.hf_recording import kv_groups

    cfg = getattr(model, "cfg", None)
    blocks = getattr(model, "blocks", None)
    if cfg is None or blocks is None or not all(hasattr(getattr(b, "attn", None), "calculate_attention_scores")
                                                for b in blocks):
        raise ValueError(f"model: expected the HookedTransformer (TransformerLens 3) that made the cache, got "
                         f"{type(model).__name__}")
    if getattr(cfg, "use_attention_sinks", False) or cfg.positional_embedding_type == "relative_positional_bias":
        raise ValueError(f"model: {cfg.model_name} has attention sinks or relative position biases, whose "
                         "softmax is not that of its scores alone; they are not read here")
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
    n_kv = int(cfg.n_key_value_heads or n_heads)
    q_hook, k_hook = ("hook_rot_q", "hook_rot_k") if cfg.positional_embedding_type == "rotary" else ("hook_q", "hook_k")
    hooks = (q_hook, k_hook, "hook_attn_scores", "hook_pattern")
    missing = [f"blocks.{l}.attn.{h}" for l in range(n_layers) for h in hooks
               if f"blocks.{l}.attn.{h}" not in cache.cache_dict]
    if missing:
        raise ValueError(f"cache: has no {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}; run "
                         f"run_with_cache without a names_filter that drops them")

    def cached(l: int, hook: str):
        x = cache.cache_dict[f"blocks.{l}.attn.{hook}"]
        return x if cache.has_batch_dim else x[None]

    batch, n = cached(0, "hook_pattern").shape[0], cached(0, "hook_pattern").shape[-1]
    if cached(0, "hook_pattern").shape[-2] != n:
        raise ValueError(f"cache: {cached(0, 'hook_pattern').shape[-2]} queries for {n} keys (a run with a key/value "
                         "cache); run the whole sequence at once")
    tokens, texts = _lens_tokens(model, prompts_or_tokens, batch, n)
    real = _lens_real(model, tokens, attention_mask, batch, n)

    # per layer: scores and probs (batch, head, query, key) float32 on the CPU and the mask (query, key),
    # in the batch's padded positions; each sample is cut to its own tokens below
    per_layer_scores, per_layer_probs, per_layer_allowed = [], [], []
    pos = torch.arange(n)
    for l in range(n_layers):
        attn = blocks[l].attn
        allowed = pos[None, :] <= pos[:, None] if cfg.attention_dir == "causal" else torch.ones(n, n, dtype=torch.bool)
        if getattr(attn, "attn_type", "global") == "local":
            allowed = allowed & (pos[None, :] > pos[:, None] - cfg.window_size)
        with torch.no_grad():
            q, k = cached(l, q_hook), cached(l, k_hook)
            pre = attn.calculate_attention_scores(q, k)  # (batch, head, query, key), before any mask
            if cfg.positional_embedding_type == "alibi":
                pre = pre + _alibi(attn, n_heads, n, pre.device).to(pre.dtype)
        dtype = pre.dtype  # the model's compute dtype, which the check's tolerance follows
        hooked, pattern = cached(l, "hook_attn_scores"), cached(l, "hook_pattern")
        pre, hooked, pattern = pre.float().cpu(), hooked.float().cpu(), pattern.float().cpu()
        _check_lens_layer(l, pre, hooked, pattern, allowed, real, dtype)
        # the model's own scores where it may attend, the recomputed ones where it may not
        per_layer_scores.append(torch.where(allowed, hooked, pre))
        per_layer_probs.append(pattern)
        per_layer_allowed.append(allowed)

    groups = kv_groups(n_heads, n_kv)
    tok = getattr(model, "tokenizer", None)
    out = []
    for b in range(batch):
        idx = torch.nonzero(real[b]).flatten()
        m = idx.numel()
        scores = np.stack([s[b][:, idx][:, :, idx].numpy() for s in per_layer_scores])
        probs = np.stack([p[b][:, idx][:, :, idx].numpy() for p in per_layer_probs])
        allowed = np.stack([a[idx][:, idx].numpy() for a in per_layer_allowed])
        if not np.isfinite(scores).all():
            layer, head = np.argwhere(~np.isfinite(scores))[0][:2]
            raise ValueError(f"cache: the scores of sample {b} have NaN or inf at layer {layer}, head {head}")
        if tokens is None:
            ids, token_text, text = np.full(m, -1, dtype=np.int64), [""] * m, ""
        else:
            ids = tokens[b][idx].numpy().astype(np.int64)
            token_text = tok.convert_ids_to_tokens(ids.tolist()) if tok is not None else [str(i) for i in ids]
            text = texts[b] if texts is not None else (tok.decode(ids.tolist()) if tok is not None else "")
        out.append(_dataset(scores, probs, allowed, np.arange(n_layers), groups, ids, token_text,
                            attrs={"model": str(cfg.model_name), "kind": "attention", "prompt": text, "text": text,
                                   "sample": b, "dtype": "float32", "model_layers": n_layers,
                                   "model_heads": n_heads, "model_kv_heads": n_kv}))
    return out


def _lens_tokens(model, prompts_or_tokens, batch: int, n: int):
    """(tokens (batch, pos) int64 on the CPU or None, the texts or None) of `prompts_or_tokens`,
    checked against the cache's (batch, pos)."""
    import torch

    texts = None
    if prompts_or_tokens is None:
        return None, None
    if isinstance(prompts_or_tokens, str) or (isinstance(prompts_or_tokens, (list, tuple)) and prompts_or_tokens
                                              and all(isinstance(p, str) for p in prompts_or_tokens)):
        texts = [prompts_or_tokens] if isinstance(prompts_or_tokens, str) else list(prompts_or_tokens)
        if getattr(model, "tokenizer", None) is None:
            raise ValueError("prompts_or_tokens: texts need the model's tokenizer, and this model has none; pass "
                             "the token ids")
        tokens = model.to_tokens(texts)
    else:
        ids = np.asarray(prompts_or_tokens.cpu() if hasattr(prompts_or_tokens, "cpu") else prompts_or_tokens)
        if not np.issubdtype(ids.dtype, np.integer) or ids.ndim not in (1, 2):
            raise ValueError(f"prompts_or_tokens: expected texts or integer token ids of shape (batch, pos), got "
                             f"{ids.dtype} of shape {ids.shape}")
        tokens = torch.from_numpy(ids)
    tokens = tokens.reshape(-1, tokens.shape[-1]).cpu().long()
    if tuple(tokens.shape) != (batch, n):
        raise ValueError(f"prompts_or_tokens: tokens of shape (batch, pos) {tuple(tokens.shape)}, the cache holds "
                         f"{(batch, n)}; pass the tokens the model was run on")
    return tokens, texts


def _lens_real(model, tokens, attention_mask, batch: int, n: int):
    """(batch, pos) bool, True at the real tokens of each row (`from_transformer_lens`)."""
    import torch

    if attention_mask is None:
        if tokens is None or getattr(model, "tokenizer", None) is None:
            return torch.ones(batch, n, dtype=torch.bool)
        from transformer_lens.utilities import get_attention_mask

        attention_mask = get_attention_mask(model.tokenizer, tokens, model.cfg.default_prepend_bos)
    mask = torch.as_tensor(np.asarray(attention_mask.cpu() if hasattr(attention_mask, "cpu") else attention_mask))
    mask = mask.reshape(-1, mask.shape[-1]) if mask.ndim == 1 else mask
    if tuple(mask.shape) != (batch, n):
        raise ValueError(f"attention_mask: shape {tuple(mask.shape)}, the cache holds (batch, pos) {(batch, n)}")
    real = mask.bool()
    empty = torch.nonzero(~real.any(dim=1)).flatten().tolist()
    if empty:
        raise ValueError(f"attention_mask: row {empty[0]} has no real token")
    return real


def _alibi(attn, n_heads: int, n: int, device):
    """The ALiBi bias (head, query, key) the layer added to its n x n scores: the one it keeps
    from the forward pass, sliced as the forward pass slices it."""
    bias = getattr(attn, "alibi", None)
    if not hasattr(bias, "shape") or bias.shape[-1] < n:
        from transformer_lens.components.abstract_attention import AbstractAttention

        bias = AbstractAttention.create_alibi_bias(n_heads, n, device)
    return bias[:, -n:, :n].to(device)


def _check_lens_layer(l: int, pre, hooked, pattern, allowed, real, dtype) -> None:
    """Refuse layer `l` unless the recomputed scores are the model's on every entry it may attend
    and its probabilities are 0 on every other entry, for the real queries (`from_transformer_lens`).
    pre, hooked, pattern: (batch, head, query, key) float32; allowed (query, key); real (batch, pos)."""
    import torch

    # where the model may attend: its mask, at real keys, for real queries
    may = (allowed[None] & real[:, None, :] & real[:, :, None])[:, None]
    # the recomputation runs the layer's code on its inputs; a tolerance for a recomputation on
    # another kernel, far below the change a missed transformation of q or k makes
    tol = 1e-3 if torch.finfo(dtype).bits >= 32 else 3e-2
    off = (pre - hooked).abs() > tol * (1 + hooked.abs())
    bad = torch.nonzero(may & (off | ~torch.isfinite(hooked)))
    if bad.numel():
        b, h, i, j = bad[0].tolist()
        raise ValueError(f"cache: layer {l}, head {h}: the scores recomputed from the cached queries and keys differ "
                         f"from hook_attn_scores at (sample {b}, query {i}, key {j}) ({float(pre[b, h, i, j]):.6g} vs "
                         f"{float(hooked[b, h, i, j]):.6g}): the model transforms them after the hooks, or masks "
                         "an entry its config allows")
    leak = torch.nonzero((~may & real[:, None, :, None]) & (pattern != 0))
    if leak.numel():
        b, h, i, j = leak[0].tolist()
        raise ValueError(f"cache: layer {l}, head {h}: sample {b}'s query at position {i} attends to position {j}, "
                         "which its causal mask or padding excludes; pass run_with_cache's attention_mask (the run "
                         "attended to padding, or the mask given here is not the run's)")


def _dataset(scores, probs, allowed, layers, groups, ids, token_text, attrs) -> xr.Dataset:
    """One sample as `api.extract` lays it out."""
    n = ids.size
    return xr.Dataset(
        {"scores": (_HEAD_DIMS, scores.astype(np.float32, copy=False)),
         "probs": (_HEAD_DIMS, probs.astype(np.float32, copy=False)),
         "allowed": (("layer", "query", "key"), allowed.astype(bool, copy=False))},
        coords={"layer": np.asarray(layers, dtype=np.int64), "head": np.arange(scores.shape[1], dtype=np.int64),
                "kv_group": ("head", np.asarray(groups, dtype=np.int64)),
                "query": np.arange(n), "key": np.arange(n), "token": ("query", ids.astype(np.int64)),
                "token_text": ("query", np.array(list(token_text), dtype=object))},
        attrs=attrs)


# -- nnsight -------------------------------------------------------------------------------------
def from_nnsight(model, prompts, *, tokenizer=None, max_length: int | None = None, chat: bool = False,
                 layers=None, heads=None) -> list[xr.Dataset]:
    """Scores and probabilities of every head of the Hugging Face model an nnsight model wraps.

    On each prompt: `oattn_lib.api.extract` on that model (docs/method.md §9.4).

    Why not a trace. nnsight serves the inputs and outputs of modules; the attention scores, the
    mask and the softmax are computed inside transformers' attention function, which is not a
    module, and an eager attention module hands back only its probabilities. So the wrapped
    transformers model is taken (`model.pipeline.model`, or the module an `nnsight.NNsight`
    wraps) and recorded as `api.extract` records any loaded model: its attention is switched to
    the recording attention for the call (`models.hf_recording.recording_installed`), which computes
    what eager attention computes and keeps the pre-mask scores, the model's own mask (causal,
    sliding window) and its softmax, and the model's implementation is restored after. The
    forward pass is the model's own, outside a trace: interventions and `model.edit()` edits
    are not applied. A model nnsight holds on the meta device (loaded without `dispatch=True`
    and not yet run) is dispatched first, as its first trace would do.

    Parameters
    ----------
    model : nnsight.LanguageModel, nnsight.TransformersModel or nnsight.NNsight
        Wrapping a transformers model whose attention dispatches through the `AttentionInterface`.
    prompts : list of str
        The texts, one sample each, each run alone and unpadded.
    tokenizer : transformers tokenizer, optional
        Default: the nnsight model's `tokenizer` (an `NNsight` of a bare module has none: give it).
    max_length : int, optional
        As in `oattn_lib.api.extract`.
    chat : bool, default False
        As in `oattn_lib.api.extract`.
    layers, heads : list of int, optional
        As in `oattn_lib.api.extract`.

    Returns
    -------
    list of xarray.Dataset
        `api.extract`'s, one per prompt.

    Raises
    ------
    ValueError
        `model` wraps no transformers model, there is no tokenizer, or `api.extract` refuses
        its arguments.
    ImportError
        nnsight is not installed (`pip install 'oattn[nnsight]'`).
    """
    nnsight = _require("nnsight", "nnsight")
    from transformers import PreTrainedModel

    from .api import extract

    if not isinstance(model, nnsight.Envoy):
        raise ValueError(f"model: expected an nnsight model (LanguageModel, TransformersModel, NNsight), got "
                         f"{type(model).__name__}")
    if callable(getattr(model, "dispatch", None)):
        model.dispatch()  # a model built on the meta device gets its weights, as a first trace would
    pipeline = getattr(model, "pipeline", None)
    net = getattr(pipeline, "model", None) if pipeline is not None else None
    if net is None:
        net = model._module  # the module a plain nnsight.NNsight wraps, which it exposes no other way
    if not isinstance(net, PreTrainedModel):
        raise ValueError(f"model: wraps a {type(net).__name__}, not a transformers model")
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(f"tokenizer: the nnsight model of {type(net).__name__} has no tokenizer; pass one")
    return extract((net, tok), prompts, max_length=max_length, chat=chat, layers=layers, heads=heads)
