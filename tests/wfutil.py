"""Running the real workflow from tests: a tiny config, snakemake in a temporary directory."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

TINY = {
    "results": "results",
    "models": [
        {"name": "txl", "kind": "txl",
         "data": {"corpus": "stdlib", "min_freq": 5, "max_size": 2000, "seed": 0},
         "arch": {"n_layer": 2, "n_head": 2, "d_model": 32, "d_head": 8, "d_inner": 64,
                  "tgt_len": 24, "mem_len": 24, "dropout": 0.1, "cutoffs": [500]},
         "train": {"steps": 200, "batch_size": 16, "lr": 0.005, "warmup": 10, "seed": 0},
         "extract": {"quantity": "scores", "n_samples": 2, "seed": 0}},
        {"name": "vit", "kind": "vit",
         "data": {"dataset": "digits", "image_size": 16, "seed": 0},
         "arch": {"patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 16, "mlp_dim": 32},
         "train": {"epochs": 4, "batch_size": 32, "lr": 0.003, "seed": 0},
         "extract": {"quantity": "probs", "n_samples": 2, "seed": 0}},
        {"name": "lm", "kind": "hf", "path": "minilm", "data": {"corpus": "stdlib", "seed": 0},
         "extract": {"quantity": "probs", "n_samples": 2, "seed": 0, "max_length": 20}},
    ],
    "organize": {"n_iters": 1},
    "decompose": {"figure_heads": [[0, 0], [-1, -1]], "questionnaire2d_iters": 2, "random_tree_seeds": 1},
    "entropy": {"head_top_k": 16, "network_top_k": 10, "fraction": 0.25},
    "figures": {"entropy_samples": 2, "trihaar_samples": 2, "trihaar_top_k": 20},
}


def snakemake(workdir: Path, config: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.run(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                                       "--configfile", str(cfg), "--cores", "2", *args],
                          capture_output=True, text=True, timeout=1800)
    if check and proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    block = text.split("Job stats:")[-1]
    jobs = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def reordered(value):
    """`value` with every mapping's keys in reverse order: the same config, written otherwise."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value
