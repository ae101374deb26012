"""Stage `extract`: scores and probabilities of every head for one sample (SPEC 7-8)."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from .. import store
from ..data.images import vit_images
from ..models.checkpoint import build_model, load_checkpoint
from ..models.files import is_minilm_alias, minilm_path
from ..runtime import resolve_device
from ..store import load_npz

log = logging.getLogger("oattn")

__all__ = ["attention_dataset", "extract", "hf_hash"]


def attention_dataset(scores, probs, tokens, attrs, token_text=None) -> xr.Dataset:
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


def _pick(n_available: int, n: int, seed: int, what: str) -> np.ndarray:
    if n_available < n:
        raise ValueError(f"extract.n_samples: {n} samples requested but only {n_available} {what} "
                         "are available; lower n_samples")
    return np.sort(np.random.default_rng(seed).choice(n_available, size=n, replace=False))


def extract(kind: str, model: dict, data_npz, data_meta, checkpoint, out, sample: int,
            device="auto", config_slice: dict | None = None, code: str | None = None) -> None:
    """Extract scores and probabilities of every head for one sample (SPEC 7-8).

    Samples are drawn without replacement with the extraction seed, so sample i is the
    same input whichever job extracts it.
    """
    dev = resolve_device(device)
    ex = model["extract"]
    n, seed = ex["n_samples"], ex["seed"]
    if not 0 <= sample < n:
        raise ValueError(f"sample: {sample} is outside 0..{n - 1} (extract.n_samples = {n})")
    meta = json.loads(Path(data_meta).read_text())
    attrs = {"model": model["name"], "kind": kind, "sample": int(sample)}
    token_text = None
    if kind == "hf":
        from ..models.hf import hf_attention, load_hf  # transformers: only for hf models

        net, tok = load_hf(model["path"], device=dev)
        max_len = ex["max_length"]
        # long enough texts only, so that every sample has exactly max_length tokens
        texts = [t for t in meta["test_texts"] if len(t) >= 4 * max_len]
        texts = [t for t in texts if len(tok(t, add_special_tokens=True)["input_ids"]) >= max_len]
        idx = int(_pick(len(texts), n, seed, f"held-out texts with >= {max_len} tokens")[sample])
        res = hf_attention(net, tok, [texts[idx]], max_length=max_len)
        if res["scores"] is None:
            raise ValueError(f"model {model['path']!r} does not expose pre-softmax scores "
                             "(no AttentionInterface support); use extract.quantity: probs")
        scores, probs = res["scores"][0].numpy(), res["probs"][0].numpy()
        toks, token_text = res["input_ids"][0].numpy(), res["tokens"][0]
        ck_hash = hf_hash(model["path"])
    else:
        ck = load_checkpoint(checkpoint)
        ck_hash = store.file_sha256(checkpoint)
        arrays = load_npz(data_npz)
        if kind == "txl":
            net = build_model("txl", ck["arch"], n_token=len(meta["vocab"]))
            tgt = ck["arch"]["tgt_len"]
            test = arrays["test"]
            idx = int(_pick(test.size // tgt, n, seed, f"test segments of {tgt} tokens")[sample])
            toks = test[idx * tgt:(idx + 1) * tgt]
            token_text = [meta["vocab"][t] for t in toks]
        elif kind == "vit":
            size = model["data"]["image_size"]
            net = build_model("vit", ck["arch"], image_size=size)
            idx = int(_pick(arrays["test_labels"].shape[0], n, seed, "test images")[sample])
            img = vit_images({"test_images": arrays["test_images"][idx:idx + 1]}, meta, "test", size)
            attrs["label"] = int(arrays["test_labels"][idx])
        else:
            raise ValueError(f"kind: unknown model kind {kind!r} (allowed: txl, vit, hf)")
        net.load_state_dict(ck["state_dict"])
        net.to(dev).eval()
        with torch.no_grad():
            if kind == "txl":
                res = net(torch.from_numpy(toks)[None].to(dev), mems=None, return_attention=True)
                scores, probs = res.scores[0].cpu().numpy(), res.probs[0].cpu().numpy()
            else:
                from ..models.vit import vit_attention

                _, s, p = vit_attention(net, img.to(dev))
                scores, probs = s[0].cpu().numpy(), p[0].cpu().numpy()
                toks = np.arange(-1, probs.shape[-1] - 1)  # -1 = class token, then patch index
    attrs["source_index"] = idx
    attrs.update(store.provenance_attrs(config_slice or {}, ck_hash, code=code))
    ds = attention_dataset(scores, probs, toks, attrs, token_text=token_text)
    store.write_store(ds, out)
    log.info("%s sample %d: source %d, %d layers x %d heads, %d tokens", model["name"], sample, idx,
             ds.sizes["layer"], ds.sizes["head"], ds.sizes["query"])


def hf_hash(path: str) -> str:
    """Hash of a local Hugging Face model's weight files (provenance of `hf` models)."""
    root = Path(minilm_path() if is_minilm_alias(path) else path)
    if not root.is_dir():
        return f"hub:{path}"
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix in (".safetensors", ".bin", ".json"):
            h.update(f.name.encode())
            h.update(store.file_sha256(f).encode())
    return h.hexdigest()
