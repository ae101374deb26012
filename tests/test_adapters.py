"""Attention of models the user already has (docs/method.md §9.1, §9.4): a Hugging Face model loaded
with any attention implementation in `api.extract` (`models.hf_recording.recording_installed`), and the
adapters of `oattn_lib.adapters` from TransformerLens caches and nnsight models, which the docs'
recipes (docs/how-to/attention.md) use.

The models are tiny and random, built from config classes: a Llama (grouped-query heads) with a
word-level tokenizer made in memory, and HookedTransformers run on integer token batches with
left and right padding. Nothing is downloaded. The TransformerLens and nnsight tests need the
extras `lens` and `nnsight` (requirements-extras.txt pins them, `make test` installs them) and are skipped
without them.
"""
import copy
import os
import re
import sys

import numpy as np
import pytest
import torch
import xarray as xr

from oattn_lib import api
from oattn_lib.models import hf_recording

pytestmark = [pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:LanguageModel is deprecated")]

WORDS = [f"w{i}" for i in range(96)]
PROMPTS = ["w1 w5 w9 w2 w7 w3 w8", "w40 w41 w42", "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20"]


def word_tokenizer():
    """A word-level tokenizer: [PAD] 0, [UNK] 1, then one id per word of WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(WORDS) + 2, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3, pad_token_id=0,
                       bos_token_id=None, eos_token_id=None)


def tiny_llama(cls=None):
    """A random Llama causal LM as a user loads one: attn_implementation="sdpa", eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return (cls or LlamaForCausalLM)._from_config(llama_config(), attn_implementation="sdpa").eval()


def masked_softmax(scores, allowed):
    """softmax over keys of scores (layer, head, query, key) where allowed (layer, query, key)."""
    z = np.where(allowed[:, None], scores.astype(np.float64), -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


# -- a model loaded elsewhere, in api.extract ----------------------------------------------------
def test_extract_records_a_model_loaded_with_sdpa_and_gives_its_implementation_back():
    """The probabilities are the model's own eager attention weights, the mask its causal triangle;
    afterwards the model attends with sdpa again and computes the same logits."""
    model, tok = tiny_llama(), word_tokenizer()
    enc = tok([PROMPTS[0]], return_tensors="pt")
    with torch.no_grad():
        logits_before = model(**enc).logits
    out = api.extract((model, tok), PROMPTS)

    assert model.config._attn_implementation == "sdpa" and model.model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, logits_before)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    for prompt, ds in zip(PROMPTS, out):
        with torch.no_grad():
            ref = eager(**tok([prompt], return_tensors="pt"), output_attentions=True).attentions
        n = len(prompt.split())
        assert ds.sizes == {"layer": 2, "head": 4, "query": n, "key": n}
        for layer in range(2):
            np.testing.assert_allclose(ds["probs"].values[layer], ref[layer][0].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ds["allowed"].values, np.broadcast_to(np.tri(n, dtype=bool), (2, n, n)))
        np.testing.assert_array_equal(ds["kv_group"].values, [0, 0, 1, 1])
        assert ds.attrs["model_kv_heads"] == 2 and ds.attrs["model"] == "LlamaForCausalLM"


def test_the_implementation_is_restored_when_the_forward_raises():
    model, tok = tiny_llama(), word_tokenizer()
    seen = []

    def boom(module, args):
        seen.append(hf_recording.attn_implementation(model))
        raise RuntimeError("boom in layer 1")

    handle = model.model.layers[1].register_forward_pre_hook(boom)
    with pytest.raises(RuntimeError, match="boom in layer 1"):
        api.extract((model, tok), PROMPTS[:1])
    handle.remove()
    assert seen == [hf_recording.ATTN_IMPLEMENTATION]  # the forward ran with the recording attention
    assert model.config._attn_implementation == "sdpa" and model.model.config._attn_implementation == "sdpa"
    with pytest.raises(KeyError):
        with hf_recording.recording_installed(model):
            raise KeyError("in the block")
    assert model.config._attn_implementation == "sdpa"


def test_each_tower_of_a_composite_model_gets_its_own_implementation_back():
    """A vision-language model whose vision tower attends eagerly and whose text model uses sdpa
    records through both and comes back mixed, as it was (one set_attn_implementation with the
    top-level name would make both sdpa)."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=8, patch_size=4, projection_dim=16)
    cfg = LlavaConfig(vision_config=vision, text_config=llama_config(), image_token_index=len(WORDS) + 1,
                      projector_hidden_act="gelu", vision_feature_layer=-1)
    model = LlavaForConditionalGeneration._from_config(
        cfg, attn_implementation={"": "sdpa", "vision_config": "eager", "text_config": "sdpa"})

    def state():
        return (model.config._attn_implementation, model.config.vision_config._attn_implementation,
                model.model.vision_tower.config._attn_implementation,
                model.model.language_model.config._attn_implementation)

    assert state() == ("sdpa", "eager", "eager", "sdpa")
    with hf_recording.recording_installed(model):
        assert set(state()) == {hf_recording.ATTN_IMPLEMENTATION}
    assert state() == ("sdpa", "eager", "eager", "sdpa")


def test_a_model_without_the_attention_interface_is_refused_naming_its_class():
    from transformers import LlamaForCausalLM

    class OwnAttentionLlama(LlamaForCausalLM):  # stands for a model with its own attention code
        _supports_attention_backend = False

        @classmethod
        def _can_set_attn_implementation(cls):
            return False

    model = tiny_llama(OwnAttentionLlama)
    with pytest.raises(ValueError, match=r"model: OwnAttentionLlama does not dispatch .*AttentionInterface"):
        api.extract((model, word_tokenizer()), PROMPTS[:1])
    assert model.config._attn_implementation == "sdpa"


# -- TransformerLens ---------------------------------------------------------------------------
LENS_CONFIGS = {
    # multi-head attention, learnt absolute positions
    "mha": {},
    # grouped-query attention (two query heads per key/value head), rotary queries and keys
    "gqa": {"n_key_value_heads": 2, "positional_embedding_type": "rotary"},
    # a global then a local layer (window of 3 positions)
    "local": {"use_local_attn": True, "attn_types": ["global", "local"], "window_size": 3},
}
WINDOWS = {"mha": [None, None], "gqa": [None, None], "local": [None, 3]}


def lens_model(name: str, **extra):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    settings = {"n_layers": 2, "d_model": 16, "d_head": 4, "n_heads": 4, "n_ctx": 32, "d_vocab": 50, "act_fn": "gelu",
                "seed": 0}
    cfg = HookedTransformerConfig(**{**settings, **LENS_CONFIGS[name], **extra})
    return HookedTransformer(cfg).eval()


def padded_batch():
    """(tokens, attention_mask) (3, 10): row 0 unpadded, row 1 left-padded by 3, row 2 right-padded by 4;
    the padding holds token ids too, as a real batch's pad token would."""
    tokens = torch.randint(1, 50, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, 6:] = 0
    return tokens, mask


def lens_run(name: str):
    """(name, model, cache, tokens, attention_mask, adapter output) of a padded batch."""
    pytest.importorskip("transformer_lens")
    from oattn_lib.adapters import from_transformer_lens

    model = lens_model(name)
    tokens, mask = padded_batch()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
    return name, model, cache, tokens, mask, from_transformer_lens(cache, model, tokens, attention_mask=mask)


@pytest.fixture(scope="module", params=sorted(LENS_CONFIGS))
def lens(request):
    return lens_run(request.param)


def real_positions(mask, b):
    return torch.nonzero(mask[b]).flatten()


def cut(x, idx):
    """x (..., pos, pos) at the real positions idx."""
    return x[..., idx, :][..., idx].numpy()


def test_lens_probs_are_the_cache_pattern_on_each_samples_own_tokens(lens):
    name, model, cache, tokens, mask, out = lens
    assert len(out) == 3
    for b, ds in enumerate(out):
        idx = real_positions(mask, b)
        assert ds.sizes == {"layer": 2, "head": 4, "query": idx.numel(), "key": idx.numel()}
        np.testing.assert_array_equal(ds["token"].values, tokens[b, idx].numpy())
        np.testing.assert_array_equal(ds["query"].values, np.arange(idx.numel()))
        assert ds["probs"].dtype == np.float32 and ds["scores"].dtype == np.float32 and ds["allowed"].dtype == bool
        for layer in range(2):
            np.testing.assert_array_equal(ds["probs"].values[layer], cut(cache["pattern", layer][b], idx))
        # the attributes and coordinates api.extract gives
        assert set(ds.attrs) == {"model", "kind", "prompt", "text", "sample", "dtype", "model_layers",
                                 "model_heads", "model_kv_heads"}
        assert ds.attrs["sample"] == b and (ds.attrs["model_layers"], ds.attrs["model_heads"]) == (2, 4)
        assert set(ds.coords) == {"layer", "head", "kv_group", "query", "key", "token", "token_text"}


def test_lens_scores_are_hook_attn_scores_where_allowed_and_the_pre_mask_logits_elsewhere(lens):
    """Where the model may attend the scores are TransformerLens' own; at the masked entries, where
    its cache holds -inf, they are q.k / attn_scale computed here from the cached queries and keys
    (query head h reading key/value head h // group size)."""
    name, model, cache, tokens, mask, out = lens
    cfg = model.cfg
    rot = "rot_" if cfg.positional_embedding_type == "rotary" else ""
    group = cfg.n_heads // (cfg.n_key_value_heads or cfg.n_heads)
    for layer in range(2):
        q = cache[f"blocks.{layer}.attn.hook_{rot}q"]                     # (batch, pos, head, d_head)
        k = cache[f"blocks.{layer}.attn.hook_{rot}k"][:, :, np.arange(cfg.n_heads) // group]
        logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / cfg.attn_scale
        hooked = cache["attn_scores", layer]
        for b, ds in enumerate(out):
            idx = real_positions(mask, b)
            scores, allowed = ds["scores"].values[layer], ds["allowed"].values[layer]
            assert np.isfinite(scores).all()
            np.testing.assert_allclose(scores, cut(logits[b], idx), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(scores[:, allowed], cut(hooked[b], idx)[:, allowed])
            assert allowed.sum() < allowed.size  # some entries are masked: the check above is not vacuous


def test_lens_softmax_of_the_scores_masked_by_allowed_is_probs(lens):
    name, model, cache, tokens, mask, out = lens
    for ds in out:
        np.testing.assert_allclose(masked_softmax(ds["scores"].values, ds["allowed"].values), ds["probs"].values,
                                   rtol=1e-5, atol=1e-6)


def test_lens_allowed_is_the_models_mask_cut_to_each_sample(lens):
    """Causal, and a local layer's window, among each sample's own tokens: the triangle of its
    length whether it was padded on the left or the right."""
    name, model, cache, tokens, mask, out = lens
    for b, ds in enumerate(out):
        n = ds.sizes["query"]
        q, k = np.arange(n)[:, None], np.arange(n)[None]
        for layer, window in enumerate(WINDOWS[name]):
            expected = (k <= q) & (True if window is None else q - k < window)
            np.testing.assert_array_equal(ds["allowed"].values[layer], expected)


def test_lens_the_mask_does_not_come_from_the_masked_values():
    """A run that writes a finite large negative into the masked scores instead of -inf (what
    another TransformerLens version, or a hook, may write) gives the same Datasets."""
    pytest.importorskip("transformer_lens")
    from oattn_lib.adapters import from_transformer_lens

    model = lens_model("mha")
    tokens, mask = padded_batch()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
        for block in model.blocks:
            block.attn.IGNORE.fill_(-1e5)
        _, finite = model.run_with_cache(tokens, attention_mask=mask)
    assert cache["attn_scores", 0].isinf().any() and finite["attn_scores", 0].isfinite().all()
    for a, b in zip(from_transformer_lens(cache, model, tokens, attention_mask=mask),
                    from_transformer_lens(finite, model, tokens, attention_mask=mask)):
        xr.testing.assert_identical(a, b)


def test_lens_grouped_query_heads_get_their_key_value_head():
    pytest.importorskip("transformer_lens")
    from oattn_lib.adapters import from_transformer_lens

    model = lens_model("gqa", n_heads=6, n_key_value_heads=3)
    tokens, mask = padded_batch()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
    ds = from_transformer_lens(cache, model, tokens, attention_mask=mask)[0]
    np.testing.assert_array_equal(ds["kv_group"].values, [0, 0, 1, 1, 2, 2])
    assert ds.attrs["model_kv_heads"] == 3 and ds.attrs["model_heads"] == 6


def test_lens_texts_are_tokenized_as_the_run_tokenized_them(tmp_path):
    """A model with a tokenizer run on texts, padded on either side: each sample is its prompt's
    tokens (after the BOS token TransformerLens prepends)."""
    pytest.importorskip("transformer_lens")
    from transformers import AutoTokenizer

    from oattn_lib.adapters import from_transformer_lens

    # TransformerLens re-loads the tokenizer from its directory (to add a BOS token)
    tok = word_tokenizer()
    tok.add_special_tokens({"bos_token": "[BOS]"})
    tok.save_pretrained(tmp_path)
    prompts = ["w1 w2 w3 w4 w5", "w7 w8"]
    for side in ("right", "left"):
        tok = AutoTokenizer.from_pretrained(tmp_path, padding_side=side)
        model = lens_model("mha", d_vocab=len(tok))
        model.set_tokenizer(tok, default_padding_side=side)
        with torch.no_grad():
            _, cache = model.run_with_cache(prompts)
        out = from_transformer_lens(cache, model, prompts)
        for prompt, ds in zip(prompts, out):
            assert list(ds["token_text"].values) == ["[BOS]", *prompt.split()], side
            assert ds.attrs["prompt"] == ds.attrs["text"] == prompt
            assert np.isfinite(ds["scores"].values).all()


def test_lens_a_run_that_attended_to_padding_or_lacks_hooks_is_refused():
    pytest.importorskip("transformer_lens")
    from oattn_lib.adapters import from_transformer_lens

    model = lens_model("mha")
    tokens, mask = padded_batch()
    with torch.no_grad():
        _, unmasked = model.run_with_cache(tokens)  # no attention_mask: row 1 attends to its left padding
        _, pattern_only = model.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: "pattern" in n)
    with pytest.raises(ValueError, match=r"sample 1's query at position \d+ attends to position [0-2],"):
        from_transformer_lens(unmasked, model, tokens, attention_mask=mask)
    with pytest.raises(ValueError, match=r"cache: has no blocks\.0\.attn\.hook_q"):
        from_transformer_lens(pattern_only, model, tokens, attention_mask=mask)
    with pytest.raises(ValueError, match=r"prompts_or_tokens: tokens of shape \(batch, pos\) \(3, 9\)"):
        from_transformer_lens(unmasked, model, tokens[:, :9])
    with pytest.raises(ValueError, match="model: expected the HookedTransformer"):
        from_transformer_lens(unmasked, tiny_llama(), tokens)


# -- nnsight -------------------------------------------------------------------------------------
def test_nnsight_gives_what_extract_gives_on_the_wrapped_model():
    nnsight = pytest.importorskip("nnsight")
    from oattn_lib.adapters import from_nnsight

    model, tok = tiny_llama(), word_tokenizer()
    expected = api.extract((model, tok), PROMPTS)
    for wrapped, kw in ((nnsight.LanguageModel(model, tokenizer=tok), {}), (nnsight.NNsight(model), {"tokenizer": tok})):
        out = from_nnsight(wrapped, PROMPTS, **kw)
        assert len(out) == len(PROMPTS)
        for a, b in zip(out, expected):
            xr.testing.assert_identical(a, b)
        assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="tokenizer: the nnsight model of LlamaForCausalLM has no tokenizer"):
        from_nnsight(nnsight.NNsight(model), PROMPTS)
    with pytest.raises(ValueError, match="model: expected an nnsight model"):
        from_nnsight(model, PROMPTS)


@pytest.mark.parametrize("module, extra, call", [("transformer_lens", "lens", "from_transformer_lens"),
                                                  ("nnsight", "nnsight", "from_nnsight")])
def test_a_missing_extra_is_named_with_its_install_command(module, extra, call, monkeypatch):
    from oattn_lib import adapters

    monkeypatch.setitem(sys.modules, module, None)  # an import of it raises ImportError
    with pytest.raises(ImportError, match=re.escape(f"pip install 'oattn[{extra}]'")):
        getattr(adapters, call)(None, None)


# -- into the analysis -----------------------------------------------------------------------------
def test_the_adapters_datasets_go_into_organize_and_entropies():
    out = lens_run("gqa")[-1]
    for ds in out[1:]:  # the left-padded and the right-padded sample
        org = api.organize(ds, device="cpu")
        ent = api.entropies(ds, org)
        assert org.sizes["unit"] == 8 and org.sizes["query"] == ds.sizes["query"]
        assert np.isfinite(ent["head_entropy"].values).all() and np.isfinite(float(ent["network_entropy"]))


# -- the docs' recipes ---------------------------------------------------------------------------
def recipe(heading: str) -> str:
    """The Python block of the section `heading` of docs/how-to/attention.md, as a reader copies it."""
    from doc_pages import REPO, code_blocks

    page = (REPO / "docs" / "how-to" / "attention.md").read_text(encoding="utf-8")
    section = page.split(f"\n### {heading}\n", 1)[1].split("\n#", 1)[0]
    [(_, _, body)] = code_blocks(section, "python")
    return body


def run_recipe(heading: str, where, **names) -> None:
    """Execute the recipe in `where` (with its directory attention/), its free names given."""
    (where / "attention").mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(where)
    try:
        exec(compile(recipe(heading), f"attention.md: {heading}", "exec"), dict(names))
    finally:
        os.chdir(cwd)


def test_the_docs_recipes_write_files_the_attention_kind_reads(tmp_path):
    pytest.importorskip("transformer_lens")
    nnsight = pytest.importorskip("nnsight")
    from oattn_lib.data import attention_files as af

    model = lens_model("gqa")
    tokens, mask = padded_batch()
    run_recipe("From TransformerLens", tmp_path / "lens", model=model, tokens=tokens, attention_mask=mask)
    source = af.checked(tmp_path / "lens" / "attention")
    assert [(s.n_layers, s.n_heads, s.n_query) for s in source.samples] == [(2, 4, 10), (2, 4, 7), (2, 4, 6)]
    sample = af.read_sample(source, 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
    np.testing.assert_array_equal(sample.probs[1], cut(cache["pattern", 1][1], real_positions(mask, 1)))
    np.testing.assert_array_equal(sample.allowed[0], np.tri(7, dtype=bool))

    hf_model, tok = tiny_llama(), word_tokenizer()
    run_recipe("From nnsight", tmp_path / "nnsight", model=nnsight.LanguageModel(hf_model, tokenizer=tok),
               prompts=PROMPTS)
    source = af.checked(tmp_path / "nnsight" / "attention")
    assert [s.n_query for s in source.samples] == [len(p.split()) for p in PROMPTS]
    expected = api.extract((hf_model, tok), PROMPTS[2:])[0]
    sample = af.read_sample(source, 2)
    np.testing.assert_array_equal(sample.scores, expected["scores"].values)
    assert set(source.quantities) == {"scores", "probs"} and "allowed" in source.optional
