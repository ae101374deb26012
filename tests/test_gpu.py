"""The GPU path gives the CPU's results, stage by stage: every stage that takes `device` is run on
the CPU and on CUDA from the same inputs, and its outputs compared (trees and orders exactly,
numbers to float32 rounding). Runs where a CUDA device exists (`bash bench/gpu_check.sh`);
skipped here. `OATTN_TEST_GPU_AS=cpu` puts the CPU in the GPU's place, which checks the tests
themselves on a machine without one (every comparison then holds exactly).
"""
import contextlib
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from oattn_lib import store
from scored_stores import planted, planted_store

GPU = os.environ.get("OATTN_TEST_GPU_AS") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(GPU is None, reason="no CUDA device on this machine")

WORDS = 200
ORGANIZE = {"n_iters": 2, "alpha": 0.0, "beta": 1.0, "eps": 1.0}


@contextlib.contextmanager
def questionnaires_on():
    """The device type of every 2-D questionnaire's input while the block runs (the stages that
    make them: decompose's figure heads, theorem1, organize2d, stability)."""
    import oattn_lib.heads2d
    import oattn_lib.stages.decompose
    import oattn_lib.stages.stability
    import oattn_lib.stages.theorem1
    from oattn_lib.questionnaire import questionnaire2d
    seen = []

    def spy(m, *args, **kwargs):
        seen.append(m.device.type if isinstance(m, torch.Tensor) else "cpu")
        return questionnaire2d(m, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for module in (oattn_lib.heads2d, oattn_lib.stages.decompose, oattn_lib.stages.stability,
                       oattn_lib.stages.theorem1):
            mp.setattr(module, "questionnaire2d", spy)
        yield seen


def _open(path) -> xr.Dataset:
    return store.read_store(path)


def _close(got: xr.Dataset, want: xr.Dataset, names, rtol: float = 1e-4) -> None:
    """Each variable of `names` equal (integers) or equal to float32 rounding: relative to each
    number, and absolute relative to the largest (a coefficient near zero carries the rounding of
    the sums it came from)."""
    for name in names:
        a, b = want[name].values, got[name].values
        if np.issubdtype(a.dtype, np.floating):
            scale = float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else 0.0
            np.testing.assert_allclose(b, a, rtol=rtol, atol=1e-6 * scale + 1e-9, err_msg=name)
        else:
            np.testing.assert_array_equal(b, a, err_msg=name)


def _same_trees(a: xr.Dataset, b: xr.Dataset, names) -> None:
    for name in names:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


# -- a tiny decoder with grouped key/value heads, saved as a user's model -------------------------
@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A random Llama (2 layers x 4 query heads over 2 key/value heads) with a word-level
    tokenizer, its texts, and one attention store per sample extracted on the CPU."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from oattn_lib.stages.extract import extract
    d = tmp_path_factory.mktemp("gpu_decoder")
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(d / "llm")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=WORDS + 2, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # weights large enough that heads matter
        for p in model.model.layers.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    model.save_pretrained(d / "llm")
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, WORDS, 80)) for _ in range(12)]
    (d / "meta.json").write_text(json.dumps({"kind": "hf", "test_texts": texts}))
    mcfg = {"name": "llm", "kind": "hf", "path": str(d / "llm"),
            "extract": {"n_samples": 3, "seed": 0, "max_length": 24, "dtype": "float32"}}
    stores = [d / f"sample{i}.zarr" for i in range(3)]
    for i, out in enumerate(stores):
        extract("hf", mcfg, None, d / "meta.json", None, out, i, device="cpu")
    return d, mcfg, stores


def test_extraction_on_the_gpu_gives_the_cpus_attention(decoder, tmp_path):
    from oattn_lib.stages.extract import extract
    d, mcfg, stores = decoder
    extract("hf", mcfg, None, d / "meta.json", None, tmp_path / "gpu.zarr", 0, device=GPU)
    cpu, gpu = _open(stores[0]), _open(tmp_path / "gpu.zarr")
    assert set(cpu.variables) == set(gpu.variables)
    np.testing.assert_array_equal(gpu["allowed"].values, cpu["allowed"].values)
    np.testing.assert_array_equal(gpu["kv_group"].values, cpu["kv_group"].values)
    # a causal decoder: the scores of future keys are not the model's, the allowed ones are
    allowed = cpu["allowed"].values[:, None]
    for name, atol in (("scores", 1e-4), ("probs", 1e-5)):
        a, b = cpu[name].values, gpu[name].values
        np.testing.assert_allclose(np.where(allowed, b, 0), np.where(allowed, a, 0), atol=atol, rtol=1e-4,
                                   err_msg=name)


