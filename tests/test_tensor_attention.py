"""Tensor Attention (Zhang, "Deep Tensor Network", section 4): forms, causality, models."""
import pytest
import torch
from torchvision.models.vision_transformer import EncoderBlock

from oattn_lib.models import TransformerXL, TXLConfig, build_vit, vit_attention
from oattn_lib.tensor_attention import (TensorAttentionSpec, TensorMultiheadAttention, attention_names,
                                        causal_variants, parse_attention, tensor_attention,
                                        tensor_attention_weights)

TENSOR = [n for n in attention_names() if n != "softmax"]
LINEAR = [n for n in TENSOR if parse_attention(n).has_linear_form]
# (variant, causal) pairs a model can run: tril only in a causal model
MODES = [(n, c) for n in TENSOR for c in (False, True) if c or not parse_attention(n).tril]
LINEAR_MODES = [(n, c) for n, c in MODES if n in LINEAR]


def qkv(shape=(2, 3, 37, 8), e=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, generator=g, dtype=dtype)
    k = torch.randn(*shape, generator=g, dtype=dtype)
    v = torch.randn(*shape[:-1], e, generator=g, dtype=dtype)
    return q, k, v


# ----------------------------------------------------------------------------- names
def test_names_round_trip_and_errors():
    for name in TENSOR:
        assert parse_attention(name).name == name
    assert parse_attention("softmax") is None
    assert set(causal_variants()) == {n for n in TENSOR if not n.endswith("_tril")}
    assert TensorAttentionSpec("k", True, "row").name == "tensor_k_relu_row"
    for bad in ("tensor", "tensor_v", "tensor_q_row_diag", "Softmax", 3):
        with pytest.raises(ValueError, match="attention"):
            parse_attention(bad)


# ----------------------------------------------------------------------------- forms
@pytest.mark.parametrize("name, causal", LINEAR_MODES)
@pytest.mark.parametrize("n, chunk", [(37, 8), (1, 64), (16, 16), (64, 7)])
def test_linear_form_equals_quadratic_form(name, causal, n, chunk):
    q, k, v = qkv((2, 3, n, 8))
    lin = tensor_attention(q, k, v, name, causal, form="linear", chunk_size=chunk)
    quad = tensor_attention(q, k, v, name, causal, form="quadratic")
    scale = quad.abs().max().clamp_min(1.0)
    assert (lin - quad).abs().max() / scale < 1e-5  # in practice ~1e-13


@pytest.mark.parametrize("name, causal", LINEAR_MODES)
def test_linear_form_in_float32_is_as_accurate_as_the_quadratic_one(name, causal):
    q, k, v = qkv((2, 4, 96, 16), e=16, seed=1)
    exact = tensor_attention(q, k, v, name, causal, form="quadratic")
    rows = torch.ones(exact.shape[:-1], dtype=torch.bool)
    if parse_attention(name).norm == "row":
        # a row sum of T near zero is ill-conditioned in any form: compare the other rows
        raw, _ = tensor_attention_weights(q, k, name, causal)
        den = (raw.tril() if causal else raw).sum(-1)
        rows = den.abs() >= 0.1 * den.abs().amax(-1, keepdim=True)
    out = tensor_attention(q.float(), k.float(), v.float(), name, causal, form="linear").double()
    assert torch.linalg.norm((out - exact)[rows]) / torch.linalg.norm(exact[rows]) < 1e-5  # ~6e-7


@pytest.mark.parametrize("name, causal", LINEAR_MODES)
def test_gradients_of_the_two_forms_agree(name, causal):
    q, k, v = (t.requires_grad_() for t in qkv((1, 2, 20, 4), e=3, seed=2))
    w = torch.randn(1, 2, 20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grads = []
    for form in ("linear", "quadratic"):
        (tensor_attention(q, k, v, name, causal, form=form, chunk_size=6) * w).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*grads):
        assert (a - b).abs().max() / b.abs().max().clamp_min(1.0) < 1e-6


def test_relu_variants_have_no_linear_form():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="no linear-time form"):
        tensor_attention(q, k, v, "tensor_q_relu", form="linear")
    auto = tensor_attention(q, k, v, "tensor_q_relu")
    torch.testing.assert_close(auto, tensor_attention(q, k, v, "tensor_q_relu", form="quadratic"))


