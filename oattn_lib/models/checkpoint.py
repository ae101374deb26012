"""Checkpoints of the models the workflow trains: build, save, load (safely).

A checkpoint is a dict of plain data only: `kind` (str), `arch` and `data` (the JSON-able
config slices that built the model) and `state_dict` (tensors). It is read with
`torch.load(weights_only=True)`, torch's restricted unpickler: a checkpoint file that
carries any other object (one that would run code when unpickled) is refused with an
error naming the file, never executed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .. import store

__all__ = ["CheckpointError", "build_model", "save_checkpoint", "load_checkpoint", "load_trained"]

_KEYS = ("kind", "arch", "state_dict")


class CheckpointError(store.StoreError):
    """A checkpoint file is missing, unsafe or not in the format `save_checkpoint` writes."""


def build_model(kind: str, arch: dict, n_token: int | None = None, image_size: int = 32, pretrained=False):
    """An untrained txl or vit model from its `arch` config slice."""
    if kind == "txl":
        from .transformer_xl import TransformerXL, TXLConfig
        return TransformerXL(TXLConfig(n_token=n_token, **{**arch, "cutoffs": tuple(arch.get("cutoffs", ()))}))
    if kind == "vit":
        arch = dict(arch)
        if arch.pop("variant", "custom") == "vit_b_16":
            from .vision_transformer import build_vit_b_16
            return build_vit_b_16(num_classes=10, pretrained=pretrained)
        from .vision_transformer import build_vit
        return build_vit(image_size=image_size, **arch)
    raise ValueError(f"kind: {kind!r} has no trainable model here (allowed: txl, vit)")


def _plain(value, where: str):
    """`value` round-tripped through JSON: only plain data goes into a checkpoint."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: checkpoint metadata must be JSON-able ({exc})") from None


def save_checkpoint(model, kind: str, arch: dict, data: dict, metrics: dict, checkpoint_out, metrics_out) -> None:
    """Save weights (CPU, with what built them) and metrics plus the weights' hash, atomically."""
    from ..train import state_hash

    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    metrics["state_sha256"] = state_hash(state)
    payload = {"kind": str(kind), "arch": _plain(arch, "arch"), "data": _plain(data, "data"), "state_dict": state}
    with store.atomic_output(checkpoint_out) as tmp:
        torch.save(payload, tmp)
    store.save_json(metrics_out, metrics)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint written by `save_checkpoint`, loaded with `weights_only=True` on the CPU."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint does not exist")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: refused to load: not a safe oattn checkpoint "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                              "only tensors and plain data are loaded, delete it so the workflow "
                              "retrains it") from exc
    missing = [k for k in _KEYS if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise CheckpointError(f"{path}: not an oattn checkpoint (missing {missing}); delete it so the "
                              "workflow retrains it")
    return ck


def load_trained(path: str | os.PathLike, n_token: int | None = None, image_size: int = 32):
    """(model on the CPU with its trained weights, the checkpoint dict) of a txl or vit checkpoint."""
    ck = load_checkpoint(path)
    net = build_model(ck["kind"], ck["arch"], n_token=n_token, image_size=image_size)
    net.load_state_dict(ck["state_dict"])
    return net, ck
