"""The LLM preset's per-sample stages on a GPU: time and memory of each (a benchmark, not a test;
it needs CUDA, or `--device cpu` for the same run on the CPU).

A randomly initialised Llama of SmolLM2-135M's shape (30 layers x 9 query heads over 3 key/value
heads, hidden 576, vocabulary 49,152; `bench/gpu_extract.py` makes it), given a word-level
tokenizer and random texts, goes through the stage functions the workflow's jobs call, with the
LLM preset's settings (`workflow/presets/llm.yaml` over `config.yaml`): extract (one sample of
`--tokens` tokens, float16 store), organize, decompose, entropy, theorem1 (its preset subset) and
prune (the preset's 4 held-out windows, 3 random orders and fraction step 0.2, the sample's store
read as each of `--ranking-samples` ranking samples), each on `--device`. Random weights: the
shapes, and so the speed and memory, are the real model's; the numbers are not. `--layers` keeps
that many layers in the stores (the llm4k preset's cut; prune always masks the whole model).

Prints one JSON line per stage (seconds, peak GPU memory, peak resident memory of the process so
far) and a table at the end.

    python bench/gpu_stages.py [--tokens 1024] [--layers 0] [--stages extract,organize,...] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

STAGES = ("extract", "organize", "decompose", "entropy", "theorem1", "prune")


def _peak_rss_gb() -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024 ** 2


def _settings() -> dict:
    """config.yaml with the LLM preset's sections over it."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    preset = yaml.safe_load((ROOT / "workflow" / "presets" / "llm.yaml").read_text())
    for k, v in preset.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        elif k != "models":
            cfg[k] = v
    cfg["model"] = preset["models"][0]
    return cfg


def main() -> None:
    import numpy as np
    import torch
    import xarray as xr

    from gpu_extract import _save
    from oattn_lib import store
    from oattn_lib.config import validate_config
    from oattn_lib.runtime import setup_logging
    from oattn_lib.stages.decompose import decompose
    from oattn_lib.stages.entropy import entropy
    from oattn_lib.stages.extract import extract
    from oattn_lib.stages.organize import organize
    from oattn_lib.stages.prune import prune
    from oattn_lib.stages.theorem1 import theorem1

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=0, help="keep the first this many layers in the stores (0: all)")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--ranking-samples", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--log", type=Path, help="the stages' log (default: none)")
    args = ap.parse_args()
    stages = args.stages.split(",")
    if set(stages) - set(STAGES):
        ap.error(f"--stages: {sorted(set(stages) - set(STAGES))} unknown; allowed: {','.join(STAGES)}")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench/gpu_stages.py: no CUDA device (use --device cpu)")
    if args.log:
        setup_logging(str(args.log), 1)
    cfg = _settings()
    print(json.dumps({"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
                      "tokens": args.tokens, "layers": args.layers or "all", "cpu_threads": torch.get_num_threads()}),
          flush=True)
    rows = []

    def timed(name, fn):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        row = {"stage": name, "seconds": round(time.perf_counter() - t, 2),
               "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
               "peak_rss_gb": round(_peak_rss_gb(), 2)}
        print(json.dumps(row), flush=True)
        rows.append(row)

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model_dir = _save("smollm2", d)
        rng = np.random.default_rng(0)
        texts = [" ".join(f"w{i}" for i in rng.integers(0, 1000, args.tokens + 64)) for _ in range(16)]
        (d / "meta.json").write_text(json.dumps({"kind": "hf", "test_texts": texts}))
        ex = {"n_samples": 1, "seed": 0, "max_length": args.tokens, "dtype": "float16",
              "quantity": cfg["model"]["extract"]["quantity"]}
        if args.layers:
            ex["layers"] = list(range(args.layers))
        # a store of some layers is one the config refuses to prune (prune ranks every head):
        # the bench prunes the whole model from a store of every layer (`run_prune`)
        mcfg = {"name": "smollm2", "kind": "hf", "path": str(model_dir), "extract": ex,
                "prune": {**cfg["model"]["prune"], "enabled": not args.layers}}
        config = {"models": [mcfg], "prune": cfg["model"]["prune"], "theorem1": cfg["theorem1"],
                  "organize": cfg["organize"], "decompose": cfg["decompose"], "entropy": cfg["entropy"]}
        validate_config(config, str(ROOT / "oattn_lib" / "schemas" / "config.schema.yaml"))
        mcfg, quantity = config["models"][0], ex["quantity"]
        att, org, dec, ent = d / "att.zarr", d / "org.zarr", d / "dec.zarr", d / "entropy.zarr"
        dec_cfg = config["decompose"]
        steps = {
            "extract": lambda: extract("hf", mcfg, None, d / "meta.json", None, att, 0, device=args.device),
            "organize": lambda: organize(att, org, quantity, params=config["organize"], device=args.device),
            "decompose": lambda: decompose(att, org, dec, quantity, figure_heads=dec_cfg["figure_heads"],
                                           questionnaire2d_iters=dec_cfg["questionnaire2d_iters"],
                                           random_tree_seeds=dec_cfg["random_tree_seeds"], device=args.device),
            "entropy": lambda: entropy([dec], ent, head_top_k=config["entropy"]["head_top_k"],
                                       network_top_k=config["entropy"]["network_top_k"]),
            "theorem1": lambda: theorem1("smollm2", [att], d / "theorem1.csv", out_curves=d / "curves.csv",
                                         questionnaire2d_iters=dec_cfg["questionnaire2d_iters"], device=args.device,
                                         **config["theorem1"]),
        }

        def run_prune():
            # the Haar ranking of every layer: the entropy store's where it has them all, else random
            shape = (30, 9)
            haar = rng.random((args.ranking_samples, *shape))
            store.write_store(xr.Dataset({"head_entropy": (("sample", "layer", "head"), haar)},
                                         coords={n: np.arange(k) for n, k in zip(("sample", "layer", "head"),
                                                                                 haar.shape)}), d / "haar.zarr")
            full = att
            if args.layers:  # prune ranks every head: a store of every layer
                full = d / "att_all.zarr"
                extract("hf", {**mcfg, "extract": {**mcfg["extract"], "layers": None}}, None, d / "meta.json",
                        None, full, 0, device=args.device)
            outs = {k: d / f"prune_{k}.{ext}" for k, ext in (
                ("curves", "csv"), ("rankings", "csv"), ("finding", "rst"), ("fig7", "png"), ("table3_csv", "csv"),
                ("table3_md", "md"), ("table4_csv", "csv"), ("table4_md", "md"), ("bottom", "csv"))}
            params = {k: v for k, v in config["prune"].items() if k != "enabled"}
            timed("prune", lambda: prune("hf", mcfg, None, d / "meta.json", None, [full] * args.ranking_samples,
                                         d / "haar.zarr", outs, fraction=config["entropy"]["fraction"], device=args.device,
                                         **params))

        for name in stages:
            if name == "prune":
                run_prune()
            else:
                timed(name, steps[name])
        sizes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 1e9
                 for p in (att, org, dec) if p.exists()}
    print("stores (GB): " + ", ".join(f"{k} {v:.2f}" for k, v in sizes.items()), flush=True)
    print("\n| stage | seconds | peak GPU GB | peak RSS GB |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['stage']} | {r['seconds']} | {r['peak_gpu_gb']} | {r['peak_rss_gb']} |")


if __name__ == "__main__":
    main()
