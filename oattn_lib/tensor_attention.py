"""Tensor Attention: attention without a softmax (Zhang, "Deep Tensor Network", section 4).

A head with queries Q, keys K, values V (n x d) mixes the values with a positive
semi-definite matrix instead of a softmax:

    T_Q = (Q K^T)(Q K^T)^T = Q (K^T K) Q^T,      T_K = (Q K^T)^T (Q K^T) = K (Q^T Q) K^T,

output = normalise(T) V. Both are one bilinear form, T = A N A^T with N = B^T B:
(A, B) = (Q, K) for `tensor_q` and (K, Q) for `tensor_k`. The logits are scaled as a
softmax head's, S = Q K^T / sqrt(d), so T_Q = S S^T and T_K = S^T S.

Normalisations (names: ``tensor_{q,k}[_relu][_diag|_row][_tril]``):

- trace (default): T / tr(T), tr(T) = ||S||_F^2 = sum((K^T K) * (Q^T Q)) (paper 4.1.1);
- ``_diag``: diag(T)^-1 T, diag(T)_i = a_i^T N a_i (paper 4.1.5, Lemma 4.5);
- ``_row``: diag(T 1)^-1 T, the rows of T sum to one (paper 4.1.6; the row sums of T may
  have either sign);
- ``_relu``: ReLU(T) before the normalisation (paper 4.1.2; tr(ReLU(T)) = tr(T) since
  diag(T) >= 0). An elementwise function of T has no factorisation through N, so the
  ReLU variants exist in the quadratic form only.

Linear-time form: T V = A (N (A^T V)), O(n d^2) time and O(n d + d^2) memory; the
normalisers are O(n d^2) too. Quadratic reference form: T formed explicitly, O(n^2 d).

Causality. The paper's masked form (4.1.7), tril(T) / tr(T) (``_tril``), is not causal:
row i of tril(T) is q_i^T N q_j over j <= i, but N = sum over *all* l of k_l k_l^T and
tr(T) sum over all positions, so position i sees later keys through N and through tr(T).
It is kept as a documented option. The causal form used by a causal model
(``causal=True`` without ``_tril``) gives row i exactly what the paper's non-causal
attention gives the last token of the prefix x_1..x_i:

    out_i = a_i^T N_i S_i / den_i,   N_i = sum_{l<=i} b_l b_l^T,   S_i = sum_{j<=i} a_j v_j^T,

with den_i the trace of the prefix's T (tr T^(i) = sum(N_i * P_i), P_i = sum_{j<=i}
a_j a_j^T), its diagonal entry a_i^T N_i a_i, or its row sum a_i^T N_i sum_{j<=i} a_j. So
row i depends on positions <= i only. The linear-time causal form runs in chunks of C
positions: with N0, S0, P0 the sums over earlier chunks and G_i = N_i a_i =
N0 a_i + sum_{l<=i in chunk} (a_i . b_l) b_l, the numerator is G S0 + tril(G A_c^T) V_c and
tr T^(i) = sum(N0 * P0) + cumsum_i [b_i^T P_i b_i + a_i^T N_{i-1} a_i]; O(n C d + n d^2)
time, O(n C + (n / C) d^2) memory.

Attention maps for the analysis (docs/method.md §10.4): a tensor head's "probs" is the normalised T
the values are multiplied by (mask and ReLU included, masked entries exactly 0); its
"scores" is the raw kernel before normalisation, ReLU and mask: S S^T (T_Q), S^T S (T_K),
and for the causal form the row-i kernel a_i^T N_i a_j / d at every j, the analogue of a
softmax head's pre-mask logits.

Denominators are pushed away from zero by `eps` (default 1e-12, keeping their sign for
`_row`), so a zero query gives a zero output rather than NaN; eps is far below the
trace of any nonzero head, so it never changes the function being computed (the
entries of T are fourth powers of activations: tiny at initialisation).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TensorAttentionSpec", "parse_attention", "attention_names", "causal_variants",
           "tensor_attention", "tensor_attention_weights", "TensorAttention",
           "TensorMultiheadAttention"]

_NAME = re.compile(r"^tensor_(?P<side>[qk])(?P<relu>_relu)?(?:_(?P<norm>diag|row))?(?P<tril>_tril)?$")


@dataclass(frozen=True)
class TensorAttentionSpec:
    """One member of the Tensor Attention family.

    side: "q" (T_Q = Q K^T K Q^T) or "k" (T_K = K Q^T Q K^T); relu: ReLU(T) before the
    normalisation; norm: "trace", "diag" or "row"; tril: the paper's masked form
    tril(T) / tr(T) in a causal model (not causal, see the module docstring).
    """

    side: str = "q"
    relu: bool = False
    norm: str = "trace"
    tril: bool = False

    def __post_init__(self):
        if self.side not in ("q", "k"):
            raise ValueError(f"side: expected 'q' or 'k', got {self.side!r}")
        if self.norm not in ("trace", "diag", "row"):
            raise ValueError(f"norm: expected 'trace', 'diag' or 'row', got {self.norm!r}")

    @property
    def name(self) -> str:
        return (f"tensor_{self.side}{'_relu' if self.relu else ''}"
                f"{'' if self.norm == 'trace' else '_' + self.norm}{'_tril' if self.tril else ''}")

    @property
    def has_linear_form(self) -> bool:
        """Whether the O(n d^2) form exists (not for ReLU: it acts on T's entries)."""
        return not self.relu


def attention_names(tril: bool = True) -> tuple[str, ...]:
    """Every allowed `attention` value: "softmax" and the tensor variants (with or
    without the non-causal ``_tril`` ones)."""
    names = ["softmax"]
    for side in "qk":
        for relu in (False, True):
            for norm in ("trace", "diag", "row"):
                for t in ((False, True) if tril else (False,)):
                    names.append(TensorAttentionSpec(side, relu, norm, t).name)
    return tuple(names)


def causal_variants() -> tuple[str, ...]:
    """The tensor variants whose causal form is causal: every one but ``_tril``."""
    return tuple(n for n in attention_names(tril=False) if n != "softmax")


def parse_attention(name) -> TensorAttentionSpec | None:
    """`attention` name -> its spec; None for "softmax". Raises ValueError naming the
    allowed values for anything else."""
    if isinstance(name, TensorAttentionSpec):
        return name
    if name == "softmax":
        return None
    m = _NAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"attention: unknown variant {name!r}; allowed: 'softmax' or "
                         "tensor_{q,k}[_relu][_diag|_row][_tril], e.g. "
                         f"{', '.join(attention_names(tril=False)[:6])}")
    return TensorAttentionSpec(m["side"], bool(m["relu"]), m["norm"] or "trace", bool(m["tril"]))


