"""Extraction of a real LLM at real length: peak memory, wall time and store size.

SmolLM2-135M-Instruct (30 layers x 9 heads, the `smollm2` GGUF file, prepared once into a
float32 safetensors directory as the workflow's prepare_model rule does) on one text of
the standard library's documentation, through

- `stream`: the extract stage (`stages.extract.extract`): each layer written to the zarr
  store as the forward pass computes it;
- `memory`: the former path, every layer recorded in memory (`models.hf_recording.hf_attention`)
  and the whole dataset written at the end (`attention_dataset`, `store.write_store`).

- `eager`: transformers' own eager attention, nothing recorded or stored: what the model
  needs anyway to compute every attention matrix.

Every case runs in a fresh process; its peak resident memory is that process's VmHWM,
`model_only` the peak of loading the model and running 16 tokens (the floor). Prints one
JSON object per case and a summary. A case whose in-memory tensors alone would exceed the
machine's available memory is reported as skipped, with the size it would need.

    python bench/extract.py                          # the default cases (about 8 minutes, 2 busy cores)
    python bench/extract.py --cases stream:1024:float32:all memory:1024:float32:all
    python bench/extract.py --workdir /big/disk       # stores are written there, then deleted

A case is mode:tokens:dtype:layers, layers `all` or comma-separated indices. Stores at
4096 tokens are large (float32, all layers: 36 GB); the default cases at 4096 use float16
or a layer subset, and the free space is checked before each case.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ["model_only:16:float32:all", "eager:1024:float32:all", "eager:4096:float32:all",
                 "memory:1024:float32:all", "stream:1024:float32:all", "stream:1024:float16:all",
                 "memory:4096:float16:all", "stream:4096:float16:all", "stream:4096:float16:0,15,29",
                 "stream:4096:float32:0,15,29"]
N_LAYERS, N_HEADS = 30, 9


def _peak_mb() -> float:
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's peak over the exec)
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


def _long_text(tok, n_tokens: int) -> str:
    from oattn_lib.data.text import stdlib_corpus

    docs, text = stdlib_corpus(), ""
    for d in sorted(docs, key=len, reverse=True):
        text += d + "\n\n"
        # the stage takes texts of at least 4 characters per token and max_length tokens
        if len(text) >= 4 * n_tokens and len(tok(text)["input_ids"]) > n_tokens + 16:
            return text
    raise RuntimeError(f"the stdlib corpus has fewer than {n_tokens} tokens")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def worker(mode: str, n_tokens: int, dtype: str, layers, prepared: Path, workdir: Path) -> dict:
    """One case, in this (fresh) process."""
    import torch
    from transformers import AutoTokenizer

    from oattn_lib import store
    from oattn_lib.config import complete_model
    from oattn_lib.models.hf_recording import hf_attention, load_hf
    from oattn_lib.stages.extract import DTYPES, attention_dataset, extract

    torch.set_num_threads(int(os.environ.get("OATTN_BENCH_THREADS", "2")))
    t0 = time.perf_counter()
    if mode == "model_only":
        model, tok = load_hf(prepared)
        with torch.no_grad():
            model(**tok(["a short text to run the model once"], return_tensors="pt"))
        return {"load_s": time.perf_counter() - t0, "peak_rss_mb": _peak_mb()}
    text = _long_text(AutoTokenizer.from_pretrained(prepared), n_tokens)
    out = workdir / "sample0.zarr"
    t1 = time.perf_counter()
    if mode == "stream":  # the extract stage, as a workflow job runs it
        meta = workdir / "meta.json"
        meta.write_text(json.dumps({"kind": "hf", "test_texts": [text]}))
        m = complete_model({"name": "smollm2", "kind": "hf", "path": str(prepared),
                            "extract": {"n_samples": 1, "max_length": n_tokens, "dtype": dtype,
                                        "layers": layers}}, decompose={"figure_heads": [[0, 0]]},
                           prune={"enabled": False})
        extract("hf", m, None, meta, None, out / "zarr.json", 0, device="cpu", config_slice=m, prepared=prepared)
    elif mode == "memory":  # every layer in memory, written at the end
        model, tok = load_hf(prepared)
        res = hf_attention(model, tok, [text], max_length=n_tokens)
        sel = list(range(N_LAYERS)) if layers is None else layers
        ds = attention_dataset(res["scores"][0].numpy()[sel], res["probs"][0].numpy()[sel],
                               res["input_ids"][0].numpy(), {"model": "smollm2", "sample": 0})
        del res
        ds = ds.assign(scores=ds["scores"].astype(DTYPES[dtype]), probs=ds["probs"].astype(DTYPES[dtype]))
        store.write_store(ds, out)
    elif mode == "eager":  # the model's own eager attention, nothing kept
        model, tok = load_hf(prepared)
        model.set_attn_implementation("eager")
        with torch.no_grad():
            model(**tok([text], truncation=True, max_length=n_tokens, return_tensors="pt"))
        return {"extract_s": time.perf_counter() - t1, "total_s": time.perf_counter() - t0, "peak_rss_mb": _peak_mb()}
    else:
        raise ValueError(f"mode: {mode!r}")
    t2 = time.perf_counter()
    size = _du(out)
    shutil.rmtree(out)
    return {"extract_s": t2 - t1, "total_s": t2 - t0, "peak_rss_mb": _peak_mb(), "store_mb": size / 1e6}


def in_memory_gb(n_tokens: int, dtype: str, layers) -> float:
    """What the in-memory path holds at once: every layer's float32 scores and probs as
    recorded, their stacked copies, and the selected layers cast to the stored dtype."""
    full = N_LAYERS * N_HEADS * n_tokens ** 2 * 4 * 2
    sel = (len(layers) if layers else N_LAYERS) * N_HEADS * n_tokens ** 2 * 2 * (2 if dtype == "float16" else 4)
    return (2 * full + sel) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES)
    ap.add_argument("--workdir", type=Path, default=None, help="where stores are written (default: a temp dir)")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        mode, n, dtype, layers, prepared = args.worker
        layers = None if layers == "all" else [int(v) for v in layers.split(",")]
        print(json.dumps(worker(mode, int(n), dtype, layers, Path(prepared), Path(os.environ["OATTN_BENCH_DIR"]))))
        return

    import psutil

    from oattn_lib.stages.extract import store_nbytes

    work = Path(args.workdir or tempfile.mkdtemp(prefix="oattn_bench_extract_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OATTN_BENCH_DIR": str(work)}
    prepared = work / "model"
    if not (prepared / "model.safetensors").is_file():
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from oattn_lib.stages.prepare_model import prepare_model; "
                        f"prepare_model('smollm2', None, {str(prepared)!r})"], env=env, check=True,
                       stderr=subprocess.DEVNULL)
        print(json.dumps({"case": "prepare_model", "wall_s": round(time.perf_counter() - t, 1)}), flush=True)
    results = []
    for case in args.cases:
        mode, n, dtype, layers = case.split(":")
        n = int(n)
        sel = None if layers == "all" else [int(v) for v in layers.split(",")]
        row = {"case": case, "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
        if mode in ("stream", "memory"):
            need = store_nbytes(len(sel) if sel else N_LAYERS, N_HEADS, n, dtype)
            row["store_mb_uncompressed"] = round(need / 1e6, 1)
            free = shutil.disk_usage(work).free
            if need > 0.8 * free:
                row["skipped"] = f"needs up to {need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free at {work}"
            if mode == "memory":
                gb = in_memory_gb(n, dtype, sel)
                row["in_memory_gb"] = round(gb, 1)
                avail = psutil.virtual_memory().available / 1e9
                if gb > 0.8 * avail:
                    row["skipped"] = (f"the in-memory path holds about {gb:.0f} GB of attention (every layer's float32 "
                                      f"scores and probs, and their stacked copies); {avail:.0f} GB available")
        if "skipped" not in row:
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--worker", mode, str(n), dtype, layers, str(prepared)],
                                  env=env, capture_output=True, text=True)
            row["wall_s"] = round(time.perf_counter() - t, 1)
            if proc.returncode:
                row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
            else:
                row.update({k: (round(v, 1) if isinstance(v, float) else v)
                            for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items() if v is not None})
        row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    base = next((r["peak_rss_mb"] for r in results if r["case"].startswith("model_only") and "peak_rss_mb" in r), None)
    print(json.dumps({"summary": [{"case": r["case"], "peak_rss_mb": r.get("peak_rss_mb"),
                                   "over_model_mb": None if base is None or "peak_rss_mb" not in r
                                   else round(r["peak_rss_mb"] - base, 1),
                                   "wall_s": r.get("wall_s"), "store_mb": r.get("store_mb"),
                                   "skipped": r.get("skipped"), "error": r.get("error")} for r in results]},
                     indent=1))


if __name__ == "__main__":
    main()