def test_paper_identities():
    """T_Q = (QK^T)(QK^T)^T is symmetric PSD with tr = sum((K^T K) * (Q^T Q)) / d; T_K = T_Q
    with Q and K exchanged; the normalisations do what their names say."""
    q, k, v = qkv((3, 40, 6))
    d = q.shape[-1]
    scores, probs = tensor_attention_weights(q, k, "tensor_q")
    s = q @ k.transpose(-1, -2) / d ** 0.5
    torch.testing.assert_close(scores, s @ s.transpose(-1, -2))
    assert torch.linalg.eigvalsh(scores).min() > -1e-9
    tr = ((k.transpose(-1, -2) @ k) * (q.transpose(-1, -2) @ q)).sum((-2, -1)) / d
    torch.testing.assert_close(scores.diagonal(dim1=-2, dim2=-1).sum(-1), tr)
    torch.testing.assert_close(probs.diagonal(dim1=-2, dim2=-1).sum(-1), torch.ones(3, dtype=torch.float64),
                               atol=1e-6, rtol=0)
    sk, _ = tensor_attention_weights(q, k, "tensor_k")
    torch.testing.assert_close(sk, s.transpose(-1, -2) @ s)
    for causal in (False, True):
        torch.testing.assert_close(tensor_attention(q, k, v, "tensor_k", causal),
                                   tensor_attention(k, q, v, "tensor_q", causal))
        _, p_diag = tensor_attention_weights(q, k, "tensor_q_diag", causal)
        torch.testing.assert_close(p_diag.diagonal(dim1=-2, dim2=-1), torch.ones(3, 40, dtype=torch.float64),
                                   atol=1e-9, rtol=0)
        _, p_row = tensor_attention_weights(q, k, "tensor_k_row", causal)
        torch.testing.assert_close(p_row.sum(-1), torch.ones(3, 40, dtype=torch.float64), atol=1e-9, rtol=0)
        _, p_relu = tensor_attention_weights(q, k, "tensor_q_relu", causal)
        assert (p_relu >= 0).all()


@pytest.mark.parametrize("name, causal", MODES)
def test_normalisation_makes_the_output_scale_free(name, causal):
    q, k, v = qkv((2, 30, 5), seed=4)
    out = tensor_attention(q, k, v, name, causal)
    torch.testing.assert_close(tensor_attention(3.0 * q, 0.5 * k, v, name, causal), out, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- causality
def perturbed_after(t, i, seed=9):
    t2 = t.clone()
    t2[..., i:, :] = torch.randn(t2[..., i:, :].shape, dtype=t.dtype,
                                 generator=torch.Generator().manual_seed(seed))
    return t2


@pytest.mark.parametrize("name", causal_variants())
@pytest.mark.parametrize("form", ["auto", "quadratic"])
def test_causal_form_never_lets_a_later_token_change_an_earlier_output(name, form):
    q, k, v = qkv((2, 2, 45, 6), seed=5)
    out = tensor_attention(q, k, v, name, causal=True, form=form, chunk_size=8)
    for i in (1, 13, 16, 44):  # inside and on the edge of chunks
        changed = tensor_attention(perturbed_after(q, i), perturbed_after(k, i), perturbed_after(v, i),
                                   name, causal=True, form=form, chunk_size=8)
        torch.testing.assert_close(changed[..., :i, :], out[..., :i, :], atol=1e-12, rtol=1e-12)
        assert not torch.allclose(changed[..., i:, :], out[..., i:, :])


@pytest.mark.parametrize("name", causal_variants())
def test_causal_row_is_the_papers_attention_on_the_prefix(name):
    """Row i of the causal form = the last row of the non-causal attention of x_1..x_i."""
    q, k, v = qkv((2, 25, 4), seed=6)
    out = tensor_attention(q, k, v, name, causal=True, chunk_size=4)
    for i in (0, 3, 11, 24):
        prefix = tensor_attention(q[..., :i + 1, :], k[..., :i + 1, :], v[..., :i + 1, :], name, causal=False)
        torch.testing.assert_close(out[..., i, :], prefix[..., -1, :], atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", [n for n in TENSOR if n.endswith("_tril")])
def test_the_papers_tril_form_is_not_causal(name):
    """tril(T) / tr(T) (paper 4.1.7) masks T but N = K^T K and tr(T) still sum over every
    position: earlier outputs change when a later token changes."""
    q, k, v = qkv((2, 2, 30, 6), seed=7)
    out = tensor_attention(q, k, v, name, causal=True)
    changed = tensor_attention(perturbed_after(q, 20), perturbed_after(k, 20), perturbed_after(v, 20),
                               name, causal=True)
    assert not torch.allclose(changed[..., :20, :], out[..., :20, :], atol=1e-6)
    _, probs = tensor_attention_weights(q, k, name, causal=True)
    assert (probs.triu(1) == 0).all()  # although its matrix is lower triangular


# ----------------------------------------------------------------------------- modules
V = 40


def tiny_txl(attention, **kw):
    base = dict(n_layer=2, n_head=3, d_model=24, d_head=8, d_inner=48, dropout=0.0, tgt_len=8, mem_len=8,
                attention=attention)
    base.update(kw)
    return TransformerXL(TXLConfig(n_token=V, **base), seed=0).eval()


def tokens(shape, seed):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attention", ["softmax", "tensor_q", "tensor_k", "tensor_q_relu", "tensor_q_diag",
                                       "tensor_k_row"])
