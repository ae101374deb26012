"""Stage `extract`: scores and probabilities of every head for one sample (docs/method.md §9, §12).

Stores are streamed: `AttentionWriter` appends each layer to the zarr store as soon as the
model has computed it (for Hugging Face models, from inside the forward pass through
`models.hf_recording.hf_attention_stream`), so extraction holds the model plus about one layer,
whatever the number of layers and the sequence length. One head of one layer is one zarr
chunk. The store is written into a temporary sibling and renamed into place only once
every layer is in (`store.atomic_output`): a crash mid-forward leaves no store that a rerun
would trust, and the next write of the same store removes the temporary.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from .. import store
from ..models import adapter_for
from ..models.kinds.hf import hf_hash
from ..runtime import resolve_device

log = logging.getLogger("oattn")

__all__ = ["DTYPES", "AttentionWriter", "attention_writer", "attention_dataset", "store_nbytes", "extract",
           "extract_samples", "hf_hash"]

DTYPES = {"float16": np.float16, "float32": np.float32}
"""`extract.dtype`: how scores and probs are stored."""


def attention_dataset(scores, probs, tokens, attrs, token_text=None) -> xr.Dataset:
    """An attention store's dataset built in memory from (layer, head, query, key) arrays, float32,
    layers and heads numbered from 0 (the layout `AttentionWriter` streams, without
    `allowed` and `kv_group`)."""
    n_layer, n_head, n_q, n_k = probs.shape
    for name, arr in (("scores", scores), ("probs", probs)):
        bad = ~np.isfinite(arr)
        if bad.any():
            layer, head = np.argwhere(bad)[0][:2]
            raise ValueError(f"{attrs.get('model')} sample {attrs.get('sample')}: {name} has NaN or "
                             f"inf at layer {layer}, head {head}")
    coords = {"layer": np.arange(n_layer), "head": np.arange(n_head),
              "query": np.arange(n_q), "key": np.arange(n_k),
              "token": ("query", np.asarray(tokens)[:n_q])}
    ds = xr.Dataset({"scores": (("layer", "head", "query", "key"), scores.astype(np.float32)),
                     "probs": (("layer", "head", "query", "key"), probs.astype(np.float32))},
                    coords=coords, attrs=attrs)
    if token_text is not None:
        ds.attrs["token_text"] = json.dumps(list(token_text)[:n_q])
    return ds


def store_nbytes(n_layers: int, n_heads: int, n_tokens: int, dtype: str) -> int:
    """Uncompressed bytes of an attention store: scores and probs in `dtype`, `allowed` as bytes."""
    return n_layers * n_tokens * n_tokens * (2 * n_heads * np.dtype(DTYPES[dtype]).itemsize + 1)


_TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32}


class AttentionWriter:
    """An attention store (docs/method.md §12.1) written one layer at a time into the directory `path`.

    Layout: `scores` and `probs` (layer, head, query, key) in `dtype`, one chunk per (layer,
    head), `probs` only where the source has no scores (attention files of probabilities);
    `allowed` (layer, query, key) bool, True where the model may attend (its causal,
    sliding-window or padding mask), one chunk per layer; coordinates `layer` and `head`
    (the model's indices of the stored layers and heads), `kv_group` (head: the key/value
    head each query head reads, `models.hf_recording.kv_groups`; the head itself without
    grouped-query attention), `query`, `key` and `token` (query). Use `attention_writer`,
    which makes the write atomic.

    The first layer lays the store out through xarray with an empty layer axis (names,
    coordinates, attributes, chunks); every layer is then appended with zarr directly,
    which writes the arrays as they are (xarray's encoding would copy each variable
    first). Selection, casting and checks run in torch on the tensors the model made.

    `heads` selects the query heads stored of every layer (None: all). Layers are appended
    in the order written, which must be increasing.
    """

    def __init__(self, path, *, tokens, attrs: dict, dtype: str = "float32", heads=None, token_text=None):
        if dtype not in DTYPES:
            raise ValueError(f"extract.dtype: {dtype!r} is not one of {sorted(DTYPES)}")
        self.path = Path(path)
        self.tokens = np.asarray(tokens)
        self.attrs = dict(attrs)
        self.dtype = dtype
        self.heads = None if heads is None else np.asarray(heads, dtype=np.int64)
        self.token_text = None if token_text is None else list(token_text)
        self.layers: list[int] = []
        self.kv_group: np.ndarray | None = None
        self.model_heads: int | None = None
        self.model_kv_heads: int | None = None
        self._group = None
        self.has_scores: bool | None = None

    def _where(self) -> str:
        return f"{self.attrs.get('model')} sample {self.attrs.get('sample')}"

    def _layout(self, heads: np.ndarray, kv: np.ndarray, n_q: int, n_k: int) -> None:
        import zarr

        if self.tokens.shape[0] < n_q:
            raise ValueError(f"tokens: {self.tokens.shape[0]} given for {n_q} queries")
        dims = ("layer", "head", "query", "key")
        empty = np.empty((0, heads.size, n_q, n_k), dtype=DTYPES[self.dtype])
        quantities = ("scores", "probs") if self.has_scores else ("probs",)
        ds = xr.Dataset({**{q: (dims, empty) for q in quantities},
                         "allowed": (("layer", "query", "key"), np.empty((0, n_q, n_k), dtype=bool))},
                        coords={"layer": np.empty(0, dtype=np.int64), "head": heads, "kv_group": ("head", kv),
                                "query": np.arange(n_q), "key": np.arange(n_k),
                                "token": ("query", self.tokens[:n_q])},
                        attrs={**self.attrs, "dtype": self.dtype})
        if self.token_text is not None:
            ds.attrs["token_text"] = json.dumps(self.token_text[:n_q])
        ds["allowed"].attrs["description"] = "True where the model may attend (its own mask)"
        encoding = {**{q: {"chunks": (1, 1, n_q, n_k)} for q in quantities},
                    "allowed": {"chunks": (1, n_q, n_k)}, "layer": {"chunks": (1024,)}}
        ds.to_zarr(self.path, mode="w", consolidated=False, encoding=encoding)
        self._group = zarr.open_group(self.path, mode="r+")

    def write(self, layer: int, scores, probs, allowed=None, n_kv_heads: int | None = None) -> None:
        """Append one layer: scores and probs (head, query, key) of every head of the layer
        (torch tensors or arrays; scores None: probs only, for every layer), allowed (query, key) bool or None (nothing masked),
        n_kv_heads the layer's key/value heads (None: one per query head)."""
        from ..models.hf_recording import kv_groups

        layer = int(layer)
        if self.layers and layer <= self.layers[-1]:
            raise ValueError(f"layer {layer} written after layer {self.layers[-1]}; layers must increase")
        if self.has_scores is None:
            self.has_scores = scores is not None
        elif self.has_scores != (scores is not None):
            raise ValueError(f"layer {layer}: scores {'missing' if self.has_scores else 'given'}, unlike the "
                             "layers before it")
        probs = torch.as_tensor(probs).detach().cpu()
        scores = probs if scores is None else torch.as_tensor(scores).detach().cpu()
        if scores.ndim != 3 or scores.shape != probs.shape:
            raise ValueError(f"scores, probs: expected two (head, query, key) arrays of one shape, got "
                             f"{tuple(scores.shape)} and {tuple(probs.shape)}")
        n_head, n_q, n_k = probs.shape
        heads = np.arange(n_head) if self.heads is None else self.heads
        if heads.size and (heads.min() < 0 or heads.max() >= n_head):
            raise ValueError(f"extract.heads: {sorted(int(h) for h in heads if not 0 <= h < n_head)} outside "
                             f"layer {layer}'s {n_head} heads; allowed: 0..{n_head - 1}")
        kv = kv_groups(n_head, n_kv_heads or n_head)[heads]
        if self.kv_group is not None and not np.array_equal(kv, self.kv_group):
            raise ValueError(f"layer {layer} groups its query heads into {n_kv_heads} key/value heads, unlike "
                             "the layers before it; such models are not supported")
        if heads.size != n_head:
            index = torch.from_numpy(heads)
            scores, probs = scores.index_select(0, index), probs.index_select(0, index)
        out = {}
        for name, x in ((("scores", scores),) if self.has_scores else ()) + (("probs", probs),):
            # per-head extremes: NaN and inf show in them, and no layer-sized temporary is made
            hi, lo = x.amax(dim=(1, 2)).double(), x.amin(dim=(1, 2)).double()
            bad = ~(torch.isfinite(hi) & torch.isfinite(lo))
            if bad.any():
                raise ValueError(f"{self._where()}: {name} has NaN or inf at layer {layer}, "
                                 f"head {int(heads[int(bad.int().argmax())])}")
            if self.dtype == "float16":
                big = torch.maximum(hi, -lo) > float(np.finfo(np.float16).max)
                if big.any():
                    raise ValueError(f"extract.dtype: {name} of {self._where()} exceed the float16 range at "
                                     f"layer {layer}, head {int(heads[int(big.int().argmax())])}; use dtype float32")
            out[name] = x.to(_TORCH_DTYPES[self.dtype]).numpy()
        ok = np.ones((n_q, n_k), dtype=bool) if allowed is None else \
            torch.as_tensor(allowed).detach().cpu().numpy().astype(bool, copy=False)
        if ok.shape != (n_q, n_k):
            raise ValueError(f"allowed: expected shape {(n_q, n_k)}, got {ok.shape}")
        if self._group is None:
            self._layout(heads, kv, n_q, n_k)
            self.kv_group, self.model_heads, self.model_kv_heads = kv, n_head, int(n_kv_heads or n_head)
        elif out["probs"].shape != self._group["probs"].shape[1:]:
            raise ValueError(f"layer {layer}: (head, query, key) shape {out['probs'].shape} differs from the "
                             f"layers before, {self._group['probs'].shape[1:]}")
        i = len(self.layers)
        for name, value in (*out.items(), ("allowed", ok), ("layer", np.int64(layer))):
            arr = self._group[name]
            arr.resize((i + 1, *arr.shape[1:]))
            arr[i] = value
        self.layers.append(layer)

    def finish(self, model_layers: int) -> None:
        """Record the model's size beside the stored selection: attributes `model_layers`,
        `model_heads` and `model_kv_heads` (per layer)."""
        if not self.layers:
            raise ValueError(f"{self._where()}: no layer was written (extract.layers selects none?)")
        self._group.attrs.update(model_layers=int(model_layers), model_heads=self.model_heads,
                                 model_kv_heads=self.model_kv_heads)

