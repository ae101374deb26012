"""Kinds of model: one adapter per `kind` of the config, the only code that tells them apart.

A model entry's `kind` (txl, vit, hf, attention) names a `ModelKind`; the config checks, the rules and
the stages (`prepare_data`, `train`, `extract`, `prune`, the softmax-free runs) ask that
adapter, and never test the kind themselves. A new kind is one module here, subclassing
`ModelKind`, one line in `KINDS`, one branch of the config schema and its tests.

The protocol, in the order a model goes through the workflow:

- `name`: the config's `kind`. Capability flags: `trains` (the workflow builds and trains
  it: rule `train`, a checkpoint its extract and prune jobs read, `metrics.json`),
  `extracts_with_weights` (its extraction runs a model whose weights the job holds; false for
  attention read from files), `prunes`
  (its heads can be gated: the ablation study of `stages.prune`), `image_patches` (its tokens
  are image patches, -1 the class token), `origin` (the summary's line on where a model
  without training metrics comes from), `typical_quantity` (the attention quantity a model
  of the kind is usually analysed by, for synthetic stores), `compute_dtypes` (the
  `extract.compute_dtype` values its extraction runs in), `device_maps` (it takes a
  `device_map`), `loads_gguf` (it loads a `gguf_file`), `stacks` (the `extract.stack` values
  of its encoder-decoder models).
- The config and the rules, without torch: `n_tokens`, `n_units` (its size before running
  it), `config_problem` (the kind's own checks of a model entry; the base checks the capability
  flags), `prune_problem` (why the ablation cannot run for an entry), `datasets` (the downloads
  its data reads), `n_candidates`, `ordered_samples` and `max_tokens` (the user's inputs: how
  many, in their order, how long at most), `extract_defaults` (the `extract` section an entry
  without one gets, read from its files; None where the section must be given), `input_files`
  and `sample_files` (the user's files
  prepare_data and each extract job read: rule inputs), `pretrained_weights` (a weights file its training starts from),
  `prune_params` (what the prune rule passes of its entry), `retrain_problem` (whether the
  softmax-free experiment can retrain it), `validation_metric` (the metric its training
  reports).
- The stages: `prepare_data` (its dataset), `build`, `train` and `retrain` (an untrained
  network, the workflow's training, a softmax-free run), `extraction` (the loaded model,
  its candidate samples and how one sample's attention is computed, an `Extraction`) and
  `ablation` (the loaded model, its head layout and held-out data, an `Ablation`).

What a kind cannot do raises `Unsupported` (a ValueError) naming the model or the kind and
what was asked; stages and rules ask the capability flags first where they plan around it.
Adapter modules import torch, transformers and the data only inside their methods: the
workflow reads the registry at start-up.
"""
from __future__ import annotations

from .base import Ablation, Extraction, HeldOut, ModelKind, Sample, Unsupported

__all__ = ["ModelKind", "Unsupported", "Sample", "Extraction", "Ablation", "HeldOut", "KINDS", "adapter", "adapter_for"]


def _registry() -> dict[str, ModelKind]:
    from .attention import Attention
    from .hf import HF
    from .txl import TXL
    from .vit import ViT

    return {k.name: k() for k in (TXL, ViT, HF, Attention)}


KINDS: dict[str, ModelKind] = _registry()
"""Every kind by its config name."""


def adapter_for(kind: str) -> ModelKind:
    """The adapter of the model kind `kind`; ValueError naming it and the allowed kinds."""
    try:
        return KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"kind: unknown model kind {kind!r} (allowed: {', '.join(KINDS)})") from None


def adapter(model: dict) -> ModelKind:
    """The adapter of a model entry of the config (its `kind`)."""
    return adapter_for(model["kind"])