def test_pruning_on_the_gpu_measures_what_the_cpu_measures(decoder, tmp_path):
    """Gradient importance, every mask's held-out perplexity and the rankings they make."""
    from oattn_lib.config import SCHEMA, validate_config
    from oattn_lib.stages import prune as prune_stage
    d, mcfg, stores = decoder
    config = {"models": [{"name": "m", "kind": "txl", "extract": {}}],
              "prune": {"random_seeds": 2, "held_out": {"hf_windows": 4}, "batch_size": 8}}
    validate_config(config, str(SCHEMA))
    params = {k: v for k, v in config["prune"].items() if k != "enabled"}
    haar = np.random.default_rng(0).random((3, 2, 4))
    store.write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), haar)},
                                 coords={n: np.arange(k) for n, k in zip(("sample", "layer", "head"), haar.shape)}),
                      tmp_path / "entropy.zarr")
    got = {}
    for dev in ("cpu", GPU):
        o = tmp_path / dev
        o.mkdir(exist_ok=True)
        outs = {k: o / f"{k}.{ext}" for k, ext in (("curves", "csv"), ("rankings", "csv"), ("finding", "rst"),
                                                   ("fig7", "png"), ("table3_csv", "csv"), ("table3_md", "md"),
                                                   ("table4_csv", "csv"), ("table4_md", "md"), ("bottom", "csv"))}
        prune_stage.prune("hf", mcfg, None, d / "meta.json", None, stores, tmp_path / "entropy.zarr", outs,
                          fraction=0.25, device=dev, **params)
        got[dev] = {k: pd.read_csv(outs[k]) for k in ("curves", "rankings", "table3_csv", "bottom")}
    a, b = got["cpu"], got[GPU]
    for name in ("curves", "rankings", "bottom"):
        assert list(a[name].columns) == list(b[name].columns)
        num = a[name].select_dtypes("number").columns
        pd.testing.assert_frame_equal(a[name].drop(columns=num), b[name].drop(columns=num))
        np.testing.assert_allclose(b[name][num].to_numpy(float), a[name][num].to_numpy(float), rtol=2e-4,
                                   atol=1e-6, err_msg=name)


# -- the analysis stages on planted stores ----------------------------------------------------
@pytest.fixture(scope="module", params=[False, True], ids=["bidirectional", "causal"])
def analysed(request, tmp_path_factory):
    """Two planted samples (bidirectional or causal) through organize, decompose and entropy on
    the CPU and on the GPU: {device: (attention stores, organized, decomposed, entropy store)}.
    Both devices decompose the CPU's organization, so that their expansions are in one order
    (the organizations themselves are compared as folders: sibling order follows an
    eigenvector's sign, which rounding may flip where two folders tie)."""
    from oattn_lib.stages.decompose import decompose
    from oattn_lib.stages.entropy import entropy
    from oattn_lib.stages.organize import organize
    d = tmp_path_factory.mktemp("gpu_analysis")
    att = [planted_store(d / f"att{i}.zarr", planted(i), causal=request.param) for i in range(2)]
    out = {}
    for dev in ("cpu", GPU):
        org, dec = ([d / f"{dev}_{k}{i}.zarr" for i in range(2)] for k in ("org", "dec"))
        with questionnaires_on() as seen:
            for i in range(2):
                organize(att[i], org[i], "scores", params=ORGANIZE, device=dev)
                decompose(att[i], out["cpu"][1][i] if out else org[i], dec[i], "scores",
                          figure_heads=[[0, 0], [-1, -1]], questionnaire2d_iters=2, random_tree_seeds=1, device=dev)
        assert seen == [torch.device(dev).type] * 4  # two figure heads a sample, on the device asked for
        entropy(dec, d / f"{dev}_entropy.zarr", head_top_k=40, network_top_k=20)
        out[dev] = (att, org, dec, d / f"{dev}_entropy.zarr")
    return out


def test_organize_decompose_and_entropy_on_the_gpu_give_the_cpus(analysed):
    from oattn_lib.stability import same_folders
    from oattn_lib.network import load_organization
    for i in range(2):
        a, b = (load_organization(analysed[dev][1][i])[0] for dev in ("cpu", GPU))
        for axis in "qkh":
            assert same_folders(getattr(b, f"tree_{axis}"), getattr(a, f"tree_{axis}")), axis
        a, b = _open(analysed["cpu"][1][i]), _open(analysed[GPU][1][i])
        for v in ("affinity_q", "affinity_k", "affinity_h"):
            np.testing.assert_allclose(b[v].values, a[v].values, atol=1e-6, err_msg=v)
        a, b = _open(analysed["cpu"][2][i]), _open(analysed[GPU][2][i])
        assert set(a.data_vars) == set(b.data_vars)
        # the figure heads' own 2-D organizations: the same trees, so the same paraproduct
        _same_trees(a, b, ("fig_row_tree", "fig_col_tree"))
        _close(b, a, a.data_vars)
    a, b = _open(analysed["cpu"][3]), _open(analysed[GPU][3])
    _close(b, a, a.data_vars)


