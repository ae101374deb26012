"""Loading a GGUF model: transformers as a user calls it against `models.hf_recording.load_hf`, which
parses the file once (`models.hf_recording.gguf_parsed_once`); a benchmark, not a test.

SmolLM2-135M-Instruct (the `smollm2` package's Q4_1 file) loaded into float32 on the CPU,
config, weights and tokenizer, each way in a fresh process: the CPU time and wall time of the
load, how many times the GGUF file was parsed (gguf.GGUFReader constructed), and whether the
two loads give the same attention on one sentence (every recorded score and probability equal).
Prints one JSON object per way and a summary line; bench/gguf_load.csv records them, a row per way.

    python bench/gguf_load.py          # about a minute on 2 cores
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "Attention maps of a small language model, extracted layer by layer."

CHILD = """
import json, sys, time

import torch
from oattn_lib.models import files, hf_recording

way, out, sentence = sys.argv[1:4]
cpu, wall = time.process_time(), time.perf_counter()
with hf_recording.gguf_parses() as parsed:
    if way == "transformers":
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        directory, name = files.smollm2_path()
        config = AutoConfig.from_pretrained(directory, gguf_file=name, local_files_only=True)
        model = AutoModel.from_pretrained(directory, gguf_file=name, config=config, dtype=torch.float32,
                                          attn_implementation=hf_recording.register_recording_attention(),
                                          local_files_only=True)
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
        model.eval()
    else:
        model, tok = hf_recording.load_hf("smollm2")
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
res = hf_recording.hf_attention(model, tok, [sentence])
torch.save({k: res[k] for k in ("scores", "probs")}, out)
print(json.dumps({"way": way, "load_cpu_s": round(cpu, 2), "load_wall_s": round(wall, 2), "parsed": len(parsed)}))
"""


def main() -> int:
    import torch

    rows, outs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("transformers", "load_hf"):
            out = str(Path(tmp) / f"{way}.pt")
            proc = subprocess.run([sys.executable, "-c", CHILD, way, out, SENTENCE], capture_output=True, text=True,
                                  cwd=ROOT)
            if proc.returncode:
                sys.stderr.write(proc.stderr[-3000:])
                return proc.returncode
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
            outs.append(torch.load(out))
    same = all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])
    plain, ours = rows
    print(f"SmolLM2 GGUF load: transformers {plain['load_cpu_s']} s of CPU ({plain['parsed']} parses), "
          f"load_hf {ours['load_cpu_s']} s ({ours['parsed']}); the same attention: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
