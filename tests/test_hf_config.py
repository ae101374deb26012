"""The bigger-model features of hf models through the workflow's config (docs/method.md §9.4):
`extract.compute_dtype`, the entry's `device_map`, and the stacks of encoder-decoder models
(`extract.stack`, `data.target_field`), from the config checks through the extract stage to one
real workflow run on a tiny random T5's cross-attention.

Tiny randomly initialised T5, BART and Llama models are built from transformers' config classes
and saved with an offline word-level tokenizer; nothing is downloaded.
"""
import copy
import json
import re

import numpy as np
import pytest
import torch
import xarray as xr

from oattn_lib.config import ConfigError, complete_model
from oattn_lib.models.sizes import n_units
from oattn_lib.models import hf_recording
from oattn_lib.stages.data import prepare_data
from oattn_lib.stages.extract import extract_samples

import wfutil
from test_hf_bigger import WORDS, save_llama, word_tokenizer

SMALL = {"head_top_k": 16, "network_top_k": 10}
MAX_LEN = 12
# the encoder reads 14 words (cut to 11 and [EOS]), the decoder 4 or 5 other words and [EOS]:
# lengths 12 and 5 or 6, so that a transposed cross-attention head cannot pass
RECORDS = [{"src": " ".join(WORDS[(3 * i + j) % 30] for j in range(14)),
            "tgt": " ".join(WORDS[30 + (i + j) % 10] for j in range(4 + i % 2))} for i in range(3)]
EAGER_FIELDS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}
# (layers, heads) of each stack: more decoder than encoder layers (and, in BART, heads), so that a
# stack read from the wrong keys of config.json shows
UNITS = {"t5": {"encoder": (2, 2), "decoder": (3, 2), "cross": (3, 2)},
         "bart": {"encoder": (2, 2), "decoder": (3, 4), "cross": (3, 4)}}


def _t5():
    from transformers import T5Config, T5Model
    return T5Model, T5Config(vocab_size=len(WORDS) + 3, d_model=16, d_kv=8, d_ff=32, num_layers=2,
                             num_decoder_layers=3, num_heads=2, decoder_start_token_id=0, pad_token_id=0,
                             eos_token_id=2, dropout_rate=0.0)


def _bart():
    from transformers import BartConfig, BartModel
    return BartModel, BartConfig(vocab_size=len(WORDS) + 3, d_model=16, encoder_layers=2, decoder_layers=3,
                                 encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=32,
                                 decoder_ffn_dim=32, init_std=0.3, pad_token_id=0, eos_token_id=2,
                                 bos_token_id=None, decoder_start_token_id=2, forced_eos_token_id=None)


SEQ2SEQ = {"t5": _t5, "bart": _bart}


def _save_seq2seq(name, directory):
    cls, cfg = SEQ2SEQ[name]()
    torch.manual_seed(0)
    cls(cfg).eval().save_pretrained(directory)
    word_tokenizer(directory, eos=True)
    return directory


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return _save_seq2seq("t5", tmp_path_factory.mktemp("t5"))


