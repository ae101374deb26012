"""Transformer-XL language model with attention capture (docs/method.md §9.2).

Written from the equations of Dai et al. 2019, "Transformer-XL: Attentive Language Models
Beyond a Fixed-Length Context" (arXiv 1901.02860), section 3:

- segment-level recurrence: layer l of the current segment attends over the
  concatenation [memory_l ; h_l], where memory_l is the (gradient-free) input of layer l
  for the previous tokens, kept for `mem_len` tokens;
- relative positional attention with learned global biases u (`r_w_bias`) and
  v (`r_r_bias`): for query position i and key position j,
  score(i, j) = [(q_i + u) . k_j  +  (q_i + v) . W_R R_{i-j}] / sqrt(d_head),
  the first term is AC (content), the second BD (position), R the sinusoid encoding of
  the distance i - j;
- a causal mask over memory + current segment: query i (absolute position M + i, with
  M memory tokens) sees keys j <= M + i.

BD is computed for every (query, key) pair by a single matrix product against the
encodings of the distances K-1, ..., -(T-1), followed by a relative shift (a strided view
that takes, for row i, the K columns starting at T-1-i). Distances are extended to the
negative side so that the pre-mask scores at future positions are well defined (the
sinusoid encoding of a negative distance) rather than the left-over entries of the
zero-pad shift of the reference implementation; the masked entries never reach the
softmax, so the model itself is unaffected.

Attention: `attention` = "softmax" (the above) or a Tensor Attention variant
(`oattn_lib.tensor_attention`; Zhang, "Deep Tensor Network"), which replaces the
softmax by a normalised T = A (B^T B) A^T in its causal prefix form (row i from positions
<= i of memory + segment; a "_tril" variant is the paper's non-causal masked form). A
tensor head uses the content term only, with query q + u: the relative-position term BD
has no factorisation through K^T K, so order reaches a tensor-attention model through
causality alone. `r_net` and `r_r_bias` are still created (unused) so that a seed gives
every attention variant the same initial weights.

Output layer: untied from the input embedding. With `cutoffs` the model uses
`torch.nn.AdaptiveLogSoftmaxWithLoss` (Grave et al. 2017) and an adaptive input
embedding with the same clusters; without them a plain linear softmax.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..tensor_attention import TensorAttention, parse_attention

__all__ = ["TXLConfig", "TXLOutput", "TransformerXL", "AdaptiveEmbedding", "causal_mask"]


@dataclass(frozen=True)
class TXLConfig:
    """Hyperparameters of a Transformer-XL language model.

    `d_head` is independent of `d_model` (the attention width is n_head * d_head).
    `attention`: "softmax" or a tensor-attention variant (`tensor_attention.parse_attention`);
    tensor heads allow neither attention dropout (`dropatt`) nor `same_length`.
    `cutoffs` empty = plain softmax over the vocabulary; otherwise the adaptive softmax
    and adaptive input clusters [0, c1), [c1, c2), ..., [c_last, n_token), with embedding
    width d_model // div_val**i for cluster i. `clamp_len` > 0 clamps the relative
    distances to [-clamp_len, clamp_len]. `same_length` makes every query attend to the
    same number (mem_len) of keys.
    """

    n_token: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 64
    d_head: int = 16
    d_inner: int = 256
    dropout: float = 0.1
    dropatt: float = 0.0
    tgt_len: int = 64
    mem_len: int = 64
    cutoffs: tuple[int, ...] = field(default_factory=tuple)
    div_val: int = 1
    pre_lnorm: bool = False
    clamp_len: int = -1
    same_length: bool = False
    attention: str = "softmax"

    def __post_init__(self):
        object.__setattr__(self, "cutoffs", tuple(int(c) for c in self.cutoffs))
        if parse_attention(self.attention) is not None:
            if self.dropatt:
                raise ValueError(f"dropatt: attention dropout needs the attention matrix, which "
                                 f"attention={self.attention!r} does not form; expected 0, got {self.dropatt!r}")
            if self.same_length:
                raise ValueError(f"same_length: not supported with attention={self.attention!r} "
                                 "(the prefix sums have no sliding window)")
        for name in ("n_token", "n_layer", "n_head", "d_model", "d_head", "d_inner", "tgt_len", "div_val"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        if not isinstance(self.mem_len, int) or self.mem_len < 0:
            raise ValueError(f"mem_len: expected a nonnegative integer, got {self.mem_len!r}")
        for name in ("dropout", "dropatt"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"{name}: expected a probability in [0, 1), got {v!r}")
        c = self.cutoffs
        if c and (list(c) != sorted(set(c)) or c[0] < 1 or c[-1] >= self.n_token):
            raise ValueError(f"cutoffs: expected strictly increasing integers in [1, n_token={self.n_token}), got {list(c)}")
        if c and self.d_model // self.div_val ** len(c) < 1:
            raise ValueError(f"div_val: d_model={self.d_model} // div_val**{len(c)} is 0 (div_val={self.div_val})")
        if self.same_length and self.mem_len == 0:
            raise ValueError("same_length: needs mem_len > 0 (every query sees mem_len keys)")

    @classmethod
    def tiny(cls, n_token: int, **overrides) -> "TXLConfig":
        """Default small setting: 4 layers x 4 heads, d_model 64, d_head 16, segments of 64."""
        return cls(n_token=n_token, **overrides)

    @classmethod
    def paper(cls, n_token: int = 267735, **overrides) -> "TXLConfig":
        """The paper's TXL on WikiText-103: 16 layers x 8 heads, d_model 410, context 256.

        The paper gives only layers, heads, d_model, context and the learning rate; the rest
        follows the WikiText-103 base model of Dai et al. (d_head 41, d_inner 2100, dropout
        0.1, adaptive softmax with cutoffs 20000/40000/200000, div_val 1). The cutoffs
        apply only when n_token > 200000 (WikiText-103 has 267735); pass `cutoffs=` to
        override. Any keyword overrides the preset.
        """
        base = dict(n_layer=16, n_head=8, d_model=410, d_head=41, d_inner=2100, dropout=0.1,
                    dropatt=0.0, tgt_len=256, mem_len=256,
                    cutoffs=(20000, 40000, 200000) if n_token > 200000 else (),
                    div_val=1)
        base.update(overrides)
        return cls(n_token=n_token, **base)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cutoffs"] = list(self.cutoffs)
        return d


class TXLOutput(NamedTuple):
    """Result of `TransformerXL.forward`.

    loss: mean negative log-likelihood (nats per token) when targets are given, else None.
    logits: (batch, tgt_len, n_token) log-probabilities when `return_logits`, else None.
    new_mems: (layer, batch, mem, d_model) memory for the next segment, None if mem_len 0.
    scores, probs: (batch, layer, head, query, key) float32 when `return_attention`:
    scores = (AC + BD) / sqrt(d_head) before any mask; probs = the softmax the model
    used (mask included, masked entries exactly 0, before attention dropout). For a
    tensor-attention model, probs = the normalised T the values are multiplied by (causal
    mask included) and scores = its raw kernel before normalisation and mask
    (`tensor_attention` module docstring).
    """

    loss: torch.Tensor | None
    logits: torch.Tensor | None
    new_mems: torch.Tensor | None
    scores: torch.Tensor | None = None
    probs: torch.Tensor | None = None


def causal_mask(tgt_len: int, n_mem: int, mem_len: int = 0, same_length: bool = False,
                device=None) -> torch.Tensor:
    """Boolean (query, key) mask, True where attention is forbidden.

    Query i is at absolute position n_mem + i; key j at absolute position j. Forbidden:
    j > n_mem + i (future); with `same_length` also j <= n_mem + i - mem_len.
    """
    i = torch.arange(tgt_len, device=device)[:, None] + n_mem
    j = torch.arange(n_mem + tgt_len, device=device)[None, :]
    mask = j > i
    if same_length:
        mask = mask | (j <= i - mem_len)
    return mask


def sinusoid_encoding(pos: torch.Tensor, d_model: int) -> torch.Tensor:
    """(len, d_model) encodings [sin(pos * f), cos(pos * f)], f = 10000^(-2k/d_model)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=pos.device) / d_model))
    ang = pos.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    enc = torch.cat([ang.sin(), ang.cos()], dim=-1)
    return enc[:, :d_model]