@contextlib.contextmanager
def attention_writer(out, *, tokens, attrs: dict, dtype: str = "float32", heads=None, token_text=None):
    """An `AttentionWriter` on a temporary sibling of the store `out`, renamed to `out` when the
    block ends without error and after at least one layer; removed otherwise."""
    with store.atomic_output(store.store_path(out)) as tmp:
        writer = AttentionWriter(tmp, tokens=tokens, attrs=attrs, dtype=dtype, heads=heads, token_text=token_text)
        yield writer
        if not writer.layers:
            raise ValueError(f"{store.store_path(out)}: no layer was written (extract.layers selects none?)")


def _pick(n_available: int, n: int, seed: int, what: str, ordered: bool = False) -> np.ndarray:
    """The candidates extracted as samples 0..n-1: the first n (`ordered`: the user's own inputs,
    in their order) or n drawn without replacement with `seed`, sorted."""
    if n_available < n:
        raise ValueError(f"extract.n_samples: {n} samples requested but only {n_available} {what} "
                         "are available; lower n_samples")
    if ordered:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n_available, size=n, replace=False))


def _log_size(out, name: str, sample: int, n_layers: int, n_heads: int, n_tokens: int, dtype: str) -> None:
    nbytes = store_nbytes(n_layers, n_heads, n_tokens, dtype)
    root = Path(store.store_path(out)).resolve().parent
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    log.info("%s sample %d: writing %d layers x %d heads x %d x %d tokens in %s, about %.1f MB before "
             "compression (%.1f GB free at %s)", name, sample, n_layers, n_heads, n_tokens, n_tokens, dtype,
             nbytes / 1e6, free / 1e9, root)
    if nbytes > free:
        log.warning("%s sample %d: the store may not fit on the disk (%.1f GB before compression, %.1f GB "
                    "free); consider extract.dtype float16 or extract.layers / extract.heads", name, sample,
                    nbytes / 1e9, free / 1e9)


