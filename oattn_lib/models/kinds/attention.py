"""Kind `attention`: attention computed elsewhere (vLLM, TransformerLens, nnsight, JAX), read from
files (`data.attention_files`) and analysed like any model's.

There is no model: nothing is trained, loaded or masked (no prune stage). Sample i is the i-th
sample of the files, in their order; an entry without an `extract` section takes every sample
and the quantity the files hold (`Attention.extract_defaults`). `extract` copies a sample into
an attention store (`stages.extract.AttentionWriter`), without `scores` where the files hold
only probabilities. The files are checked when the config is (shapes, dtypes, masks, NaN, inf
and negative probabilities), and they are inputs of the extract rule: editing one reruns
extract and what follows.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .base import Extraction, ModelKind, Sample

__all__ = ["Attention", "attention_source", "attention_hash"]


def attention_source(model: dict, checked: bool = False):
    """The attention files of entry `model` (`data.attention_files.AttentionFiles`), from their
    headers; `checked`: their values too (NaN, inf, negative probabilities)."""
    from ...data import attention_files as af

    read = af.checked if checked else af.describe
    return read(model["path"], model.get("quantity_in_file", "probs"))


def attention_hash(files) -> str:
    """sha256 of an attention source's files (provenance): the file's own hash for one file, else
    the hash of every file's name and hash, a zarr store's files included."""
    from ... import store

    paths = [Path(f) for f in files]
    if len(paths) == 1 and paths[0].is_file():
        return store.file_sha256(paths[0])
    h = hashlib.sha256()
    for root in paths:
        for f in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(store.file_sha256(f).encode())
    return h.hexdigest()


class Attention(ModelKind):
    name = "attention"
    extracts_with_weights = False
    origin = "Attention read from files: no model here."
    typical_quantity = "probs"

    def n_tokens(self, model: dict) -> int | None:
        return attention_source(model).n_tokens()

    def max_tokens(self, model: dict) -> int:
        # the longest side of any sample: what a job of all samples is planned for
        return max(max(s.n_query, s.n_key) for s in attention_source(model).samples)

    def n_units(self, model: dict) -> tuple[int, int]:
        return attention_source(model).n_units

    def n_candidates(self, model: dict) -> int:
        return len(attention_source(model).samples)

    def ordered_samples(self, model: dict) -> bool:
        return True

    def extract_defaults(self, model: dict) -> dict | None:
        # the quantity the files hold: scores where they hold scores (probabilities follow from
        # them), else probs; every sample is the schema's default
        try:
            quantities = attention_source(model).quantities
        except ValueError:
            return {}
        return {"quantity": "scores" if "scores" in quantities else "probs"}

    def sample_files(self, model: dict, samples) -> list[str]:
        """The files holding `samples` (each sample i is the source's sample i); a zarr store's
        every file (its chunks included). prepare_data reads none of them."""
        source = attention_source(model)
        out = []
        for f in dict.fromkeys(source.samples[i].file for i in samples):
            p = Path(f)
            out += [str(p)] if p.is_file() else sorted(str(q) for q in p.rglob("*") if q.is_file())
        return out

    def config_problem(self, model: dict, index: int) -> str | None:
        from ...data.attention_files import AttentionFileError

        problem = super().config_problem(model, index)
        if problem:
            return problem
        key = f"models[{index}]"
        try:
            source = attention_source(model, checked=True)
        except AttentionFileError as exc:
            return f"{key}.path: {exc}"
        ex = model.get("extract", {})
        if ex.get("quantity") == "scores" and "scores" not in source.quantities:
            return (f"{key}.extract.quantity: scores, but {source.path} holds no 'scores' (only probs); allowed: "
                    "probs")
        return None

    def prepare_data(self, data: dict, data_root) -> tuple[dict, dict]:
        # the data are the files, which the extract rule reads itself
        return {}, {"kind": self.name}

    def extraction(self, model: dict, *, data_npz, meta: dict, checkpoint, device, prepared=None) -> Extraction:
        return _FileExtraction(model)


class _FileExtraction(Extraction):
    """Every sample of the files, in their order."""

    def __init__(self, model: dict):
        self.source = attention_source(model, checked=True)
        self.n_available = len(self.source.samples)
        self.available = f"samples in {self.source.path}"

    @property
    def source_hash(self) -> str:
        return attention_hash(self.source.files)

    def sample(self, index: int) -> Sample:
        import numpy as np

        from ...data.attention_files import read_sample

        s = read_sample(self.source, index)
        n_layers, n_heads, n_query = s.probs.shape[:3]

        def run(on_layer) -> int:
            for layer in range(n_layers):
                allowed = None if s.allowed is None else s.allowed if s.allowed.ndim == 2 else s.allowed[layer]
                on_layer(layer, None if s.scores is None else np.array(s.scores[layer]), np.array(s.probs[layer]),
                         allowed, s.n_kv_heads)
            return n_layers

        return Sample(s.tokens, s.token_text, {"source_file": Path(s.file).name}, n_query, n_layers, n_heads, run)