def rel_shift(x: torch.Tensor, n_key: int) -> torch.Tensor:
    """(…, T, K + T - 1) scores against distances K-1..-(T-1) -> (…, T, K) per key.

    Row i of the result takes the columns T-1-i .. T-1-i+K-1 of row i of `x`: in the
    flattened row-major layout that is a view with offset T-1 and row stride L-1.
    """
    T, L = x.shape[-2], x.shape[-1]
    if T == 1:  # one query: no shift, and the view below would be one column short
        return x[..., :n_key]
    flat = x.reshape(*x.shape[:-2], T * L)
    return flat[..., T - 1: T - 1 + T * (L - 1)].reshape(*x.shape[:-2], T, L - 1)[..., :n_key]


class AdaptiveEmbedding(nn.Module):
    """Word embedding scaled by sqrt(d_model); adaptive input (Baevski & Auli) with cutoffs.

    With div_val 1 one table of width d_model; otherwise cluster i has width
    d_model // div_val**i and a linear projection to d_model.
    """

    def __init__(self, n_token: int, d_model: int, cutoffs=(), div_val: int = 1):
        super().__init__()
        self.n_token, self.d_model, self.div_val = n_token, d_model, div_val
        self.bounds = [0, *cutoffs, n_token]
        self.scale = d_model ** 0.5
        if div_val == 1:
            self.tables = nn.ModuleList([nn.Embedding(n_token, d_model)])
            self.projs = nn.ModuleList()
        else:
            dims = [d_model // div_val ** i for i in range(len(self.bounds) - 1)]
            self.tables = nn.ModuleList(nn.Embedding(hi - lo, d)
                                        for lo, hi, d in zip(self.bounds[:-1], self.bounds[1:], dims))
            self.projs = nn.ModuleList(nn.Linear(d, d_model, bias=False) for d in dims)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:
            return self.tables[0](tokens) * self.scale
        flat = tokens.reshape(-1)
        out = flat.new_zeros((flat.numel(), self.d_model), dtype=self.projs[0].weight.dtype)
        for c, (lo, hi) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            idx = ((flat >= lo) & (flat < hi)).nonzero(as_tuple=True)[0]
            if idx.numel():
                out = out.index_copy(0, idx, self.projs[c](self.tables[c](flat[idx] - lo)))
        return out.reshape(*tokens.shape, self.d_model) * self.scale


class RelMultiHeadAttention(nn.Module):
    """Relative positional multi-head attention with u/v biases (Dai et al. 2019, eq. in 3.3),
    or, with cfg.attention a tensor variant, causal tensor attention with query q + u.

    The input of `o_net` is (batch, query, head * d_head), head-major, for every variant.
    """

    def __init__(self, cfg: TXLConfig):
        super().__init__()
        h, dh, d = cfg.n_head, cfg.d_head, cfg.d_model
        self.n_head, self.d_head, self.pre_lnorm = h, dh, cfg.pre_lnorm
        self.scale = 1.0 / math.sqrt(dh)
        self.qkv_net = nn.Linear(d, 3 * h * dh, bias=False)
        self.r_net = nn.Linear(d, h * dh, bias=False)
        self.o_net = nn.Linear(h * dh, d, bias=False)
        self.r_w_bias = nn.Parameter(torch.zeros(h, dh))  # u
        self.r_r_bias = nn.Parameter(torch.zeros(h, dh))  # v
        self.drop = nn.Dropout(cfg.dropout)
        self.dropatt = nn.Dropout(cfg.dropatt)
        self.layer_norm = nn.LayerNorm(d)
        spec = parse_attention(cfg.attention)
        self.tensor = None if spec is None else TensorAttention(spec)

    def forward(self, h: torch.Tensor, r: torch.Tensor, mask: torch.Tensor, mem: torch.Tensor | None,
                need_weights: bool = True):
        """h (B, T, d), r (K+T-1, d) encodings of distances K-1..-(T-1), mask (T, K), mem (B, M, d).

        Returns (output, scores, probs); a tensor-attention layer returns None for scores
        and probs unless `need_weights` (its linear form never forms them).
        """
        B, T, _ = h.shape
        cat = h if mem is None else torch.cat([mem, h], dim=1)
        K = cat.shape[1]
        x = self.layer_norm(cat) if self.pre_lnorm else cat
        w_heads = self.qkv_net(x)
        q, k, v = w_heads.chunk(3, dim=-1)
        if self.tensor is not None:
            return self._tensor_forward(h, q, k, v, need_weights)
        q = q[:, -T:].reshape(B, T, self.n_head, self.d_head)
        k = k.reshape(B, K, self.n_head, self.d_head)
        v = v.reshape(B, K, self.n_head, self.d_head)
        r_k = self.r_net(r).reshape(-1, self.n_head, self.d_head)

        ac = torch.einsum("bihd,bjhd->bhij", q + self.r_w_bias, k)
        bd = rel_shift(torch.einsum("bihd,jhd->bhij", q + self.r_r_bias, r_k), K)
        scores = (ac + bd) * self.scale
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)

        attn = torch.einsum("bhij,bjhd->bihd", self.dropatt(probs), v).reshape(B, T, -1)
        out = self.drop(self.o_net(attn))
        out = h + out if self.pre_lnorm else self.layer_norm(h + out)
        return out, scores, probs

    def _tensor_forward(self, h, q, k, v, need_weights):
        # every position of memory + segment has a query: the prefix sums run over all K
        # positions and the segment's T rows are kept (row i sees positions <= M + i)
        B, T, _ = h.shape
        q, k, v = (t.reshape(B, -1, self.n_head, self.d_head).transpose(1, 2) for t in (q, k, v))
        out, scores, probs = self.tensor(q + self.r_w_bias[:, None], k, v, causal=True,
                                         need_weights=need_weights)
        attn = out[:, :, -T:].transpose(1, 2).reshape(B, T, -1)
        out = self.drop(self.o_net(attn))
        out = h + out if self.pre_lnorm else self.layer_norm(h + out)
        if scores is not None:
            scores, probs = scores[:, :, -T:], probs[:, :, -T:]
        return out, scores, probs