@pytest.mark.parametrize("with_mem", [False, True])
def test_txl_is_causal_for_every_causal_variant(attention, with_mem):
    txl = tiny_txl(attention)
    mems = txl(tokens((2, 8), 2)).new_mems if with_mem else None
    a = tokens((2, 8), 3)
    b = a.clone()
    b[:, 5:] = (b[:, 5:] + 1) % V
    oa = txl(a, mems=mems, return_logits=True, return_attention=True)
    ob = txl(b, mems=mems, return_logits=True, return_attention=True)
    torch.testing.assert_close(oa.logits[:, :5], ob.logits[:, :5], atol=1e-6, rtol=0)
    torch.testing.assert_close(oa.probs[..., :5, :], ob.probs[..., :5, :], atol=1e-6, rtol=0)
    assert not torch.allclose(oa.logits[:, 5:], ob.logits[:, 5:])


def test_txl_with_the_papers_tril_form_is_not_causal():
    txl = tiny_txl("tensor_q_tril")
    a = tokens((2, 8), 3)
    b = a.clone()
    b[:, 5:] = (b[:, 5:] + 1) % V
    la = txl(a, return_logits=True).logits
    lb = txl(b, return_logits=True).logits
    assert not torch.allclose(la[:, :5], lb[:, :5], atol=1e-6)


@pytest.mark.parametrize("attention", ["tensor_q", "tensor_k_diag"])
def test_txl_tensor_memory_equals_long_context(attention):
    txl = tiny_txl(attention)
    s1, s2 = tokens((2, 8), 4), tokens((2, 8), 5)
    with_mem = txl(s2, mems=txl(s1).new_mems, return_logits=True).logits
    full = txl(torch.cat([s1, s2], 1), return_logits=True, mem_len=0).logits
    torch.testing.assert_close(with_mem, full[:, 8:], atol=1e-5, rtol=1e-5)


def test_txl_tensor_maps_are_the_normalised_T_and_drive_the_output():
    """probs (batch, layer, head, query, key) are the masked normalised T; the head outputs
    fed to o_net (head-major, as for softmax) equal probs @ v."""
    txl = tiny_txl("tensor_q")
    x = tokens((2, 8), 6)
    seen = {}
    h = txl.layers[0].attn.o_net.register_forward_pre_hook(lambda m, a: seen.update(inp=a[0]))
    try:
        out = txl(x, return_attention=True, return_logits=True)
    finally:
        h.remove()
    assert out.probs.shape == out.scores.shape == (2, 2, 3, 8, 8)
    assert (out.probs.triu(1) == 0).all() and torch.isfinite(out.scores).all()
    att = txl.layers[0].attn
    with torch.no_grad():
        q, k, v = att.qkv_net(txl.word_emb(x)).chunk(3, -1)
        q, k, v = (t.reshape(2, 8, 3, 8).transpose(1, 2) for t in (q, k, v))
        scores, probs = tensor_attention_weights(q + att.r_w_bias[:, None], k, "tensor_q", causal=True)
    torch.testing.assert_close(out.probs[:, 0], probs.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.scores[:, 0], scores.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen["inp"], (probs @ v).transpose(1, 2).reshape(2, 8, 24), atol=1e-5, rtol=1e-5)
    # without return_attention the linear form runs and gives the same logits
    torch.testing.assert_close(txl(x, return_logits=True).logits, out.logits, atol=1e-5, rtol=1e-5)


