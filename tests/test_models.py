"""Properties of the Transformer-XL and the ViT attention capture (docs/method.md §9.2, §9.3)."""
import math

import pytest
import torch
import torchvision

from oattn_lib.models import TransformerXL, TXLConfig, build_vit, vit_attention
from oattn_lib.models.transformer_xl import causal_mask, rel_shift, sinusoid_encoding

V = 40




def tiny_cfg(n_token=V, **kw):
    base = dict(n_layer=2, n_head=3, d_model=24, d_head=8, d_inner=48, dropout=0.0,
                tgt_len=8, mem_len=8)
    base.update(kw)
    return TXLConfig(n_token=n_token, **base)


@pytest.fixture(scope="module")
def txl():
    return TransformerXL(tiny_cfg(), seed=0).eval()


def tokens(shape, seed):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- TXL
def test_config_validation():
    with pytest.raises(ValueError, match="cutoffs"):
        TXLConfig(n_token=10, cutoffs=[5, 3])
    with pytest.raises(ValueError, match="cutoffs"):
        TXLConfig(n_token=10, cutoffs=[10])
    with pytest.raises(ValueError, match="d_head"):
        TXLConfig(n_token=10, d_head=0)
    with pytest.raises(ValueError, match="tokens"):
        TransformerXL(tiny_cfg())(torch.zeros(5, dtype=torch.long))


def test_rel_shift_matches_index_formula():
    T, K = 5, 9
    x = torch.randn(2, T, K + T - 1)
    y = rel_shift(x, K)
    i = torch.arange(T)[:, None]
    j = torch.arange(K)[None, :]
    assert torch.equal(y, x[:, i, T - 1 - i + j])
    assert torch.equal(rel_shift(x[:, :1, :K], K), x[:, :1, :K])


def test_scores_match_naive_relative_attention(txl):
    """Layer-0 scores equal the Dai et al. formula evaluated pair by pair."""
    x = tokens((1, 6), 1)
    out = txl(x, return_attention=True)
    att = txl.layers[0].attn
    H, dh = att.n_head, att.d_head
    with torch.no_grad():
        h = txl.word_emb(x)[0]
        q, k, _ = att.qkv_net(h).chunk(3, -1)
        q, k = q.reshape(6, H, dh), k.reshape(6, H, dh)
        want = torch.empty(H, 6, 6)
        for i in range(6):
            for j in range(6):
                r = att.r_net(sinusoid_encoding(torch.tensor([i - j]), txl.config.d_model)[0]).reshape(H, dh)
                ac = ((q[i] + att.r_w_bias) * k[j]).sum(-1)
                bd = ((q[i] + att.r_r_bias) * r).sum(-1)
                want[:, i, j] = (ac + bd) / math.sqrt(dh)
    torch.testing.assert_close(out.scores[0, 0], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_mem", [False, True])
def test_txl_is_causal(txl, with_mem):
    T = 8
    mems = txl(tokens((2, T), 2)).new_mems if with_mem else None
    a = tokens((2, T), 3)
    b = a.clone()
    b[:, 5:] = (b[:, 5:] + 1) % V
    oa = txl(a, mems=mems, return_logits=True, return_attention=True)
    ob = txl(b, mems=mems, return_logits=True, return_attention=True)
    torch.testing.assert_close(oa.logits[:, :5], ob.logits[:, :5], atol=1e-6, rtol=0)
    torch.testing.assert_close(oa.probs[..., :5, :], ob.probs[..., :5, :], atol=1e-6, rtol=0)
    assert not torch.allclose(oa.logits[:, 5:], ob.logits[:, 5:])


def test_memory_changes_outputs_and_equals_long_context(txl):
    """Segment 2 with segment 1 as memory == the second half of one long segment."""
    s1, s2 = tokens((2, 8), 4), tokens((2, 8), 5)
    o1 = txl(s1)
    with_mem = txl(s2, mems=o1.new_mems, return_logits=True).logits
    without = txl(s2, return_logits=True).logits
    full = txl(torch.cat([s1, s2], 1), return_logits=True, mem_len=0).logits
    assert (with_mem - without).abs().max() > 1e-3
    torch.testing.assert_close(with_mem, full[:, 8:], atol=1e-5, rtol=1e-5)


def test_memory_keeps_the_newest_layer_inputs(txl):
    s1, s2 = tokens((2, 8), 6), tokens((2, 8), 7)
    m = txl(s2, mems=txl(s1).new_mems).new_mems
    assert m.shape == (2, 2, 8, 24)
    long = txl(torch.cat([s1, s2], 1), mem_len=16).new_mems
    assert long.shape == (2, 2, 16, 24)
    torch.testing.assert_close(m, long[:, :, 8:], atol=1e-5, rtol=1e-5)
    assert txl(tokens((2, 8), 6), mem_len=0).new_mems is None


@pytest.mark.parametrize("with_mem", [False, True])
def test_probs_are_masked_softmax_of_scores(txl, with_mem):
    mems = txl(tokens((3, 8), 8)).new_mems if with_mem else None
    M = 0 if mems is None else mems.shape[2]
    out = txl(tokens((3, 8), 9), mems=mems, return_attention=True)
    assert out.scores.shape == out.probs.shape == (3, 2, 3, 8, M + 8)
    assert out.scores.dtype == out.probs.dtype == torch.float32
    mask = causal_mask(8, M)
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(3, 2, 3, 8), atol=1e-6, rtol=0)
    ref = torch.softmax(out.scores.masked_fill(mask, float("-inf")), -1)
    torch.testing.assert_close(out.probs, ref, atol=1e-6, rtol=0)
    assert torch.all(out.probs[..., mask] == 0)
    assert torch.all(out.probs[..., ~mask] > 0)
    # scores are taken before the mask: finite everywhere, including the future
    assert torch.isfinite(out.scores).all()


