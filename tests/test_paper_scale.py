"""The paper's scale on this machine: the preset plans the full graph offline, the download
rules are skipped when the files are there and fail with the file named when they are not,
the paper's Transformer-XL and ViT-B/16 (random initialisation, CPU) go through
extraction with the right network tensors, and the per-sample analysis runs on them.

The model tests are `slow` (about 1.2 GB of TXL weights; minutes of analysis); the
dry runs are not.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "workflow" / "presets" / "paper.yaml"
WIKITEXT = [f"wikitext-103/wiki.{s}.tokens" for s in ("train", "valid", "test")]
CIFAR = [f"cifar-10-batches-py/data_batch_{i}" for i in range(1, 6)] + ["cifar-10-batches-py/test_batch"]


def paper_models() -> dict:
    """The preset's models as the stages receive them (schema defaults filled in)."""
    from oattn_lib.config import complete_model
    return {m["kind"]: complete_model(m) for m in yaml.safe_load(PAPER.read_text())["models"]}


def offline_env(tmp_path: Path) -> dict:
    """No network (every HTTP(S) request goes to a closed local port), an empty torch cache."""
    dead = "http://127.0.0.1:9"
    return {**os.environ, "http_proxy": dead, "https_proxy": dead, "HTTP_PROXY": dead,
            "HTTPS_PROXY": dead, "no_proxy": "", "NO_PROXY": "", "TORCH_HOME": str(tmp_path / "torch"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}


def paper_snakemake(tmp_path: Path, monkeypatch, *args: str):
    """`snakemake ARGS` on the paper preset in the repository, offline (`offline_env`), with the
    results and the data under tmp_path; through the suite's command server (wfutil)."""
    from wfutil import run_snakemake

    for var, value in offline_env(tmp_path).items():
        monkeypatch.setenv(var, value)
    return run_snakemake(["--nolock", "--configfile", PAPER, "--config", f"results={tmp_path / 'results'}",
                          f"data_root={tmp_path / 'resources'}", *args], cwd=ROOT, timeout=600)


def job_counts(output: str) -> dict[str, int]:
    """The `Job stats` table of a dry run: rule -> number of jobs."""
    table = output.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        m = re.fullmatch(r"\s*(\S+)\s+(\d+)\s*", line)
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def dry_run(tmp_path: Path, monkeypatch, *extra: str) -> dict[str, int]:
    res = paper_snakemake(tmp_path, monkeypatch, "-n", *extra)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return job_counts(res.stdout + res.stderr)


# -- the preset plans everything, offline ------------------------------------------------
def test_paper_preset_plans_the_full_graph_offline(tmp_path, monkeypatch):
    counts = dry_run(tmp_path, monkeypatch)
    n = 10 * 3  # 10 samples of each of the three models
    assert counts["extract"] == counts["organize"] == counts["decompose"] == n
    assert counts["entropy"] == counts["tables"] == counts["figures"] == 3
    assert counts["prepare_data"] == 3 and counts["train"] == 2 and counts["summary"] == 1
    # nothing there yet: the datasets and the ViT-B/16 weights are fetched, once each
    assert counts["download_wikitext103"] == counts["download_cifar10"] == 1
    assert counts["download_vit_b_16_weights"] == 1


def test_downloads_are_skipped_when_the_files_are_there(tmp_path, monkeypatch):
    for f in WIKITEXT + CIFAR:
        (tmp_path / "resources" / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "resources" / f).write_text("placeholder\n")
    weights = tmp_path / "torch" / "hub" / "checkpoints" / "vit_b_16-c867db91.pth"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"placeholder")
    counts = dry_run(tmp_path, monkeypatch)
    assert not {r for r in counts if r.startswith("download")}
    assert counts["prepare_data"] == 3 and counts["extract"] == 30


@pytest.mark.workflow
def test_offline_download_names_the_missing_file(tmp_path, monkeypatch):
    target = tmp_path / "resources" / "cifar-10-batches-py" / "test_batch"
    res = paper_snakemake(tmp_path, monkeypatch, "--cores", "1", "--drop-metadata", "--", str(target))
    assert res.returncode != 0
    log = (tmp_path / "results" / "logs" / "download" / "cifar10.log").read_text()
    assert "cifar-10-python.tar.gz" in log                  # the archive it tried to fetch
    assert str(target) in log                               # the file the workflow needs
    assert "provide the files yourself" in log
    assert not target.exists()