# -- validation and the (A, B) of a variant ------------------------------------------------
def _spec(variant) -> TensorAttentionSpec:
    spec = parse_attention(variant)
    if spec is None:
        raise ValueError("variant: 'softmax' is not a tensor-attention variant")
    return spec


def _check_qkv(q, k, v=None):
    for name, t in (("q", q), ("k", k)) + ((("v", v),) if v is not None else ()):
        if not isinstance(t, torch.Tensor) or t.ndim < 2 or not t.is_floating_point():
            raise ValueError(f"{name}: expected a float tensor (..., n, d), got "
                             f"{getattr(t, 'dtype', type(t).__name__)} shape {tuple(getattr(t, 'shape', ()))}")
    if q.shape != k.shape:
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)} (tensor attention mixes the "
                         f"sequence with itself), got {tuple(k.shape)}")
    if v is not None and v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v: expected shape {tuple(q.shape[:-1])} + (e,), got {tuple(v.shape)}")


def _ab(q, k, spec):
    """(A, B) with T = A (B^T B) A^T, A scaled by 1/sqrt(d) so that T = S S^T or S^T S."""
    a, b = (q, k) if spec.side == "q" else (k, q)
    return a / math.sqrt(q.shape[-1]), b


def _guard(den: torch.Tensor, eps: float, signed: bool) -> torch.Tensor:
    if signed:
        return den + eps * torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    return den + eps


def _check_mode(spec, causal):
    if spec.tril and not causal:
        raise ValueError(f"variant: {spec.name!r} is the paper's masked form tril(T); it needs "
                         "causal=True (a causal model)")


