"""Stage `train`: a seeded txl or vit model, its checkpoint and its metrics."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .. import train as trainlib
from ..data.images import vit_split
from ..models.checkpoint import build_model, save_checkpoint
from ..runtime import resolve_device
from ..store import load_npz

log = logging.getLogger("oattn")

__all__ = ["train_model"]


def train_model(kind: str, arch: dict, train: dict, data: dict, data_npz, data_meta,
                checkpoint_out, metrics_out, device="auto", pretrained=False) -> None:
    """Train a txl or vit model, seeded; save the checkpoint and its metrics."""
    dev = resolve_device(device)
    arrays, meta = load_npz(data_npz), json.loads(Path(data_meta).read_text())
    torch.manual_seed(train["seed"])
    if kind == "txl":
        model = build_model(kind, arch, n_token=len(meta["vocab"]))
        res = trainlib.train_txl(model, torch.from_numpy(arrays["train"]), torch.from_numpy(arrays["valid"]),
                                 steps=train["steps"], batch_size=train["batch_size"], lr=train["lr"],
                                 warmup=train["warmup"], seed=train["seed"], device=dev,
                                 log=log)
        metrics = {"valid_ppl": res["valid_ppl"], "unigram_ppl": res["unigram_ppl"]}
        log.info("validation perplexity %.2f (unigram baseline %.2f)", res["valid_ppl"], res["unigram_ppl"])
    elif kind == "vit":
        size = data["image_size"]
        model = build_model(kind, arch, image_size=size, pretrained=pretrained)
        (tr, transform), (te, _) = (vit_split(arrays, meta, s, size) for s in ("train", "test"))
        res = trainlib.train_vit(model, tr, torch.from_numpy(arrays["train_labels"]),
                                 te, torch.from_numpy(arrays["test_labels"]),
                                 epochs=train["epochs"], batch_size=train["batch_size"], lr=train["lr"],
                                 seed=train["seed"], device=dev, log=log, transform=transform)
        metrics = {"test_accuracy": res["test_accuracy"]}
        log.info("test accuracy %.4f", res["test_accuracy"])
    else:
        raise ValueError(f"kind: {kind!r} is not trained by the workflow (allowed: txl, vit)")
    metrics["history"] = res["history"]
    save_checkpoint(model, kind, arch, data, metrics, checkpoint_out, metrics_out)