def test_vit_b_16_offline_error_names_the_cache_path(tmp_path, monkeypatch):
    from oattn_lib.models.vision_transformer import build_vit_b_16, vit_b_16_weights_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    path = vit_b_16_weights_path()
    assert path == tmp_path / "torch" / "hub" / "checkpoints" / "vit_b_16-c867db91.pth"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        build_vit_b_16(pretrained=True, download=False)
    for var in ("http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        build_vit_b_16(pretrained=True)                     # tries the download, which fails
    assert not path.exists()


@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "xdg"}, {"TORCH_HOME": "th", "XDG_CACHE_HOME": "xdg"},
                                 {"TORCH_HOME": "~/th"}])
def test_planning_finds_the_vit_weights_where_torch_does_without_importing_it(env, tmp_path, monkeypatch):
    """The paper preset's plan names the weights file (the download rule's target) from
    models.files, which agrees with torchvision's URL and torch.hub's directory under each
    variable torch reads, and plans without importing torch or torchvision."""
    from torchvision.models import ViT_B_16_Weights

    from oattn_lib.models import files
    from oattn_lib.models.vision_transformer import vit_b_16_weights_path

    for var in ("TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value if value.startswith("~") else str(tmp_path / value))
    assert files.VIT_B_16_URL == ViT_B_16_Weights.IMAGENET1K_V1.url
    assert files.torch_hub_dir() == Path(torch.hub.get_dir())
    assert files.vit_b_16_weights_file() == vit_b_16_weights_path()
    vit = paper_models()["vit"]
    code = ("import json, sys\nfrom oattn_lib.models.kinds import adapter\n"
            f"m = {vit!r}\nprint(json.dumps([adapter(m).pretrained_weights(m), 'torch' in sys.modules, "
            "'torchvision' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == [str(vit_b_16_weights_path()), False, False]


@pytest.mark.slow
def test_vit_b_16_loads_cached_weights_and_replaces_the_head(tmp_path, monkeypatch):
    from torchvision.models import vit_b_16

    from oattn_lib.models.vision_transformer import build_vit_b_16, vit_b_16_weights_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    torch.manual_seed(1)
    imagenet = vit_b_16(weights=None)                       # stands in for the 1000-class weights
    torch.nn.init.normal_(imagenet.heads.head.weight)
    path = vit_b_16_weights_path()
    path.parent.mkdir(parents=True)
    torch.save(imagenet.state_dict(), path)
    model = build_vit_b_16(num_classes=10, pretrained=True, download=False)
    assert model.heads.head.out_features == 10 and not model.heads.head.weight.any()
    ref = imagenet.state_dict()
    for name, value in model.state_dict().items():
        if not name.startswith("heads."):
            assert torch.equal(value, ref[name]), name


# -- paper-size models through extraction -------------------------------------------------
def masked_softmax(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    s = scores.astype(np.float64)
    if mask is not None:
        s = np.where(mask, -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def save_checkpoint(path: Path, kind: str, model_cfg: dict, net: torch.nn.Module) -> None:
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    torch.save({"kind": kind, "arch": model_cfg["arch"], "data": model_cfg["data"],
                "state_dict": state}, path)


@pytest.fixture(scope="module")
def paper_stores(tmp_path_factory):
    """Sample 0 of the paper's TXL and ViT-B/16 (random init, CPU), extracted by the
    workflow's own extract stage from checkpoints and dataset files in its formats."""
    from oattn_lib.stages import extract as extract_stage
    from oattn_lib.models.transformer_xl import TransformerXL, TXLConfig
    from oattn_lib.models.vision_transformer import build_vit_b_16

    tmp = tmp_path_factory.mktemp("paper")
    models = paper_models()
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    out = {}

    txl = models["txl"]
    n_token = 267735                                         # WikiText-103's vocabulary
    (tmp / "txl_meta.json").write_text(json.dumps({"kind": "txl", "vocab": [f"w{i}" for i in range(n_token)]}))
    tgt = txl["arch"]["tgt_len"]
    np.savez(tmp / "txl.npz", train=rng.integers(0, n_token, 4 * tgt), valid=rng.integers(0, n_token, 4 * tgt),
             test=rng.integers(0, n_token, (txl["extract"]["n_samples"] + 2) * tgt))
    net = TransformerXL(TXLConfig(n_token=n_token, **{**txl["arch"], "cutoffs": tuple(txl["arch"]["cutoffs"])}))
    save_checkpoint(tmp / "txl.pt", "txl", txl, net)
    del net
    out["txl"] = tmp / "txl_sample0.zarr"
    extract_stage.extract("txl", txl, tmp / "txl.npz", tmp / "txl_meta.json", tmp / "txl.pt", out["txl"],
                     sample=0, device="cpu", config_slice=txl)

    vit = models["vit"]
    (tmp / "vit_meta.json").write_text(json.dumps({"kind": "vit", "dataset": "cifar10", "image_size": 224}))
    np.savez(tmp / "vit.npz", train_images=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8),
             train_labels=rng.integers(0, 10, 4), test_images=rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8),
             test_labels=rng.integers(0, 10, 12))
    save_checkpoint(tmp / "vit.pt", "vit", vit, build_vit_b_16(num_classes=10, pretrained=False))
    out["vit"] = tmp / "vit_sample0.zarr"
    extract_stage.extract("vit", vit, tmp / "vit.npz", tmp / "vit_meta.json", tmp / "vit.pt", out["vit"],
                     sample=0, device="cpu", config_slice=vit)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind, shape", [("txl", (256, 256, 16 * 8)), ("vit", (197, 197, 12 * 12))])
def test_paper_models_give_the_paper_network_tensors(paper_stores, kind, shape):
    from oattn_lib import store
    from oattn_lib.network import read_network

    quantity = paper_models()[kind]["extract"]["quantity"]
    ds = store.read_store(paper_stores[kind], require=("scores", "probs"), finite=("scores", "probs"))
    x = read_network(ds, quantity).array
    assert x.shape == shape
    scores, probs = ds["scores"].values, ds["probs"].values
    n = shape[0]
    # TXL: one segment with empty memory, so query i sees keys 0..i; ViT attends everywhere
    mask = np.triu(np.ones((n, n), dtype=bool), k=1) if kind == "txl" else None
    if mask is not None:
        assert not probs[..., mask].any()
    np.testing.assert_allclose(probs, masked_softmax(scores, mask), atol=2e-6, rtol=1e-4)


ANALYSIS = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import yaml
    from oattn_lib.stages import decompose as decompose_stage, entropy as entropy_stage
    from oattn_lib.stages import extract as extract_stage, organize as organize_stage
    store, kind, preset, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    cfg = yaml.safe_load(preset.read_text())
    ex = next(m for m in cfg["models"] if m["kind"] == kind)["extract"]
    t = {}
    t0 = time.perf_counter()
    organize_stage.organize(store, out / "organized.zarr", ex["quantity"], params=cfg["organize"])
    t["organize_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    decompose_stage.decompose(store, out / "organized.zarr", out / "decomposed.zarr", ex["quantity"],
                       **cfg["decompose"])
    t["decompose_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    entropy_stage.entropy([out / "decomposed.zarr"], out / "entropy.zarr", cfg["entropy"]["head_top_k"],
                     cfg["entropy"]["network_top_k"])
    t["entropy_s"] = time.perf_counter() - t0
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's peak over the exec)
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM"))
    t["peak_rss_mb"] = int(hwm.split()[1]) / 1024
    print(json.dumps(t))
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["txl", "vit"])
def test_full_per_sample_analysis_at_paper_size(paper_stores, kind, tmp_path):
    """organize (3-D questionnaire), decompose and entropy on one paper-size sample, in a
    fresh process (its peak RSS is the analysis's own); prints wall times and peak memory."""
    from oattn_lib import store

    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", ANALYSIS, str(paper_stores[kind]), kind, str(PAPER),
                          str(tmp_path)], capture_output=True, text=True, timeout=3600, cwd=ROOT)
    wall = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr[-3000:]
    stats = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"\n{kind} paper-size analysis: {json.dumps({**stats, 'wall_s': wall})}")
    ent = store.read_store(tmp_path / "entropy.zarr", require=("head_entropy", "network_entropy"),
                           finite=("network_entropy",))
    n_layer, n_head = (16, 8) if kind == "txl" else (12, 12)
    assert ent["head_entropy"].shape == (1, n_layer, n_head)
    assert np.isfinite(ent["head_entropy"].values).all()
