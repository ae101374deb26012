"""Extraction on a GPU by compute dtype: time, GPU memory and how far the attention moves
(a benchmark, not a test; it needs CUDA).

Randomly initialised Llama decoders of two shapes, saved once to a temporary directory and
loaded by `models.hf_recording.load_hf` as the extract stage loads them: SmolLM2-135M's (30 layers x 9
query heads over 3 key/value heads, hidden 576) and a 1B-class one (16 layers x 32 heads over
8, hidden 2048). For each shape, compute dtype (float32, bfloat16, float16) and length, one
forward pass streams every layer through `AttentionWriter` into a zarr store in float16 (what
`extract` does, disk included), and it prints the load time, the extraction time (median of
`--repeats` after one warm-up), the peak GPU memory and the largest absolute difference of the
probabilities from float32's (in the first, middle and last layers). Random weights: the speed and memory are the real model's; the
differences are only an indication (trained weights give peakier attention). With
`--device-map`, the bfloat16 model is also loaded with `device_map="auto"`.

    python bench/gpu_extract.py [--tokens 1024,2048] [--shapes smollm2,1b] [--repeats 2] [--device-map]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=32000),
}


def _save(shape: str, root: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = root / shape
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=8192, initializer_range=0.05, pad_token_id=0,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(d)
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(1000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(d)
    return d


def _extract(model, ids, out: Path, keep: bool):
    import numpy as np
    import torch

    from oattn_lib.models.hf_recording import hf_attention_stream
    from oattn_lib.stages.extract import attention_writer

    kept = []
    n_layers = model.config.num_hidden_layers
    compared = {0, n_layers // 2, n_layers - 1}
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with attention_writer(out, tokens=np.arange(ids.shape[1]), attrs={"model": "bench", "sample": 0},
                          dtype="float16") as writer:
        def each(call):
            writer.write(call.layer if call.layer is not None else call.index, call.scores[0], call.probs[0],
                         None if call.allowed is None else call.allowed[0], call.n_kv_heads)
            if keep and call.index in compared:  # three layers: a 1b model's every layer is tens of GB
                kept.append(call.probs[0].float().cpu())

        with torch.no_grad():
            n = hf_attention_stream(model, inputs, each)
        writer.finish(n)
    return kept


def main() -> None:
    import torch

    from oattn_lib.models.hf_recording import load_hf

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1024,2048")
    ap.add_argument("--shapes", default="smollm2,1b")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device-map", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_extract.py needs a CUDA device")
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for shape in args.shapes.split(","):
            d = _save(shape, root)
            for n in (int(x) for x in args.tokens.split(",")):
                ids = torch.randint(2, 1002, (1, n), generator=torch.Generator().manual_seed(n))
                ref = None
                cases = [("float32", None), ("bfloat16", None), ("float16", None)]
                if args.device_map:
                    cases.append(("bfloat16", "auto"))
                for dtype, dmap in cases:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    t = time.perf_counter()
                    model, _ = load_hf(d, device=None if dmap else "cuda", dtype=dtype, device_map=dmap,
                                       causal_lm=False)
                    load_s = time.perf_counter() - t
                    x = ids.to("cuda")
                    kept = _extract(model, x, root / "warm.zarr", keep=dtype == "float32" or ref is not None)
                    times = []
                    for _ in range(args.repeats):
                        torch.cuda.synchronize()
                        t = time.perf_counter()
                        _extract(model, x, root / "s.zarr", keep=False)
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t)
                    if dtype == "float32" and dmap is None:
                        ref = kept
                        diff = 0.0
                    else:
                        diff = max(float((a - b).abs().max()) for a, b in zip(kept, ref))
                    row = {"shape": shape, "tokens": n, "compute_dtype": dtype, "device_map": dmap,
                           "load_s": round(load_s, 2), "extract_s": round(sorted(times)[len(times) // 2], 3),
                           "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
                           "probs_max_abs_diff": round(diff, 5)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    del model, kept
    print("\n| shape | tokens | compute dtype | device_map | load s | extract s | peak GPU GB | max |dp| vs fp32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['shape']} | {r['tokens']} | {r['compute_dtype']} | {r['device_map'] or ''} | {r['load_s']} | "
              f"{r['extract_s']} | {r['peak_gpu_gb']} | {r['probs_max_abs_diff']} |")


if __name__ == "__main__":
    main()