def test_theorem1_on_the_gpu_gives_the_cpus_table(analysed, tmp_path):
    from oattn_lib.stages.theorem1 import theorem1
    att = analysed["cpu"][0]
    tables = {}
    for dev in ("cpu", GPU):
        with questionnaires_on() as seen:
            theorem1("planted", att, tmp_path / f"{dev}.csv", samples=2, max_heads=8, random_orders=1, seed=0,
                     questionnaire2d_iters=2, out_curves=tmp_path / f"{dev}_curves.csv", temperature_taus=3,
                     device=dev)
        assert seen == [torch.device(dev).type] * 16  # every head of both samples
        tables[dev] = pd.read_csv(tmp_path / f"{dev}.csv"), pd.read_csv(tmp_path / f"{dev}_curves.csv")
    for a, b in zip(tables["cpu"], tables[GPU]):
        assert len(a) and len(a) == len(b)
        # the 2-D organized orders are the same, and the measures are computed on the CPU from them
        pd.testing.assert_frame_equal(a, b)


def test_organize2d_on_the_gpu_gives_the_cpus_organizations(analysed, tmp_path):
    from oattn_lib.stages.organize2d import organize2d
    att, _, dec, ent = analysed["cpu"]
    for dev in ("cpu", GPU):
        with questionnaires_on() as seen:
            organize2d(att[0], dec[0], ent, tmp_path / f"{dev}.zarr", quantity="scores", figure_heads=[[0, 0]],
                       heads_2d=5, questionnaire2d_iters=2, device=dev)
        assert seen == [torch.device(dev).type] * 4  # the figure head is the decompose stage's
    a, b = _open(tmp_path / "cpu.zarr"), _open(tmp_path / f"{GPU}.zarr")
    assert a.sizes["unit2d"] == 5
    _same_trees(a, b, ("row_tree", "col_tree", "unit2d"))
    for v in ("residual", "rel_residual", "rel_residual_unorganized"):
        np.testing.assert_allclose(b[v].values, a[v].values, rtol=1e-5, atol=1e-7, err_msg=v)


def test_stability_on_the_gpu_gives_the_cpus_replicates(analysed, tmp_path):
    from oattn_lib.stages.stability import stability
    att, org, dec, ent = analysed["cpu"]
    settings = dict(replicates=1, perturbations=["ulp", "float16", "relabel", "sibling"], ulp_fraction=0.05,
                    seed=0, bootstrap=20, paraproduct=True)
    for dev in ("cpu", GPU):
        with questionnaires_on() as seen:
            stability(att, org, dec, ent, tmp_path / f"{dev}.zarr", tmp_path / f"{dev}.csv",
                      tmp_path / f"{dev}.md", samples=[0, 1], quantity="scores", organize=ORGANIZE, head_top_k=40,
                      network_top_k=20, settings=settings, fraction=0.25, questionnaire2d_iters=2,
                      model_name="planted", device=dev)
        assert seen and set(seen) == {torch.device(dev).type}
    a, b = _open(tmp_path / "cpu.zarr"), _open(tmp_path / f"{GPU}.zarr")
    assert set(a.data_vars) == set(b.data_vars) and len(a.data_vars)
    _close(b, a, a.data_vars)


def test_training_on_the_gpu_follows_the_cpus_losses():
    """A few steps of a Transformer-XL without dropout (the GPU's random streams are its own):
    the same losses to float32 rounding, step by step."""
    from oattn_lib.models import TransformerXL, TXLConfig
    from oattn_lib.train import train_txl
    stream = torch.randint(0, 30, (13,), generator=torch.Generator().manual_seed(0)).repeat(60)
    losses = {}
    for dev in ("cpu", GPU):
        cfg = TXLConfig(n_token=30, n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, dropout=0.0,
                        tgt_len=16, mem_len=16)
        model = TransformerXL(cfg, seed=0)
        res = train_txl(model, stream[:600], stream[600:], steps=8, batch_size=2, lr=1e-3, warmup=2, seed=1,
                        device=dev, progress=False, log_every=2)
        losses[dev] = [h["loss"] for h in res["history"]] + [res["valid_ppl"]]
    assert len(losses["cpu"]) == 5
    np.testing.assert_allclose(losses[GPU], losses["cpu"], rtol=1e-4)