# -- quadratic reference form ----------------------------------------------------------------
def tensor_attention_weights(q: torch.Tensor, k: torch.Tensor, variant, causal: bool = False,
                             eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """The quadratic reference form: (scores, probs), both (..., n, n).

    probs: the normalised T that multiplies the values (row i = weights of v_j in output
    i; mask and ReLU included); scores: the raw kernel before normalisation, ReLU and
    mask (see the module docstring). causal=True: the prefix form (row i from positions
    <= i), or for a ``_tril`` variant the paper's tril(T) / tr(T).
    """
    spec = _spec(variant)
    _check_qkv(q, k)
    _check_mode(spec, causal)
    a, b = _ab(q, k, spec)
    A = a @ b.transpose(-1, -2)                                # (..., n, n): a_i . b_l
    n = A.shape[-1]
    lower = torch.ones(n, n, dtype=torch.bool, device=A.device).tril()
    prefix = causal and not spec.tril
    if prefix:
        raw = A.masked_fill(~lower, 0) @ A.transpose(-1, -2)   # sum_{l<=i} A_il A_jl
    else:
        raw = A @ A.transpose(-1, -2)
    w = raw.clamp_min(0) if spec.relu else raw
    if causal:
        w = w.masked_fill(~lower, 0)
    if spec.norm == "trace":
        sq = A.square()
        if prefix:   # trace of the prefix's T: sum of A^2 over the leading (i+1) x (i+1) block
            den = sq.cumsum(-1).cumsum(-2).diagonal(dim1=-2, dim2=-1)
        else:
            den = sq.sum((-2, -1))[..., None].expand(*A.shape[:-1])
    elif spec.norm == "diag":
        den = raw.diagonal(dim1=-2, dim2=-1)
    else:
        den = w.sum(-1)
    probs = w / _guard(den, eps, signed=spec.norm == "row" and not spec.relu)[..., None]
    return raw, probs


# -- linear-time forms -------------------------------------------------------------------
def _chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    n = x.shape[-2]
    pad = (-n) % c
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(*x.shape[:-2], x.shape[-2] // c, c, x.shape[-1])


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.cumsum(dim) - x


def _linear_full(a, b, v, spec, eps):
    N = b.transpose(-1, -2) @ b                                # K^T K (d, d)
    G = a @ N                                                   # rows N a_i
    num = G @ (a.transpose(-1, -2) @ v)                         # A (N (A^T V))
    if spec.norm == "trace":
        den = (N * (a.transpose(-1, -2) @ a)).sum((-2, -1))[..., None, None]
    elif spec.norm == "diag":
        den = (G * a).sum(-1, keepdim=True)
    else:
        den = G @ a.sum(-2)[..., None]
    return num / _guard(den, eps, signed=spec.norm == "row")


def _linear_masked(a, b, v, spec, eps, chunk_size):
    """Causal prefix form (or the paper's tril form) in chunks of `chunk_size` positions."""
    n = a.shape[-2]
    C = max(1, min(int(chunk_size), n))
    if spec.norm == "row":  # row sums of the masked T = the numerator of a ones column
        v = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], -1)
    ac, bc, vc = _chunks(a, C), _chunks(b, C), _chunks(v, C)  # (..., c, C, .)
    lower = torch.ones(C, C, dtype=torch.bool, device=a.device).tril()
    S0 = _exclusive_cumsum(ac.transpose(-1, -2) @ vc, -3)     # sum_{j < chunk} a_j v_j^T
    if spec.tril:                                               # one global N for every row
        N = b.transpose(-1, -2) @ b
        G = ac @ N[..., None, :, :]
        Ac = None
    else:
        dN = bc.transpose(-1, -2) @ bc
        N0 = _exclusive_cumsum(dN, -3)                          # sum_{l < chunk} b_l b_l^T
        Ac = ac @ bc.transpose(-1, -2)                          # (..., c, C, C): a_i . b_l
        G = ac @ N0 + Ac.masked_fill(~lower, 0) @ bc            # N_i a_i
    num = G @ S0 + (G @ ac.transpose(-1, -2)).masked_fill(~lower, 0) @ vc
    if spec.norm == "row":
        num, den = num[..., :-1], num[..., -1:]
    elif spec.norm == "diag":
        den = (G * ac).sum(-1, keepdim=True)
    elif spec.tril:
        den = (N * (a.transpose(-1, -2) @ a)).sum((-2, -1))[..., None, None, None]
    else:
        P0 = _exclusive_cumsum(ac.transpose(-1, -2) @ ac, -3)
        diag_A = Ac.diagonal(dim1=-2, dim2=-1)
        inc = ((bc @ P0) * bc).sum(-1) \
            + Ac.square().masked_fill(~lower.T, 0).sum(-2) \
            + (G * ac).sum(-1) - diag_A.square()
        den = ((N0 * P0).sum((-2, -1))[..., None] + inc.cumsum(-1))[..., None]
    out = num / _guard(den, eps, signed=spec.norm == "row")
    out = out.reshape(*out.shape[:-3], -1, out.shape[-1])
    return out[..., :n, :]


def tensor_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant, causal: bool = False,
                     *, form: str = "auto", eps: float = 1e-12, chunk_size: int = 64) -> torch.Tensor:
    """Tensor attention of one or more heads: q, k (..., n, d), v (..., n, e) -> (..., n, e).

    variant: a name (``tensor_q``, ``tensor_k_row``, ...) or a TensorAttentionSpec.
    causal: False = the paper's non-causal attention; True = row i from positions <= i
    (prefix sums), or the paper's tril(T) / tr(T) for a ``_tril`` variant.
    form: "linear" (O(n d^2); not for ReLU variants), "quadratic" (T formed, O(n^2 d)),
    or "auto" (linear when it exists). chunk_size: positions per chunk of the causal
    linear form.
    """
    spec = _spec(variant)
    _check_qkv(q, k, v)
    _check_mode(spec, causal)
    if form not in ("auto", "linear", "quadratic"):
        raise ValueError(f"form: expected 'auto', 'linear' or 'quadratic', got {form!r}")
    if form == "linear" and not spec.has_linear_form:
        raise ValueError(f"form: {spec.name!r} has no linear-time form (ReLU acts on the entries "
                         "of T); use form='quadratic' or 'auto'")
    if form == "quadratic" or not spec.has_linear_form:
        _, probs = tensor_attention_weights(q, k, spec, causal, eps)
        return probs @ v
    a, b = _ab(q, k, spec)
    if not causal:
        return _linear_full(a, b, v, spec, eps)
    return _linear_masked(a, b, v, spec, eps, chunk_size)