@pytest.mark.parametrize("variant", [dict(pre_lnorm=True), dict(same_length=True, mem_len=4),
                                     dict(clamp_len=3), dict(cutoffs=[10, 20], div_val=2)])
def test_variants_are_causal_and_masked(variant):
    model = TransformerXL(tiny_cfg(**variant), seed=2).eval()
    mems = model(tokens((2, 8), 12)).new_mems
    M = mems.shape[2]
    a = tokens((2, 8), 13)
    b = a.clone()
    b[:, 4:] = (b[:, 4:] + 1) % V
    oa = model(a, mems=mems, return_logits=True, return_attention=True)
    ob = model(b, mems=mems, return_logits=True, return_attention=True)
    # the adaptive input (div_val) embeds each cluster's tokens in one matmul, whose shape
    # depends on how many tokens fall in the cluster: the unchanged positions may round
    # differently (1 ulp seen), so a few float32 ulps; a look-ahead of one position moves them ~1e-3
    torch.testing.assert_close(oa.logits[:, :4], ob.logits[:, :4], atol=1e-6, rtol=8 * torch.finfo(torch.float32).eps)
    mask = causal_mask(8, M, model.config.mem_len, model.config.same_length)
    ref = torch.softmax(oa.scores.masked_fill(mask, float("-inf")), -1)
    torch.testing.assert_close(oa.probs, ref, atol=1e-6, rtol=0)
    assert torch.all(oa.probs[..., mask] == 0)


def test_same_length_mask_window():
    m = causal_mask(4, 4, mem_len=4, same_length=True)
    assert torch.equal((~m).sum(1), torch.full((4,), 4))


def test_adaptive_softmax_loss_and_normalisation():
    cfg = tiny_cfg(n_token=60, cutoffs=[10, 30], div_val=2)
    model = TransformerXL(cfg, seed=1).eval()
    x = torch.randint(0, 60, (2, 8), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    out = model(x, y, return_logits=True)
    assert out.logits.shape == (2, 8, 60)
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    nll = -out.logits.gather(-1, y[..., None]).mean()
    torch.testing.assert_close(out.loss, nll, atol=1e-5, rtol=1e-5)
    # the adaptive input embedding really uses the small tail tables
    assert [t.embedding_dim for t in model.word_emb.tables] == [24, 12, 6]


def test_plain_softmax_loss_is_mean_nll(txl):
    x, y = tokens((2, 8), 10), tokens((2, 8), 11)
    out = txl(x, y, return_logits=True)
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, -out.logits.gather(-1, y[..., None]).mean(), atol=1e-6, rtol=1e-6)


def test_seeded_init_is_reproducible_and_leaves_global_rng():
    state = torch.random.get_rng_state()
    a = TransformerXL(tiny_cfg(), seed=3).state_dict()
    b = TransformerXL(tiny_cfg(), seed=3).state_dict()
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_paper_preset_builds():
    cfg = TXLConfig.paper(n_token=500)
    assert (cfg.n_layer, cfg.n_head, cfg.d_model, cfg.tgt_len) == (16, 8, 410, 256)
    model = TransformerXL(cfg, seed=0).eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 4, dtype=torch.long), return_attention=True)
    assert out.scores.shape == (1, 16, 8, 4, 4)
    # d_head is independent of d_model
    TransformerXL(TXLConfig(n_token=50, n_layer=1, n_head=2, d_model=20, d_head=128))


# ----------------------------------------------------------------------------- ViT
def test_vit_recomputed_attention_reproduces_module_output():
    model = build_vit(image_size=16, patch_size=4, num_layers=3, num_heads=4, hidden_dim=32,
                      mlp_dim=64, num_classes=5, seed=0)
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    logits, scores, probs, mha_out, recomputed = vit_attention(model, images, return_block_io=True)
    assert logits.shape == (3, 5)
    assert scores.shape == probs.shape == (3, 3, 4, 17, 17)
    assert probs.dtype == torch.float32
    for y, r in zip(mha_out, recomputed):
        torch.testing.assert_close(r, y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 3, 4, 17), atol=1e-6, rtol=0)
    torch.testing.assert_close(probs, torch.softmax(scores, -1), atol=1e-6, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(images))
    assert model.training  # mode restored


def test_vit_input_validation():
    model = build_vit(image_size=16, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=8)
    with pytest.raises(ValueError, match="images"):
        vit_attention(model, torch.zeros(1, 3, 32, 32))
    with pytest.raises(ValueError, match="patch_size"):
        build_vit(image_size=18, patch_size=4)


def test_vit_b_16_shapes():
    model = torchvision.models.vit_b_16(weights=None)
    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    logits, scores, probs = vit_attention(model, image)
    assert logits.shape == (1, 1000)
    assert scores.shape == probs.shape == (1, 12, 12, 197, 197)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 12, 12, 197), atol=1e-5, rtol=0)
