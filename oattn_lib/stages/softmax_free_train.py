"""Stage `softmax_free_train`: one run of the softmax-free experiment (`oattn_lib.softmax_free`)."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from ..models import adapter_for
from ..models.checkpoint import save_checkpoint
from ..runtime import resolve_device
from ..store import load_npz
from ..tensor_attention import parse_attention

log = logging.getLogger("oattn")

__all__ = ["train_run"]


def train_run(kind: str, arch: dict, train: dict, data: dict, data_npz, data_meta, attention: str,
              seed: int, steps: int, checkpoint_out, metrics_out, device="auto") -> None:
    """Train one run: the model of `arch` with `attention`, initialised and shuffled by `seed`.

    steps > 0 trains every run for that many optimizer steps (TXL and ViT alike); 0 keeps
    the model's own length (TXL train.steps, ViT train.epochs). Same checkpoint format as
    `stages.train.train_model`, so the extract stage reads it. metrics: valid_ppl and
    unigram_ppl (TXL) or test_accuracy (ViT), seconds_per_step (training loop only), steps,
    diverged (a non-finite loss or metric) and the loss history.

    A diverged run's checkpoint holds its initial weights (`weights: "initial"` in the
    metrics): the trained ones are not finite, and the run's attention maps must still be
    extractable, since the workflow plans them before any run is trained. Table 5 reports
    the run as diverged and leaves its heads out.
    """
    parse_attention(attention)  # a ValueError naming `attention` before any work
    model_kind = adapter_for(kind)
    problem = model_kind.retrain_problem(arch)
    if problem:
        raise ValueError(problem)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps: expected an integer >= 0, got {steps!r}")
    dev = resolve_device(device)
    arch = {**arch, "attention": attention}
    arrays, meta = load_npz(data_npz), json.loads(Path(data_meta).read_text())

    def initial_model():
        torch.manual_seed(seed)
        return model_kind.build(arch, data, meta)

    model = initial_model()
    metrics, value, n_steps, hist = model_kind.retrain(model, arrays, meta, data, train, seed=seed, steps=steps,
                                                       device=dev)
    diverged = not (math.isfinite(value) and all(math.isfinite(h["loss"]) for h in hist))
    metrics.update(attention=attention, seed=seed, steps=n_steps,
                   seconds_per_step=hist[-1]["elapsed"] / n_steps if hist else float("nan"),
                   diverged=diverged, history=hist)
    log.info("%s %s seed %d: %s; %.4f s/step%s", kind, attention, seed,
             ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k in ("valid_ppl", "test_accuracy")),
             metrics["seconds_per_step"], " (DIVERGED: saving the initial weights)" if diverged else "")
    if diverged:
        metrics["weights"] = "initial"
        model = initial_model()
    save_checkpoint(model, kind, arch, data, metrics, checkpoint_out, metrics_out)