def test_txl_tensor_variants_share_the_softmax_initialisation_and_train():
    soft, tens = tiny_txl("softmax"), tiny_txl("tensor_k_relu")
    sd0, sd1 = soft.state_dict(), tens.state_dict()
    assert list(sd0) == list(sd1) and all(torch.equal(sd0[n], sd1[n]) for n in sd0)
    tens.train()
    out = tens(tokens((2, 8), 7), tokens((2, 8), 8))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert tens.layers[0].attn.qkv_net.weight.grad.abs().sum() > 0


def test_txl_config_rejects_what_tensor_attention_cannot_do():
    with pytest.raises(ValueError, match="attention"):
        TXLConfig(n_token=V, attention="tensor_z")
    with pytest.raises(ValueError, match="dropatt"):
        TXLConfig(n_token=V, attention="tensor_q", dropatt=0.1)
    with pytest.raises(ValueError, match="same_length"):
        TXLConfig(n_token=V, attention="tensor_q", same_length=True)


def test_multihead_module_is_a_drop_in_for_torchvision_blocks():
    torch.manual_seed(0)
    blk = EncoderBlock(num_heads=2, hidden_dim=16, mlp_dim=32, dropout=0.0, attention_dropout=0.0)
    tma = TensorMultiheadAttention(16, 2, attention="tensor_q", batch_first=True)
    tma.load_state_dict(blk.self_attention.state_dict())
    blk.self_attention = tma
    x = torch.randn(3, 11, 16)
    y = blk(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    out, w = tma(x, x, x)
    assert w.shape == (3, 11, 11)
    out_h, w_h = tma(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(w_h.mean(1), w)
    # sequence-first layout gives the same result
    seq = TensorMultiheadAttention(16, 2, attention="tensor_q")
    seq.load_state_dict(tma.state_dict())
    torch.testing.assert_close(seq(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))[0].transpose(0, 1),
                               out, atol=1e-6, rtol=1e-5)
    # the weights returned are those the output is made of
    scores, probs, v = tma.attention_maps(x)
    torch.testing.assert_close(tma.out_proj((probs @ v).transpose(1, 2).reshape(3, 11, 16)), out,
                               atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="attn_mask"):
        tma(x, x, x, attn_mask=torch.zeros(11, 11, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout"):
        TensorMultiheadAttention(16, 2, dropout=0.1)


@pytest.mark.parametrize("attention", ["tensor_q", "tensor_k_diag"])
def test_vit_attention_returns_the_normalised_T(attention):
    soft = build_vit(image_size=16, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, seed=1)
    net = build_vit(image_size=16, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, seed=1,
                    attention=attention)
    assert all(torch.equal(a, b) for a, b in zip(soft.state_dict().values(), net.state_dict().values()))
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    logits, scores, probs, block_out, recomputed = vit_attention(net, images, return_block_io=True)
    assert probs.shape == scores.shape == (2, 2, 2, 17, 17)
    for y, r in zip(block_out, recomputed):
        torch.testing.assert_close(r, y, atol=1e-5, rtol=1e-4)
    if attention == "tensor_k_diag":
        torch.testing.assert_close(probs.diagonal(dim1=-2, dim2=-1), torch.ones(2, 2, 2, 17), atol=1e-4, rtol=0)
    else:
        torch.testing.assert_close(probs.diagonal(dim1=-2, dim2=-1).sum(-1), torch.ones(2, 2, 2), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="attention"):
        build_vit(image_size=16, attention="tensor_q_tril")