@pytest.fixture(scope="module", params=sorted(SEQ2SEQ))
def seq2seq_dir(request, tmp_path_factory, t5_dir):
    return request.param, t5_dir if request.param == "t5" else _save_seq2seq("bart", tmp_path_factory.mktemp("bart"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_llama(tmp_path_factory)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("texts") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def seq2seq_entry(path, jsonl, stack, name=None, target=True, **extract):
    data = {"texts": str(jsonl), "field": "src", **({"target_field": "tgt"} if target else {})}
    return {"name": name or f"s2s-{stack}", "kind": "hf", "path": str(path), "data": data,
            "extract": {"n_samples": 2, "max_length": MAX_LEN, "stack": stack, **extract},
            "prune": {"enabled": False}}


def _extract(m, d, n=2):
    prepare_data("hf", m["data"], d / "d.npz", d / "meta.json")
    outs = [d / f"{m['name']}-{i}.zarr" for i in range(n)]
    extract_samples("hf", m, d / "d.npz", d / "meta.json", None, outs, list(range(n)), device="cpu")
    return [xr.open_zarr(o, consolidated=False) for o in outs]


# -- the config -------------------------------------------------------------------------------
def _error(model, **sections) -> str:
    with pytest.raises(ConfigError) as err:
        complete_model(model, entropy=SMALL, **sections)
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_each_stack_has_its_own_layers_and_heads_from_config_json(seq2seq_dir, jsonl):
    name, d = seq2seq_dir
    for stack, units in UNITS[name].items():
        assert n_units(complete_model(seq2seq_entry(d, jsonl, stack), entropy=SMALL)) == units


@pytest.mark.parametrize("edit, expect", [
    (lambda m: m["extract"].pop("stack"),
     r"^models\[0\].extract.stack: '.*' is an encoder-decoder model; .*allowed: encoder, decoder, cross$"),
    (lambda m: m["extract"].update(stack="both"), r"^models\[0\].extract.stack: 'both' is not one of"),
    (lambda m: m.pop("prune"), r"^models\[0\].prune: the ablation of an encoder-decoder model \(s2s-cross\) is "
                               r"not supported; set models\[0\].prune: \{enabled: false\}$"),
    (lambda m: m["data"].update(target_field="nope"), r"^models\[0\].data.target_field: .* no field 'nope'"),
    (lambda m: m["data"].pop("texts"), r"^models\[0\].data.field: only applies to the user's own texts"),
    (lambda m: m["data"].update(chat=True), r"^models\[0\].data.chat: an encoder-decoder model reads the text"),
    (lambda m: m["extract"].update(layers=[3]), r"^models\[0\] \(s2s-cross\).extract.layers: \[3\] outside the "
                                                r"model's 3 layers"),
])
def test_bad_encoder_decoder_entries_are_one_line_naming_the_key(t5_dir, jsonl, edit, expect):
    m = seq2seq_entry(t5_dir, jsonl, "cross")
    edit(m)
    assert re.search(expect, _error(m))


def test_target_field_alone_names_its_key(t5_dir, jsonl):
    m = seq2seq_entry(t5_dir, jsonl, "cross")
    m["data"] = {"target_field": "tgt"}
    assert re.search(r"^models\[0\].data.target_field: only applies to the user's own texts", _error(m))


def test_stack_and_target_field_are_refused_for_other_models(llama_dir, jsonl):
    m = {"name": "ll", "kind": "hf", "path": str(llama_dir), "data": {"texts": str(jsonl), "field": "src"},
         "extract": {"n_samples": 2, "max_length": MAX_LEN}}
    assert complete_model(m, entropy=SMALL)["extract"]["compute_dtype"] == "float32"
    assert re.search(r"^models\[0\].extract.stack: '.*' is not an encoder-decoder model; remove extract.stack$",
                     _error({**m, "extract": {**m["extract"], "stack": "encoder"}}))
    assert re.search(r"^models\[0\].data.target_field: only applies to encoder-decoder models",
                     _error({**m, "data": {**m["data"], "target_field": "tgt"}}))
    txl = {"name": "t", "kind": "txl", "extract": {"n_samples": 2, "stack": "cross"}}
    assert re.search(r"^models\[0\].extract.stack: 'cross' applies only to encoder-decoder hf models", _error(txl))


def test_compute_dtype_and_device_map_are_for_hf_models_only(llama_dir, jsonl):
    txl = {"name": "t", "kind": "txl", "extract": {"n_samples": 2}}
    assert complete_model(txl, entropy=SMALL)["extract"]["compute_dtype"] == "float32"
    assert re.search(r"^models\[0\].extract.compute_dtype: 'bfloat16', but a txl model computes in float32 only",
                     _error({**txl, "extract": {"n_samples": 2, "compute_dtype": "bfloat16"}}))
    assert re.search(r"^models\[0\].device_map: only hf models", _error({**txl, "device_map": "auto"}))
    vit = {"name": "v", "kind": "vit", "extract": {"n_samples": 2, "compute_dtype": "float16"}}
    assert _error(vit).startswith("models[0].extract.compute_dtype: 'float16', but a vit model")

    m = {"name": "ll", "kind": "hf", "path": str(llama_dir), "data": {"texts": str(jsonl), "field": "src"},
         "extract": {"n_samples": 2, "max_length": MAX_LEN}, "prune": {"enabled": False}}
    for dtype in ("bfloat16", "float16"):  # float16 on `device: auto` is load_hf's to check, on the machine
        assert complete_model({**m, "extract": {**m["extract"], "compute_dtype": dtype}},
                              entropy=SMALL)["extract"]["compute_dtype"] == dtype
    f16 = {**m, "extract": {**m["extract"], "compute_dtype": "float16"}}
    assert re.search(r"^models\[0\].extract.compute_dtype: float16 runs on a GPU only, and device is cpu",
                     _error(f16, device="cpu"))
    assert re.search(r"^models\[0\].extract.compute_dtype: 'half' is not one of",
                     _error({**m, "extract": {**m["extract"], "compute_dtype": "half"}}))
    for device_map in ("auto", "balanced", "sequential", {"": "cpu"}, {"layers.0": 0, "norm": "cpu"}):
        assert complete_model({**m, "device_map": device_map}, entropy=SMALL)["device_map"] == device_map
    assert re.search(r"^models\[0\].device_map: 'everywhere' is not one of \['auto', 'balanced', 'sequential'\]",
                     _error({**m, "device_map": "everywhere"}))
    assert re.search(r"^models\[0\].device_map", _error({**m, "device_map": ["cpu"]}))


# -- encoder-decoder extraction -------------------------------------------------------------------
@pytest.fixture(scope="module")
def stacks(seq2seq_dir, jsonl, tmp_path_factory):
    """The two samples of each stack, extracted by three entries with the same path."""
    name, d = seq2seq_dir
    out = tmp_path_factory.mktemp(f"{name}_stores")
    return name, d, {s: _extract(complete_model(seq2seq_entry(d, jsonl, s), entropy=SMALL), out)
                     for s in ("encoder", "decoder", "cross")}


def test_each_stack_is_transformers_eager_attention(stacks):
    name, d, stores = stacks
    cls, _ = SEQ2SEQ[name]()
    eager = cls.from_pretrained(d, attn_implementation="eager").eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    for i in range(2):
        inputs = hf_recording.hf_seq2seq_encode(eager, tok, [RECORDS[i]["src"]], [RECORDS[i]["tgt"]], MAX_LEN)
        with torch.no_grad():
            ref = eager(**inputs, output_attentions=True, use_cache=False)
        n_enc, n_dec = inputs["input_ids"].shape[1], inputs["decoder_input_ids"].shape[1]
        assert n_enc == MAX_LEN and n_dec == 5 + i % 2
        shapes = {"encoder": (n_enc, n_enc), "decoder": (n_dec, n_dec), "cross": (n_dec, n_enc)}
        for stack, ds in ((s, v[i]) for s, v in stores.items()):
            layers, heads = UNITS[name][stack]
            want = torch.stack(getattr(ref, EAGER_FIELDS[stack]))[:, 0].numpy()
            assert ds["probs"].shape == (layers, heads, *shapes[stack]), (stack, ds["probs"].shape)
            np.testing.assert_allclose(ds["probs"].values, want, rtol=0, atol=1e-6, err_msg=stack)
            # the scores are the logits before the mask (T5: with its relative position bias)
            masked = np.where(ds["allowed"].values[:, None], ds["scores"].values, -np.inf)
            soft = np.exp(masked - masked.max(-1, keepdims=True))
            np.testing.assert_allclose(ds["probs"].values, soft / soft.sum(-1, keepdims=True), rtol=0, atol=1e-6)
            assert ds.attrs["stack"] == stack and ds.attrs["compute_dtype"] == "float32"
            assert ds.attrs["model_layers"] == layers and ds.attrs["model_heads"] == heads
            query_ids = inputs["input_ids" if stack == "encoder" else "decoder_input_ids"][0].tolist()
            assert ds["token"].values.tolist() == query_ids
            assert json.loads(ds.attrs["token_text"]) == tok.convert_ids_to_tokens(query_ids)
            assert ("key_token_text" in ds.attrs) == (stack == "cross")
        cross = stores["cross"][i]
        assert json.loads(cross.attrs["key_token_text"]) == tok.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
        # the decoder reads the target shifted right, after the decoder start token (teacher forcing)
        target = tok(RECORDS[i]["tgt"])["input_ids"]
        assert cross["token"].values.tolist() == [eager.config.decoder_start_token_id, *target[:-1]]
        # the decoder's own mask is causal; cross-attention may attend to every encoder position
        assert (stores["decoder"][i]["allowed"].values == np.tril(np.ones((n_dec, n_dec), bool))).all()
        assert cross["allowed"].values.all()
    # not degenerate: the comparisons above test something
    assert 0.2 < float(stores["cross"][0]["probs"].max()) < 0.999


def test_without_target_field_the_decoder_reads_the_text(t5_dir, jsonl, tmp_path):
    m = complete_model(seq2seq_entry(t5_dir, jsonl, "decoder", target=False), entropy=SMALL)
    ds = _extract(m, tmp_path, n=1)[0]
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(t5_dir)(RECORDS[0]["src"], truncation=True, max_length=MAX_LEN)["input_ids"]
    assert ds["token"].values.tolist() == [0, *enc[:-1]] and ds.sizes["query"] == ds.sizes["key"] == MAX_LEN


# -- compute dtype and device_map -------------------------------------------------------------------
def llama_entry(llama_dir, jsonl, **extra):
    return complete_model({"name": "ll", "kind": "hf", "path": str(llama_dir),
                           "data": {"texts": str(jsonl), "field": "src"},
                           "extract": {"n_samples": 2, "max_length": MAX_LEN, **extra.pop("extract", {})},
                           "prune": {"enabled": False}, **extra}, entropy=SMALL)


@pytest.fixture(scope="module")
def llama_fp32(llama_dir, jsonl, tmp_path_factory):
    return _extract(llama_entry(llama_dir, jsonl), tmp_path_factory.mktemp("fp32"))


def test_device_map_auto_extracts_the_same_store(llama_dir, jsonl, llama_fp32, tmp_path):
    spread = _extract(llama_entry(llama_dir, jsonl, device_map="auto"), tmp_path)
    for a, b in zip(llama_fp32, spread):
        for name in ("scores", "probs", "allowed", "token", "kv_group"):
            if torch.cuda.is_available() and name in ("scores", "probs"):  # other kernels, other rounding
                np.testing.assert_allclose(b[name].values, a[name].values, rtol=1e-4, atol=1e-4)
            else:
                assert np.array_equal(b[name].values, a[name].values), name
        assert b.attrs["compute_dtype"] == "float32"


def test_bfloat16_runs_the_forward_pass_and_stores_float32(llama_dir, jsonl, llama_fp32, tmp_path):
    half = _extract(llama_entry(llama_dir, jsonl, extract={"compute_dtype": "bfloat16"}), tmp_path)
    for a, b in zip(llama_fp32, half):
        assert b.attrs["compute_dtype"] == "bfloat16" and b.attrs["dtype"] == "float32"
        assert b["scores"].dtype == b["probs"].dtype == np.float32
        scores = b["scores"].values
        # the logits are bfloat16 numbers; the float32 model's are not
        assert torch.equal(torch.from_numpy(scores).to(torch.bfloat16).float(), torch.from_numpy(scores))
        diff = np.abs(b["probs"].values - a["probs"].values)
        assert 1e-4 < diff.max() < 0.1 and diff.mean() < 5e-3
        assert np.array_equal(b["allowed"].values, a["allowed"].values)


# -- the workflow ----------------------------------------------------------------------------------
def workflow_config(t5_dir, jsonl, stacks=("cross",)) -> dict:
    cfg = copy.deepcopy(wfutil.TINY)
    cfg["models"] = [seq2seq_entry(t5_dir, jsonl, s, name=f"t5-{s}") for s in stacks]
    for m in cfg["models"]:
        m["extract"]["quantity"] = "scores"
    cfg["explorer"] = {"heads_2d": 2}
    cfg["jobs"] = {"batch_max_entries": 20000}
    return cfg


# the slow tier (CI): a whole run of a T5; make test keeps each stack's extraction against
# transformers' eager attention (test_each_stack_is_transformers_eager_attention)
@pytest.mark.slow
@pytest.mark.workflow
def test_workflow_runs_the_cross_attention_of_a_t5_end_to_end(t5_dir, jsonl, tmp_path):
    wfutil.snakemake(tmp_path, workflow_config(t5_dir, jsonl))
    res = tmp_path / "results"
    for i in range(2):
        att = xr.open_zarr(res / "t5-cross" / "attention" / f"sample{i}.zarr", consolidated=False)
        n_dec = 5 + i % 2
        assert att["probs"].shape == (3, 2, n_dec, MAX_LEN) and att.attrs["stack"] == "cross"
        org = xr.open_zarr(res / "t5-cross" / "organized" / f"sample{i}.zarr", consolidated=False)
        assert org.sizes["query"] == n_dec and org.sizes["key"] == MAX_LEN
    ent = xr.open_zarr(res / "t5-cross" / "entropy.zarr", consolidated=False)
    assert ent.sizes["sample"] == 2 and np.isfinite(ent["head_entropy"].values).all()
    for f in ("tables/table1.md", "tables/table2.md", "figures/fig1.png", "figures/fig6.png"):
        assert (res / "t5-cross" / f).is_file(), f
    # the explorer labels the keys by the encoder's tokens (its queries by the decoder's)
    page = (res / "t5-cross" / "explorer.html").read_text()
    for i in range(2):
        keys = [*RECORDS[i]["src"].split()[:MAX_LEN - 1], "[EOS]"]
        assert '"key_tokens":' + json.dumps(keys, separators=(",", ":")) in page
    assert "t5-cross" in (res / "summary.md").read_text()
    assert not (res / "t5-cross" / "prune").exists()