# -- modules ---------------------------------------------------------------------------
class TensorAttention(nn.Module):
    """Parameter-free tensor-attention core over heads: q, k, v (batch, head, n, d).

    forward returns (output (batch, head, n, d_v), scores, probs); scores and probs
    (batch, head, n, n) are the quadratic form's maps when `need_weights`, else None (the
    output then never forms an n x n matrix unless the variant has no linear form).
    """

    def __init__(self, attention: str = "tensor_q", eps: float = 1e-12, chunk_size: int = 64):
        super().__init__()
        self.spec = _spec(attention)
        self.eps, self.chunk_size = float(eps), int(chunk_size)

    def extra_repr(self) -> str:
        return f"attention={self.spec.name!r}, eps={self.eps:g}"

    def forward(self, q, k, v, causal: bool = False, need_weights: bool = False):
        if need_weights:
            scores, probs = tensor_attention_weights(q, k, self.spec, causal, self.eps)
            return probs @ v, scores, probs
        return tensor_attention(q, k, v, self.spec, causal, eps=self.eps, chunk_size=self.chunk_size), None, None


class TensorMultiheadAttention(nn.MultiheadAttention):
    """Drop-in for `nn.MultiheadAttention` (self-attention) with tensor attention in
    place of the softmax, e.g. in torchvision's `EncoderBlock`.

    Same parameters and names (in_proj_weight, in_proj_bias, out_proj), so a softmax
    model's state_dict loads unchanged. Query, key and value must have the same length;
    attn_mask and key_padding_mask are not supported (is_causal=True gives the causal
    prefix form); attention dropout is not supported (the linear form never forms the
    attention matrix). Returns (output, weights) like the original: weights are the
    normalised T, averaged over heads unless average_attn_weights=False, or None
    without need_weights.
    """

    def __init__(self, embed_dim: int, num_heads: int, attention: str = "tensor_q", dropout: float = 0.0,
                 bias: bool = True, batch_first: bool = False, eps: float = 1e-12, device=None, dtype=None):
        if dropout:
            raise ValueError(f"dropout: attention dropout needs the attention matrix, which tensor "
                             f"attention does not form; expected 0, got {dropout!r}")
        super().__init__(embed_dim, num_heads, dropout=0.0, bias=bias, batch_first=batch_first,
                         device=device, dtype=dtype)
        self.tensor = TensorAttention(attention, eps=eps)

    @property
    def attention(self) -> str:
        return self.tensor.spec.name

    def _heads(self, query, key, value):
        w, bias = self.in_proj_weight, self.in_proj_bias
        ws = w.chunk(3)
        bs = bias.chunk(3) if bias is not None else (None, None, None)
        q, k, v = (F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), ws, bs))
        B, n, E = q.shape
        H = self.num_heads
        return tuple(t.reshape(B, n, H, E // H).transpose(1, 2) for t in (q, k, v))

    def attention_maps(self, x: torch.Tensor, causal: bool = False):
        """(scores, probs, v) of batch-first self-attention on x (batch, n, embed):
        scores, probs (batch, head, n, n), v (batch, head, n, d_head)."""
        q, k, v = self._heads(x, x, x)
        scores, probs = tensor_attention_weights(q, k, self.tensor.spec, causal, self.tensor.eps)
        return scores, probs, v

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        if key_padding_mask is not None or attn_mask is not None:
            raise ValueError("attn_mask, key_padding_mask: not supported by tensor attention "
                             "(use is_causal=True for the causal form)")
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if query.ndim != 3 or key.shape[:2] != query.shape[:2] or value.shape[:2] != query.shape[:2]:
            raise ValueError(f"query, key, value: expected the same (batch, length) with 3 dims, got "
                             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        q, k, v = self._heads(query, key, value)
        out, _, probs = self.tensor(q, k, v, causal=is_causal, need_weights=need_weights)
        B, H, n, dh = out.shape
        out = self.out_proj(out.transpose(1, 2).reshape(B, n, H * dh))
        if not self.batch_first:
            out = out.transpose(0, 1)
        if probs is not None and average_attn_weights:
            probs = probs.mean(1)
        return out, probs