def _check_layers(layers, n_layers: int) -> None:
    bad = sorted(v for v in layers or [] if not 0 <= v < n_layers)
    if bad:
        raise ValueError(f"extract.layers: {bad} outside the model's {n_layers} attention layers; allowed: "
                         f"0..{n_layers - 1}")


def extract(kind: str, model: dict, data_npz, data_meta, checkpoint, out, sample: int,
            device="auto", config_slice: dict | None = None, code: str | None = None,
            prepared=None) -> None:
    """Extract scores and probabilities of the heads of one sample (docs/method.md §9, §12): every layer and
    head, or those of `extract.layers` / `extract.heads`, stored as `extract.dtype`.

    Samples are drawn without replacement with the extraction seed, so sample i is the
    same input whichever job extracts it. `prepared`: the directory `prepare_model` wrote
    for a GGUF model, or its config.json (loaded instead of `model["path"]`).
    """
    extract_samples(kind, model, data_npz, data_meta, checkpoint, [out], [sample], device=device,
                    config_slice=config_slice, code=code, prepared=prepared)


def extract_samples(kind: str, model: dict, data_npz, data_meta, checkpoint, outs: list, samples: list,
                    device="auto", config_slice: dict | None = None, code: str | None = None,
                    prepared=None) -> None:
    """`extract` for several samples, the model loaded once: sample samples[i] into the store
    outs[i] (one job for all samples of a small model)."""
    model_kind = adapter_for(kind)
    dev = resolve_device(device)
    ex = model["extract"]
    n, seed, dtype = ex["n_samples"], ex["seed"], ex["dtype"]
    layers, heads = ex.get("layers"), ex.get("heads")
    if len(outs) != len(samples):
        raise ValueError(f"extract: {len(samples)} samples for {len(outs)} output stores")
    for sample in samples:
        if not 0 <= sample < n:
            raise ValueError(f"sample: {sample} is outside 0..{n - 1} (extract.n_samples = {n})")
    meta = json.loads(Path(data_meta).read_text())
    loaded = model_kind.extraction(model, data_npz=data_npz, meta=meta, checkpoint=checkpoint, device=dev,
                                   prepared=prepared)
    picked = _pick(loaded.n_available, n, seed, loaded.available, model_kind.ordered_samples(model))
    provenance = store.provenance_attrs(config_slice or {}, loaded.source_hash, code=code)
    wanted = None if layers is None else set(layers)
    for out, sample in zip(outs, samples):
        idx = int(picked[sample])
        item = loaded.sample(idx)
        attrs = {"model": model["name"], "kind": kind, "sample": int(sample), **item.attrs, "source_index": idx,
                 **provenance}
        if item.n_layers:
            _check_layers(layers, item.n_layers)
        _log_size(out, model["name"], sample, len(layers) if layers else item.n_layers,
                  len(heads) if heads else item.n_heads, item.n_tokens, dtype)
        with attention_writer(out, tokens=item.tokens, attrs=attrs, dtype=dtype, heads=heads,
                              token_text=item.token_text) as writer:
            def on_layer(layer, scores, probs, allowed, n_kv_heads):
                if wanted is None or layer in wanted:
                    writer.write(layer, scores, probs, allowed, n_kv_heads)

            n_model = item.run(on_layer)
            _check_layers(layers, n_model)
            writer.finish(n_model)
        log.info("%s sample %d: source %d, %d layers x %d heads, %d tokens", model["name"], sample, idx,
                 len(writer.layers), writer.kv_group.size, item.n_tokens)
