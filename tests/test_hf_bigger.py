"""Extraction from models bigger than one float32 copy on one device (docs/method.md §9.4):
compute dtype (bfloat16, float16 on a GPU only), `device_map`, and encoder-decoder models
(encoder, decoder and cross-attention as three records).

Tiny randomly initialised models (Llama, T5, BART) are built from transformers' config
classes and saved with an offline word-level tokenizer; nothing is downloaded.
"""
import copy
from pathlib import Path

import pytest
import torch

from oattn_lib.models import hf_recording

WORDS = [f"w{i}" for i in range(40)]
TEXTS = [" ".join(WORDS[(7 * i + j) % 40] for j in range(12)) for i in range(2)]
MAX_LEN = 12


def word_tokenizer(directory: Path, eos: bool = False) -> None:
    """A word-level tokenizer ([PAD] 0, [UNK] 1, [EOS] 2, then one id per word) saved to `directory`;
    with `eos`, every text ends with [EOS] (as seq2seq tokenizers end it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if eos:
        tok.post_processor = processors.TemplateProcessing(single="$A [EOS]", special_tokens=[("[EOS]", 2)])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                            eos_token="[EOS]").save_pretrained(directory)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_llama(tmp_path_factory)


def save_llama(tmp_path_factory):
    """A tiny random Llama (grouped key/value heads), large enough initial weights that its
    attention is far from uniform, saved with its tokenizer."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=len(WORDS) + 3, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, pad_token_id=0,
                      bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("llama")
    LlamaModel(cfg).eval().save_pretrained(d)
    word_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def fp32(llama_dir):
    model, tok = hf_recording.load_hf(llama_dir)
    texts = [TEXTS[0], " ".join(TEXTS[1].split()[:7])]  # two lengths: padded keys too
    return model, tok, texts, hf_recording.hf_attention(model, tok, texts, max_length=MAX_LEN)


# ------------------------------------------------------------------------ compute dtype

# bfloat16 keeps 8 significant bits (eps = 2**-7): the logits of a 64-wide random model carry
# relative errors of a few eps, compounded over the layers into the peaked softmax. Measured
# against float32 (this model, this seed): probs differ by at most 0.015 in layer 0, 0.03 in all
# layers, 0.001 on average; scores by at most 4% of a head's largest score. Attention computed
# wrongly (a lost mask, a transposed head, another layer) differs by O(1).
BF16_PROBS_ATOL = 0.1
BF16_PROBS_ATOL_LAYER0 = 0.05
BF16_PROBS_MEAN = 5e-3
BF16_SCORES_RTOL = 0.1