class PositionwiseFF(nn.Module):
    def __init__(self, cfg: TXLConfig):
        super().__init__()
        self.pre_lnorm = cfg.pre_lnorm
        self.net = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_inner), nn.ReLU(inplace=True),
                                 nn.Dropout(cfg.dropout), nn.Linear(cfg.d_inner, cfg.d_model),
                                 nn.Dropout(cfg.dropout))
        self.layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x):
        if self.pre_lnorm:
            return x + self.net(self.layer_norm(x))
        return self.layer_norm(x + self.net(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TXLConfig):
        super().__init__()
        self.attn = RelMultiHeadAttention(cfg)
        self.ff = PositionwiseFF(cfg)

    def forward(self, h, r, mask, mem, need_weights: bool = True):
        out, scores, probs = self.attn(h, r, mask, mem, need_weights=need_weights)
        return self.ff(out), scores, probs


class TransformerXL(nn.Module):
    """Transformer-XL language model (Dai et al. 2019) with attention capture (docs/method.md §9.2).

    `seed`, when given, makes the parameter initialisation reproducible without touching
    the global random state.
    """

    def __init__(self, config: TXLConfig, seed: int | None = None):
        super().__init__()
        if not isinstance(config, TXLConfig):
            raise ValueError(f"config: expected a TXLConfig, got {type(config).__name__}")
        self.config = cfg = config
        # build and initialise under a forked RNG so a given seed leaves the caller's state alone
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.word_emb = AdaptiveEmbedding(cfg.n_token, cfg.d_model, cfg.cutoffs, cfg.div_val)
            self.drop = nn.Dropout(cfg.dropout)
            self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layer))
            if cfg.cutoffs:
                self.crit = nn.AdaptiveLogSoftmaxWithLoss(cfg.d_model, cfg.n_token, list(cfg.cutoffs),
                                                          div_value=float(cfg.div_val))
            else:
                self.crit = nn.Linear(cfg.d_model, cfg.n_token)
            self._init_weights()

    def _init_weights(self, std: float = 0.02):
        for name, p in self.named_parameters():
            if "layer_norm" in name:
                continue
            if name.endswith("bias") and p.ndim == 1:
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    def init_mems(self):
        return None

    def _positions(self, T: int, K: int, device) -> torch.Tensor:
        pos = torch.arange(K - 1, -T, -1, device=device)
        if self.config.clamp_len > 0:
            pos = pos.clamp(-self.config.clamp_len, self.config.clamp_len)
        return pos

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                mems: torch.Tensor | None = None, *, return_attention: bool = False,
                return_logits: bool = False, mem_len: int | None = None) -> TXLOutput:
        """Run one segment.

        tokens: (batch, tgt_len) long; targets: same shape or None; mems: the `new_mems` of
        the previous segment, (layer, batch, mem, d_model), or None for an empty memory.
        mem_len overrides config.mem_len (how many tokens of memory to keep).
        """
        cfg = self.config
        mem_len = cfg.mem_len if mem_len is None else int(mem_len)
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens: expected a (batch, tgt_len) LongTensor, got "
                             f"{getattr(tokens, 'dtype', type(tokens).__name__)} shape {tuple(getattr(tokens, 'shape', ()))}")
        if tokens.numel() == 0:
            raise ValueError(f"tokens: empty, shape {tuple(tokens.shape)}")
        if targets is not None and (not isinstance(targets, torch.Tensor) or targets.shape != tokens.shape):
            raise ValueError(f"targets: expected shape {tuple(tokens.shape)}, got {tuple(getattr(targets, 'shape', ()))}")
        B, T = tokens.shape
        if mems is not None and mems.numel() == 0:
            mems = None
        if mems is not None and (mems.ndim != 4 or mems.shape[0] != cfg.n_layer or mems.shape[1] != B
                                 or mems.shape[3] != cfg.d_model):
            raise ValueError(f"mems: expected ({cfg.n_layer}, {B}, mem, {cfg.d_model}), got {tuple(mems.shape)}")
        M = 0 if mems is None else mems.shape[2]
        K = M + T

        h = self.drop(self.word_emb(tokens))
        r = self.drop(sinusoid_encoding(self._positions(T, K, tokens.device), cfg.d_model).to(h.dtype))
        mask = causal_mask(T, M, mem_len, cfg.same_length, device=tokens.device)

        layer_inputs, all_scores, all_probs = [], [], []
        for i, layer in enumerate(self.layers):
            layer_inputs.append(h)
            h, scores, probs = layer(h, r, mask, None if mems is None else mems[i],
                                     need_weights=return_attention)
            if return_attention:
                all_scores.append(scores.detach().float())
                all_probs.append(probs.detach().float())
        h = self.drop(h)

        new_mems = None
        if mem_len > 0:
            with torch.no_grad():
                stacked = torch.stack(layer_inputs)
                if mems is not None:
                    stacked = torch.cat([mems.to(stacked.dtype), stacked], dim=2)
                new_mems = stacked[:, :, -mem_len:].detach()

        flat = h.reshape(B * T, cfg.d_model)
        loss = logits = None
        if targets is not None:
            tgt = targets.reshape(-1)
            if cfg.cutoffs:
                loss = self.crit(flat, tgt).loss
            else:
                loss = F.cross_entropy(self.crit(flat), tgt)
        if return_logits:
            lp = self.crit.log_prob(flat) if cfg.cutoffs else F.log_softmax(self.crit(flat), dim=-1)
            logits = lp.reshape(B, T, cfg.n_token)
        if return_attention:
            return TXLOutput(loss, logits, new_mems, torch.stack(all_scores, 1), torch.stack(all_probs, 1))
        return TXLOutput(loss, logits, new_mems)
