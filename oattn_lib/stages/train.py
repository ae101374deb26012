"""Stage `train`: a seeded model of a kind the workflow trains (txl, vit), its checkpoint and its metrics."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..models import adapter_for
from ..models.checkpoint import save_checkpoint
from ..runtime import resolve_device
from ..store import load_npz

__all__ = ["train_model"]


def train_model(kind: str, arch: dict, train: dict, data: dict, data_npz, data_meta,
                checkpoint_out, metrics_out, device="auto", pretrained=False) -> None:
    """Train a model of `kind` (its adapter, `models.kinds`), seeded; save the checkpoint and its metrics."""
    model_kind = adapter_for(kind)
    if not model_kind.trains:
        raise model_kind.unsupported("be trained by the workflow")
    dev = resolve_device(device)
    arrays, meta = load_npz(data_npz), json.loads(Path(data_meta).read_text())
    torch.manual_seed(train["seed"])
    model = model_kind.build(arch, data, meta, pretrained=pretrained)
    metrics, history = model_kind.train(model, arrays, meta, data, train, dev)
    metrics["history"] = history
    save_checkpoint(model, kind, arch, data, metrics, checkpoint_out, metrics_out)