def test_bfloat16_attention_is_close_to_float32_but_not_equal(llama_dir, fp32):
    model32, tok, texts, ref = fp32
    model, _ = hf_recording.load_hf(llama_dir, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    res = hf_recording.hf_attention(model, tok, texts, max_length=MAX_LEN)
    assert res["scores"].dtype == res["probs"].dtype == torch.float32
    # the forward pass ran in bfloat16: every score is a bfloat16 number (the float32 model's are not)
    assert torch.equal(res["scores"].to(torch.bfloat16).float(), res["scores"])
    assert not torch.equal(ref["scores"].to(torch.bfloat16).float(), ref["scores"])
    # the probabilities are a float32 softmax of those logits, padded keys exactly 0
    masked = torch.where(res["allowed"][:, :, None], res["scores"], float("-inf"))
    torch.testing.assert_close(res["probs"], torch.softmax(masked, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(res["probs"].sum(-1), torch.ones_like(res["probs"][..., 0]), rtol=0, atol=1e-5)
    assert torch.equal(res["allowed"], ref["allowed"])
    n = int(res["attention_mask"][1].sum())
    assert (res["probs"][1, ..., n:] == 0).all() and (res["probs"] * ~res["allowed"][:, :, None] == 0).all()
    # close to float32, within bfloat16's precision, and not equal: bfloat16 ran
    scale = ref["scores"].abs().amax(dim=(-1, -2), keepdim=True)
    assert ((res["scores"] - ref["scores"]).abs() / scale).max() < BF16_SCORES_RTOL
    diff = (res["probs"] - ref["probs"]).abs()
    assert diff.max() < BF16_PROBS_ATOL and diff[:, 0].max() < BF16_PROBS_ATOL_LAYER0
    assert diff.mean() < BF16_PROBS_MEAN
    assert diff.max() > 1e-3 and (res["scores"] != ref["scores"]).float().mean() > 0.5
    # the attention is far from uniform, so the tolerances above are not vacuous
    assert ref["probs"].max() > 0.9


def test_bfloat16_stream_gives_float32_copies(llama_dir, fp32):
    model, tok = hf_recording.load_hf(llama_dir, dtype=torch.bfloat16)
    calls = []
    n = hf_recording.hf_attention_stream(model, hf_recording.hf_encode(model, tok, fp32[2], MAX_LEN), calls.append)
    assert n == 3 and [c.layer for c in calls] == [0, 1, 2] and {c.stack for c in calls} == {None}
    assert {c.scores.dtype for c in calls} == {c.probs.dtype for c in calls} == {torch.float32}


FP16_PROBS_ATOL = 5e-3  # float16 keeps 11 significant bits; scores here are of order 10


def test_half_precision_mask_does_not_overflow():
    """float16 logits plus a float16 mask's minimum overflow to -inf; a query with no allowed
    key (a left-padded query) must still get what float32 gives, a uniform row, not NaN."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 8, generator=g)
    k = torch.randn(1, 2, 4, 8, generator=g) + 2
    q[..., 0, :] = -6  # query 0's scores are all below -20: score + min(float16) passes -65504
    v = torch.randn(1, 2, 4, 8, generator=g)
    allowed = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    allowed[..., 0, :] = False
    allowed[..., 1:, 0] = False
    module = torch.nn.Module().eval()
    with hf_recording.record_attention() as rec32:
        hf_recording.recording_attention_forward(module, q, k, v,
                                                 torch.where(allowed, 0.0, torch.finfo(torch.float32).min))
    half = [x.half() for x in (q, k, v)]
    with hf_recording.record_attention() as rec16:
        out, probs = hf_recording.recording_attention_forward(
            module, *half, torch.where(allowed, 0.0, torch.finfo(torch.float16).min).half())
    assert (rec16.scores[0][0, :, 0] < -20).all()  # the all-masked row would overflow
    assert probs.dtype == torch.float16 and torch.isfinite(out).all()
    assert rec16.probs[0].dtype == torch.float32 and torch.isfinite(rec16.probs[0]).all()
    torch.testing.assert_close(rec16.probs[0][..., 0, :], torch.full((1, 2, 4), 0.25), rtol=0, atol=0)
    torch.testing.assert_close(rec16.probs[0], rec32.probs[0], rtol=0, atol=FP16_PROBS_ATOL)
    assert (rec16.probs[0] != rec32.probs[0]).any()
    assert torch.equal(rec16.allowed[0], allowed[:, 0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="float16 is allowed on a GPU")
def test_float16_on_cpu_is_a_clear_error(llama_dir):
    for kwargs in ({}, {"device": "cpu"}, {"device_map": "auto"}, {"device_map": {"": "cpu"}}):
        with pytest.raises(ValueError, match="compute_dtype: float16 runs on a GPU only"):
            hf_recording.load_hf(llama_dir, dtype=torch.float16, **kwargs)
    with pytest.raises(ValueError, match="compute_dtype.*allowed: float32, bfloat16, float16"):
        hf_recording.load_hf(llama_dir, dtype="half")
    with pytest.raises(ValueError, match="device and device_map"):
        hf_recording.load_hf(llama_dir, device="cpu", device_map="auto")


# ------------------------------------------------------------------------ device_map

@pytest.mark.parametrize("device_map", ["auto", {"": "cpu"}])
def test_device_map_gives_the_attention_of_the_plain_load(llama_dir, fp32, device_map):
    model, tok = hf_recording.load_hf(llama_dir, device_map=device_map)
    on_gpu = device_map == "auto" and torch.cuda.is_available()
    assert {p.device.type for p in model.parameters()} == {"cuda" if on_gpu else "cpu"} and not model.training
    assert hf_recording.attn_implementation(model) == hf_recording.ATTN_IMPLEMENTATION
    res = hf_recording.hf_attention(model, tok, fp32[2], max_length=MAX_LEN)
    assert torch.equal(res["allowed"], fp32[3]["allowed"])
    for key in ("scores", "probs"):
        if on_gpu:  # other kernels, other rounding
            torch.testing.assert_close(res[key], fp32[3][key], rtol=1e-4, atol=1e-4)
        else:  # the same computation on the same device
            assert torch.equal(res[key], fp32[3][key]), key
    assert (res["kv_group"] == fp32[3]["kv_group"]).all()


def test_stream_moves_each_layer_to_the_cpu_when_asked(llama_dir, fp32):
    model, tok = hf_recording.load_hf(llama_dir)
    enc = hf_recording.hf_encode(model, tok, fp32[2], MAX_LEN)
    seen = []
    hf_recording.hf_attention_stream(model, enc, lambda c: seen.append((c.scores.device, c.probs.device)), to_cpu=True)
    assert set(seen) == {(torch.device("cpu"),) * 2}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_half_precision_and_layers_on_two_devices(llama_dir, fp32, dtype):
    """Layer 0 on the GPU, the others on the CPU: the attention of every layer is recorded,
    moved to the CPU, and close to float32 on the CPU."""
    if dtype == torch.float16:
        model, tok = hf_recording.load_hf(llama_dir, dtype=dtype, device_map="auto")
    else:
        device_map = {"embed_tokens": 0, "rotary_emb": 0, "layers.0": 0, "layers.1": "cpu", "layers.2": "cpu",
                      "norm": "cpu"}
        model, tok = hf_recording.load_hf(llama_dir, dtype=dtype, device_map=device_map)
    res = hf_recording.hf_attention(model, tok, fp32[2], max_length=MAX_LEN)
    ref = fp32[3]
    assert res["probs"].device.type == "cpu" and res["probs"].shape == ref["probs"].shape
    assert torch.equal(res["allowed"], ref["allowed"])
    assert (res["probs"] - ref["probs"]).abs().max() < BF16_PROBS_ATOL


# ------------------------------------------------------------------------ encoder-decoder

def _t5():
    from transformers import T5Config, T5Model
    return T5Model, T5Config(vocab_size=100, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                             decoder_start_token_id=0, pad_token_id=0, eos_token_id=2, dropout_rate=0.0)


def _bart():
    from transformers import BartConfig, BartModel
    return BartModel, BartConfig(vocab_size=100, d_model=16, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                 decoder_ffn_dim=32, init_std=0.3, pad_token_id=0, eos_token_id=2, bos_token_id=None,
                                 decoder_start_token_id=2, forced_eos_token_id=None)


SEQ2SEQ = {"t5": _t5, "bart": _bart}
EAGER_FIELDS = dict(zip(hf_recording.STACKS, ("encoder_attentions", "decoder_attentions", "cross_attentions")))


@pytest.fixture(scope="module", params=sorted(SEQ2SEQ))
def seq2seq(request):
    """(name, model with the recording attention, the same weights with eager attention)."""
    cls, cfg = SEQ2SEQ[request.param]()
    torch.manual_seed(0)
    # each with a config of its own, where the attention implementation lives, set at construction
    # (T5 copies the config into its stacks)
    model = cls._from_config(copy.deepcopy(cfg), attn_implementation=hf_recording.register_recording_attention()).eval()
    eager = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    return request.param, model, eager


def _ids(n_source: int, n_target: int) -> dict:
    """Two (source, target) pairs: the second one's source padded by 2, its target by 1."""
    g = torch.Generator().manual_seed(1)
    src_mask = torch.ones(2, n_source, dtype=torch.long)
    src_mask[1, -2:] = 0
    dec_mask = torch.ones(2, n_target, dtype=torch.long)
    dec_mask[1, -1] = 0
    return {"input_ids": torch.randint(3, 100, (2, n_source), generator=g), "attention_mask": src_mask,
            "decoder_input_ids": torch.randint(3, 100, (2, n_target), generator=g), "decoder_attention_mask": dec_mask}


@pytest.mark.parametrize("n_source,n_target", [(7, 4), (5, 5)])
def test_seq2seq_attention_is_transformers_eager_attention(seq2seq, n_source, n_target):
    """Each stack against transformers' own eager `output_attentions`; with equal source and
    target lengths the decoder's self- and cross-attention calls have one shape, and are still
    told apart."""
    _, model, eager = seq2seq
    inputs = _ids(n_source, n_target)
    res = hf_recording.hf_seq2seq_attention(model, None, None, None, inputs=inputs)
    with torch.no_grad():
        ref = eager(**inputs, output_attentions=True, use_cache=False)
    shapes = {"encoder": (n_source, n_source), "decoder": (n_target, n_target), "cross": (n_target, n_source)}
    for stack in hf_recording.STACKS:
        r = res[stack]
        assert r["probs"].shape == r["scores"].shape == (2, 2, 2, *shapes[stack])
        assert r["allowed"].shape == (2, 2, *shapes[stack]) and r["kv_group"].tolist() == [[0, 1], [0, 1]]
        torch.testing.assert_close(r["probs"], torch.stack(getattr(ref, EAGER_FIELDS[stack]), 1),
                                   rtol=0, atol=1e-6)
        # scores are the logits before the mask (T5: with its relative position bias)
        masked = torch.where(r["allowed"][:, :, None], r["scores"], float("-inf"))
        torch.testing.assert_close(r["probs"], torch.softmax(masked, -1), rtol=0, atol=1e-6)
    assert res["decoder_input_ids"].shape == (2, n_target) and res["decoder_tokens"] is None


def test_seq2seq_allowed_masks(seq2seq):
    _, model, _ = seq2seq
    res = hf_recording.hf_seq2seq_attention(model, None, None, None, inputs=_ids(7, 4))
    src = torch.tensor([[1] * 7, [1] * 5 + [0] * 2], dtype=torch.bool)
    dec = torch.tensor([[1] * 4, [1] * 3 + [0]], dtype=torch.bool)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    expected = {"encoder": src[:, None, None, :].expand(2, 2, 7, 7),
                "decoder": (causal & dec[:, None, :])[:, None].expand(2, 2, 4, 4),
                "cross": src[:, None, None, :].expand(2, 2, 4, 7)}
    for stack in hf_recording.STACKS:
        assert torch.equal(res[stack]["allowed"], expected[stack]), stack
        assert (res[stack]["probs"] * ~expected[stack][:, :, None] == 0).all()
    # the probabilities are not degenerate: the comparisons above test something
    assert 0.3 < res["cross"]["probs"].max() < 0.999


def test_seq2seq_stream_names_stacks_and_layers(seq2seq):
    name, model, _ = seq2seq
    calls = []
    n = hf_recording.hf_attention_stream(model, _ids(7, 4), calls.append)
    names = {id(m): k for k, m in model.named_modules()}
    assert n == 6
    assert [(c.stack, c.layer) for c in calls] == [("encoder", 0), ("encoder", 1), ("decoder", 0), ("cross", 0),
                                                   ("decoder", 1), ("cross", 1)]
    cross = {"t5": "EncDecAttention", "bart": "encoder_attn"}[name]
    assert all(names[id(c.module)].endswith(cross) == (c.stack == "cross") for c in calls)
    assert all(names[id(c.module)].startswith("encoder.") == (c.stack == "encoder") for c in calls)


def test_seq2seq_eager_model_gives_probabilities_only(seq2seq):
    _, model, eager = seq2seq
    inputs = _ids(7, 4)
    ours = hf_recording.hf_seq2seq_attention(model, None, None, None, inputs=inputs)
    res = hf_recording.hf_seq2seq_attention(eager, None, None, None, inputs=inputs)
    for stack in hf_recording.STACKS:
        assert res[stack]["scores"] is None and res[stack]["allowed"] is None
        torch.testing.assert_close(res[stack]["probs"], ours[stack]["probs"], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="encoder-decoder.*hf_seq2seq_attention"):
        hf_recording.hf_attention(model, None, ["w1 w2"])


def test_seq2seq_from_texts_through_load_hf(tmp_path):
    """A saved tiny T5 and a word-level tokenizer: load_hf, then source and target texts; the
    decoder reads the target shifted right after the decoder start token."""
    cls, cfg = _t5()
    torch.manual_seed(0)
    cls(cfg).eval().save_pretrained(tmp_path)
    word_tokenizer(tmp_path, eos=True)
    model, tok = hf_recording.load_hf(tmp_path)
    assert hf_recording.attn_implementation(model) == hf_recording.ATTN_IMPLEMENTATION
    source, target = [TEXTS[0], "w1 w2 w3"], ["w5 w6 w7 w8", "w9 w10"]
    inputs = hf_recording.hf_seq2seq_encode(model, tok, source, target, max_length=MAX_LEN)
    tgt = tok(target, padding="longest", return_tensors="pt")
    assert inputs["input_ids"].shape == (2, MAX_LEN) and tgt["input_ids"].shape == (2, 5)
    assert (inputs["decoder_input_ids"][:, 0] == 0).all()
    assert torch.equal(inputs["decoder_input_ids"][:, 1:], tgt["input_ids"][:, :-1])
    assert inputs["decoder_attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    res = hf_recording.hf_seq2seq_attention(model, tok, source, target, max_length=MAX_LEN)
    assert res["cross"]["probs"].shape == (2, 2, 2, 5, MAX_LEN)
    assert res["decoder_tokens"][1] == ["[PAD]", "w9", "w10", "[EOS]", "[PAD]"]
    assert res["tokens"][1][:4] == ["w1", "w2", "w3", "[EOS]"]
    assert not res["cross"]["allowed"][1, :, :, 4:].any() and res["cross"]["allowed"][1, :, :, :4].all()
    with pytest.raises(ValueError, match="target_texts: 1 targets for 2 source texts"):
        hf_recording.hf_seq2seq_encode(model, tok, source, target[:1])
