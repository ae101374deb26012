"""Extraction in bfloat16 against float32: time, peak memory and how far the attention moves
(a benchmark, not a test).

SmolLM2-135M-Instruct (the `smollm2` GGUF file, 30 layers x 9 heads, dequantised on loading
into the compute dtype) on one text of the standard library's documentation cut to N tokens,
on the CPU, every layer's scores and probabilities recorded by `models.hf_recording.hf_attention_stream`
and moved to the CPU as float32 (what the extract stage receives; nothing is stored).

- `time`: each (dtype, N) in a fresh process: load time, extraction time (one forward pass,
  recording included), the process's peak resident memory (VmHWM) and its resident memory
  after loading (the model's share);
- `diff`: for each N, one process runs the float32 model, keeps every layer, then runs the
  bfloat16 model and compares layer by layer: max and mean absolute difference of the
  probabilities; for the scores, the difference relative to the float32 head's largest
  absolute score (max) and to its mean absolute score (mean).

Prints one JSON object per case and a summary table.

    python bench/hf_dtype.py                         # 256 and 1024 tokens (about 3 minutes, 2 cores)
    python bench/hf_dtype.py --tokens 256 --threads 4
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1]) / 1024


def _text(tok, n_tokens: int) -> str:
    from oattn_lib.data.text import stdlib_corpus

    text = ""
    for d in sorted(stdlib_corpus(), key=len, reverse=True):
        text += d + "\n\n"
        if len(tok(text)["input_ids"]) > n_tokens + 16:
            return text
    raise RuntimeError(f"the stdlib corpus has fewer than {n_tokens} tokens")


def _load(dtype: str):
    from oattn_lib.models.hf_recording import load_hf

    t = time.perf_counter()
    model, tok = load_hf("smollm2", dtype=dtype)
    return model, tok, time.perf_counter() - t


def _run(model, tok, n_tokens: int, on_layer) -> float:
    from oattn_lib.models.hf_recording import hf_attention_stream, hf_encode

    inputs = hf_encode(model, tok, [_text(tok, n_tokens)], max_length=n_tokens)
    assert inputs["input_ids"].shape[1] == n_tokens
    t = time.perf_counter()
    hf_attention_stream(model, inputs, on_layer, to_cpu=True)
    return time.perf_counter() - t


def time_case(dtype: str, n_tokens: int) -> dict:
    """One (dtype, N) in this (fresh) process."""
    model, tok, load_s = _load(dtype)
    rss_model = _status_mb("VmRSS")
    layers = []
    extract_s = _run(model, tok, n_tokens, lambda c: layers.append(c.probs.dtype))
    assert len(layers) == 30 and set(layers) == {__import__("torch").float32}
    return {"case": "time", "dtype": dtype, "tokens": n_tokens, "load_s": round(load_s, 1),
            "extract_s": round(extract_s, 2), "rss_after_load_mb": round(rss_model), "peak_rss_mb": round(_status_mb("VmHWM"))}


def diff_case(n_tokens: int) -> dict:
    """float32 then bfloat16 on one text, compared layer by layer."""
    model, tok, _ = _load("float32")
    ref = []
    _run(model, tok, n_tokens, lambda c: ref.append((c.scores[0].clone(), c.probs[0].clone())))
    del model
    model, tok, _ = _load("bfloat16")
    rows = []

    def compare(c):
        s32, p32 = ref[c.index]
        dp = (c.probs[0] - p32).abs()
        ds = (c.scores[0] - s32).abs()
        rows.append({"probs_max": dp.max().item(), "probs_mean": dp.mean().item(),
                     # per head: relative to that head's float32 scores
                     "scores_rel_max": (ds.amax(dim=(1, 2)) / s32.abs().amax(dim=(1, 2))).max().item(),
                     "scores_rel_mean": (ds.mean(dim=(1, 2)) / s32.abs().mean(dim=(1, 2))).max().item(),
                     "argmax_agree": (c.probs[0].argmax(-1) == p32.argmax(-1)).float().mean().item()})

    _run(model, tok, n_tokens, compare)
    worst = max(range(len(rows)), key=lambda i: rows[i]["probs_max"])
    return {"case": "diff", "tokens": n_tokens, "layers": len(rows),
            "probs_max_abs": max(r["probs_max"] for r in rows),
            "probs_mean_abs": sum(r["probs_mean"] for r in rows) / len(rows),
            "scores_rel_max": max(r["scores_rel_max"] for r in rows),
            "scores_rel_mean": max(r["scores_rel_mean"] for r in rows),
            "argmax_agree": min(r["argmax_agree"] for r in rows),
            "worst_layer": worst, "per_layer_probs_max": [round(r["probs_max"], 4) for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="256,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        what, n = args.child
        print(json.dumps(diff_case(int(n)) if what == "diff" else time_case(what, int(n))))
        return
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    results = []
    for n in (int(v) for v in args.tokens.split(",")):
        for what in (*DTYPES, "diff"):
            proc = subprocess.run([sys.executable, __file__, "--child", what, str(n), "--threads", str(args.threads)],
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                row = {"case": what, "tokens": n, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
            else:
                row = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nSmolLM2-135M, CPU, {args.threads} threads")
    print(f"{'tokens':>6} {'dtype':>9} {'load s':>7} {'extract s':>9} {'RSS model MB':>12} {'peak RSS MB':>11}")
    for r in results:
        if r["case"] == "time":
            print(f"{r['tokens']:>6} {r['dtype']:>9} {r['load_s']:>7} {r['extract_s']:>9} {r['rss_after_load_mb']:>12} "
                  f"{r['peak_rss_mb']:>11}")
    for r in results:
        if r["case"] == "diff":
            print(f"bfloat16 vs float32, {r['tokens']} tokens: probs max |d| {r['probs_max_abs']:.3g}, mean |d| "
                  f"{r['probs_mean_abs']:.3g}; scores max |d| / max |s| {r['scores_rel_max']:.3g}, mean |d| / mean |s| "
                  f"{r['scores_rel_mean']:.3g} (worst head); same argmax key for {100 * r['argmax_agree']:.1f}% of "
                  f"queries (worst layer)")


if __name__ == "__main__":
    main()
