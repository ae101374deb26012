"""The workflow's stages as plain functions: files in, files out.

Each Snakemake script calls one function here with the rule's inputs, outputs and
params; everything is importable and testable without Snakemake. Outputs are written
atomically (`store.write_store`, `_save_*`), so a killed job never leaves an output a
rerun would trust.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from . import store
from .store import StoreError

log = logging.getLogger("oattn")

__all__ = ["setup_logging", "resolve_device", "prepare_data", "train_model", "extract",
           "organize", "decompose", "entropy", "tables", "figures", "summary", "network_tensor"]


# -- plumbing -------------------------------------------------------------------------------
def setup_logging(log_path: str | os.PathLike | None, threads: int | None = None) -> logging.Logger:
    """Log to `log_path` (and stderr); uncaught errors are logged before they propagate.

    `threads` (the rule's) caps torch's intra-op threads, so parallel jobs do not
    oversubscribe the cores.
    """
    if threads:
        torch.set_num_threads(int(threads))
        os.environ.setdefault("NUMBA_NUM_THREADS", str(int(threads)))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    logging.captureWarnings(True)
    previous = sys.excepthook

    def log_uncaught(exc_type, exc, tb):
        log.error("stage failed: %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))
        previous(exc_type, exc, tb)

    sys.excepthook = log_uncaught
    return log


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' requested in the config but no CUDA device is visible")
    return torch.device(name)


def _save_npz(path, **arrays) -> None:
    tmp = store.atomic_path(path)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save_json(path, obj) -> None:
    store.atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _load_npz(path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:
        raise StoreError(f"{path}: cannot read dataset file ({type(exc).__name__}: {exc}); "
                         "delete it so the workflow regenerates it") from exc


# -- data ---------------------------------------------------------------------------------
def prepare_data(kind: str, data: dict, out_npz, out_meta, data_root="resources") -> None:
    """Build a model's dataset: token-id splits and vocabulary, images, or held-out texts."""
    from .data import text as textdata

    if kind in ("txl", "hf"):
        if data.get("corpus", "stdlib") == "wikitext103":
            splits = textdata.load_wikitext(Path(data_root))
            vocab = textdata.Vocab.build(splits["train"], min_freq=data.get("min_freq", 1),
                                         max_size=data.get("max_size"))
            ids = {k: vocab.encode(v) for k, v in splits.items()}
            texts = None
        else:
            docs = textdata.stdlib_corpus()
            log.info("stdlib corpus: %d documents", len(docs))
            ds = textdata.build_text_dataset(docs, seed=data.get("seed", 0),
                                             min_freq=data.get("min_freq", 3),
                                             max_size=data.get("max_size"))
            vocab = ds.pop("vocab")
            ids = ds
            texts = textdata.split_documents(docs, seed=data.get("seed", 0))[2]
        meta = {"kind": kind, "vocab": list(vocab.itos),
                "sizes": {k: int(v.size) for k, v in ids.items()}}
        if kind == "hf":
            # a transformer with its own tokenizer reads raw held-out text
            meta["test_texts"] = texts if texts is not None else []
        _save_npz(out_npz, **ids)
        log.info("text splits (tokens): %s; vocabulary %d", meta["sizes"], len(vocab))
    elif kind == "vit":
        from .data import images
        name = data.get("dataset", "digits")
        size = data.get("image_size", 32)
        if name == "digits":
            d = images.digits_dataset(size=size, seed=data.get("seed", 0))
            arrays = {k: d[k] for k in ("train_images", "train_labels", "test_images", "test_labels")}
            meta = {"kind": kind, "dataset": name, "mean": d["mean"], "std": d["std"]}
        else:
            root = Path(data_root)
            tr, trl = images.load_cifar10(root, "train")
            te, tel = images.load_cifar10(root, "test")
            arrays = {"train_images": tr, "train_labels": trl, "test_images": te, "test_labels": tel}
            meta = {"kind": kind, "dataset": name, "image_size": size, "layout": "NHWC uint8"}
        meta["sizes"] = {k: int(v.shape[0]) for k, v in arrays.items() if k.endswith("labels")}
        _save_npz(out_npz, **arrays)
        log.info("image dataset %s: %s", name, meta["sizes"])
    else:
        raise ValueError(f"kind: unknown model kind {kind!r} (allowed: txl, vit, hf)")
    _save_json(out_meta, meta)


# -- models ---------------------------------------------------------------------------------
def _vit_split(arrays: dict, meta: dict, split: str, size: int):
    """Stored images of a split and the per-batch transform to model input (or None).

    CIFAR-10 stays uint8 at 32 px and is resized batch by batch: its 50,000 training images
    at 224 px would take 30 GB as floats.
    """
    x = torch.from_numpy(arrays[f"{split}_images"])
    if meta.get("dataset") == "cifar10":
        from .data.images import cifar10_for_vit
        return x, lambda batch: cifar10_for_vit(batch.numpy(), size=size)
    return x, None


def _vit_images(arrays: dict, meta: dict, split: str, size: int) -> torch.Tensor:
    """Model input for a (small) set of stored images, e.g. the extracted samples."""
    x, transform = _vit_split(arrays, meta, split, size)
    return transform(x) if transform else x


def _build(kind: str, arch: dict, n_token: int | None = None, image_size: int = 32, pretrained=False):
    if kind == "txl":
        from .models.txl import TransformerXL, TXLConfig
        return TransformerXL(TXLConfig(n_token=n_token, **{**arch, "cutoffs": tuple(arch.get("cutoffs", ()))}))
    if kind == "vit":
        arch = dict(arch)
        if arch.pop("variant", "custom") == "vit_b_16":
            from .models.vit import build_vit_b_16
            return build_vit_b_16(num_classes=10, pretrained=pretrained)
        from .models.vit import build_vit
        return build_vit(image_size=image_size, **arch)
    raise ValueError(f"kind: {kind!r} has no trainable model here (allowed: txl, vit)")


def train_model(kind: str, arch: dict, train: dict, data: dict, data_npz, data_meta,
                checkpoint_out, metrics_out, device="auto", pretrained=False) -> None:
    """Train a txl or vit model, seeded; save the checkpoint and its metrics."""
    from . import train as trainlib

    dev = resolve_device(device)
    arrays, meta = _load_npz(data_npz), json.loads(Path(data_meta).read_text())
    torch.manual_seed(train.get("seed", 0))
    if kind == "txl":
        model = _build(kind, arch, n_token=len(meta["vocab"]))
        res = trainlib.train_txl(model, torch.from_numpy(arrays["train"]), torch.from_numpy(arrays["valid"]),
                                 steps=train["steps"], batch_size=train["batch_size"], lr=train["lr"],
                                 warmup=train.get("warmup", 0), seed=train.get("seed", 0), device=dev,
                                 log=log)
        metrics = {"valid_ppl": res["valid_ppl"], "unigram_ppl": res["unigram_ppl"]}
        log.info("validation perplexity %.2f (unigram baseline %.2f)", res["valid_ppl"], res["unigram_ppl"])
    elif kind == "vit":
        size = data.get("image_size", 32)
        model = _build(kind, arch, image_size=size, pretrained=pretrained)
        (tr, transform), (te, _) = (_vit_split(arrays, meta, s, size) for s in ("train", "test"))
        res = trainlib.train_vit(model, tr, torch.from_numpy(arrays["train_labels"]),
                                 te, torch.from_numpy(arrays["test_labels"]),
                                 epochs=train["epochs"], batch_size=train["batch_size"], lr=train["lr"],
                                 seed=train.get("seed", 0), device=dev, log=log, transform=transform)
        metrics = {"test_accuracy": res["test_accuracy"]}
        log.info("test accuracy %.4f", res["test_accuracy"])
    else:
        raise ValueError(f"kind: {kind!r} is not trained by the workflow (allowed: txl, vit)")
    metrics["history"] = res["history"]
    save_checkpoint(model, kind, arch, data, metrics, checkpoint_out, metrics_out)


def save_checkpoint(model, kind: str, arch: dict, data: dict, metrics: dict, checkpoint_out, metrics_out) -> None:
    """Save weights (CPU, with what built them) and metrics plus the weights' hash, atomically."""
    from . import train as trainlib

    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    metrics["state_sha256"] = trainlib.state_hash(state)
    tmp = store.atomic_path(checkpoint_out)
    try:
        torch.save({"kind": kind, "arch": arch, "data": data, "state_dict": state}, tmp)
        os.replace(tmp, checkpoint_out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _save_json(metrics_out, metrics)


# -- extraction -----------------------------------------------------------------------------
def _attention_dataset(scores, probs, tokens, attrs, token_text=None) -> xr.Dataset:
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
            device="auto", config_slice: dict | None = None) -> None:
    """Extract scores and probabilities of every head for one sample (SPEC 7-8).

    Samples are drawn without replacement with the extraction seed, so sample i is the
    same input whichever job extracts it.
    """
    dev = resolve_device(device)
    ex = model["extract"]
    n, seed = ex["n_samples"], ex.get("seed", 0)
    if not 0 <= sample < n:
        raise ValueError(f"sample: {sample} is outside 0..{n - 1} (extract.n_samples = {n})")
    meta = json.loads(Path(data_meta).read_text())
    attrs = {"model": model["name"], "kind": kind, "sample": int(sample)}
    token_text = None
    if kind == "hf":
        from .models.hf import hf_attention, load_hf
        net, tok = load_hf(model["path"], device=dev)
        max_len = ex.get("max_length", 128)
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
        ck_hash = _hf_hash(model["path"])
    else:
        ck = torch.load(checkpoint, map_location="cpu", weights_only=False)
        ck_hash = store.file_sha256(checkpoint)
        arrays = _load_npz(data_npz)
        if kind == "txl":
            net = _build("txl", ck["arch"], n_token=len(meta["vocab"]))
            tgt = ck["arch"].get("tgt_len", 64)
            test = arrays["test"]
            idx = int(_pick(test.size // tgt, n, seed, f"test segments of {tgt} tokens")[sample])
            toks = test[idx * tgt:(idx + 1) * tgt]
            token_text = [meta["vocab"][t] for t in toks]
        elif kind == "vit":
            size = model.get("data", {}).get("image_size", 32)
            net = _build("vit", ck["arch"], image_size=size)
            idx = int(_pick(arrays["test_labels"].shape[0], n, seed, "test images")[sample])
            img = _vit_images({"test_images": arrays["test_images"][idx:idx + 1]}, meta, "test", size)
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
                from .models.vit import vit_attention
                _, s, p = vit_attention(net, img.to(dev))
                scores, probs = s[0].cpu().numpy(), p[0].cpu().numpy()
                toks = np.arange(-1, probs.shape[-1] - 1)  # -1 = class token, then patch index
    attrs["source_index"] = idx
    ds = _attention_dataset(scores, probs, toks, {**attrs, **store.provenance_attrs(config_slice or {}, ck_hash)},
                            token_text=token_text)
    store.write_store(ds, out)
    log.info("%s sample %d: source %d, %d layers x %d heads, %d tokens", model["name"], sample, idx,
             ds.sizes["layer"], ds.sizes["head"], ds.sizes["query"])


def _hf_hash(path: str) -> str:
    """Hash of a local Hugging Face model's weight files (provenance of `hf` models)."""
    from .models.hf import minilm_path
    root = Path(minilm_path() if path == "minilm" else path)
    if not root.is_dir():
        return f"hub:{path}"
    import hashlib
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix in (".safetensors", ".bin", ".json"):
            h.update(f.name.encode())
            h.update(store.file_sha256(f).encode())
    return h.hexdigest()


# -- analysis -------------------------------------------------------------------------------
def network_tensor(ds: xr.Dataset, quantity: str, crop=None) -> xr.DataArray:
    """The network 3-tensor (query, key, unit) of one sample; unit = (layer, head) pairs.

    `crop` = (start, stop) keeps rows and columns start:stop (the authors' ViT window).
    """
    if quantity not in ("scores", "probs"):
        raise ValueError(f"quantity: must be 'scores' or 'probs', got {quantity!r}")
    x = ds[quantity]
    if crop is not None:
        a, b = int(crop[0]), int(crop[1])
        if not 0 <= a < b <= x.sizes["query"]:
            raise ValueError(f"extract.crop: {crop} does not fit {x.sizes['query']} tokens")
        x = x.isel(query=slice(a, b), key=slice(a, b))
    x = x.stack(unit=("layer", "head")).transpose("query", "key", "unit")
    return x


def _unit_coords(x: xr.DataArray) -> dict:
    return {"unit_layer": ("unit", x["layer"].values.astype(np.int64)),
            "unit_head": ("unit", x["head"].values.astype(np.int64))}


def _plain(x: xr.DataArray) -> np.ndarray:
    return np.ascontiguousarray(x.values, dtype=np.float32)


def _load_network(attention_store, quantity, crop):
    ds = store.read_store(attention_store, require=(quantity,), finite=(quantity,))
    x = network_tensor(ds, quantity, crop)
    return ds, x


def organize(attention_store, out, quantity: str, crop=None, params: dict | None = None,
             config_slice: dict | None = None) -> None:
    """Run the 3-D questionnaire on one sample and store trees and affinities (SPEC 3.2)."""
    from .questionnaire import questionnaire3d

    params = dict(params or {})
    ds, x = _load_network(attention_store, quantity, crop)
    org = questionnaire3d(_plain(x), **params)
    out_ds = xr.Dataset(
        {"tree_q": (("level_q", "query"), org.tree_q.labels),
         "tree_k": (("level_k", "key"), org.tree_k.labels),
         "tree_h": (("level_h", "unit"), org.tree_h.labels),
         "affinity_q": (("query", "query_"), org.affinity_q.astype(np.float32)),
         "affinity_k": (("key", "key_"), org.affinity_k.astype(np.float32)),
         "affinity_h": (("unit", "unit_"), org.affinity_h.astype(np.float32))},
        coords={"query": x["query"].values, "key": x["key"].values, **_unit_coords(x)},
        attrs={**{k: v for k, v in ds.attrs.items() if k in ("model", "sample", "kind", "checkpoint_sha256")},
               **store.provenance_attrs(config_slice or {}, ds.attrs.get("checkpoint_sha256"),
                                        quantity=quantity)})
    store.write_store(out_ds, out)
    log.info("organized: levels q=%d k=%d h=%d", org.tree_q.n_levels, org.tree_k.n_levels, org.tree_h.n_levels)


def load_organization(path):
    from .questionnaire import Organization
    from .trees import PartitionTree
    ds = store.read_store(path, require=("tree_q", "tree_k", "tree_h", "affinity_h"))
    return Organization(PartitionTree(ds["tree_q"].values), PartitionTree(ds["tree_k"].values),
                        PartitionTree(ds["tree_h"].values), ds["affinity_q"].values.astype(np.float64),
                        ds["affinity_k"].values.astype(np.float64),
                        ds["affinity_h"].values.astype(np.float64)), ds


def _figure_units(figure_heads, n_layer, n_head) -> list[tuple[int, int]]:
    units = []
    for layer, head in figure_heads:
        lay, hd = layer % n_layer if layer < 0 else layer, head % n_head if head < 0 else head
        if not (0 <= lay < n_layer and 0 <= hd < n_head):
            raise ValueError(f"decompose.figure_heads: ({layer}, {head}) is outside the model's "
                             f"{n_layer} layers x {n_head} heads")
        units.append((lay, hd))
    return units


def decompose(attention_store, organized_store, out, quantity: str, crop=None,
              figure_heads=((0, 0),), questionnaire2d_iters: int = 10, random_tree_seeds: int = 3,
              config_slice: dict | None = None) -> None:
    """bi-Haar per head, tri-Haar of the network, random-tree baselines, the figure heads'
    2-D organization and paraproduct, and the diffusion map of heads (SPEC 2, 4-6)."""
    from .diffusion import diffusion_map
    from .entropy import _l1_over_l2
    from .haar import bihaar, haar_basis, trihaar
    from .paraproduct import paraproduct
    from .questionnaire import questionnaire2d
    from .trees import random_tree

    ds, x = _load_network(attention_store, quantity, crop)
    org, ods = load_organization(organized_store)
    xv = torch.from_numpy(_plain(x))
    c2 = bihaar(xv, org.tree_q, org.tree_k)
    c3 = trihaar(xv, org.tree_q, org.tree_k, org.tree_h)
    (_, sq, lq), (_, sk, lk), (_, sh, lh) = (haar_basis(t) for t in (org.tree_q, org.tree_k, org.tree_h))
    rng = np.random.default_rng(0)
    rand_l1, rand_ratio = [], []
    for _ in range(random_tree_seeds):
        cr = trihaar(xv, *(random_tree(n, rng) for n in xv.shape))
        rand_l1.append(float(cr.abs().double().sum()))
        rand_ratio.append(float(_l1_over_l2(cr.reshape(-1), 0)))
    n_layer, n_head = ds.sizes["layer"], ds.sizes["head"]
    units = _figure_units(figure_heads, n_layer, n_head)
    fig = {k: [] for k in ("original", "organized3d", "organized2d", "exact", "approx", "residual")}
    rel, rel_unorg = [], []
    # Theorem 1 is about softmax of the pre-softmax head, whatever quantity is analysed
    logits = network_tensor(ds, "scores", crop)
    for layer, head in units:
        f = _plain(x.sel(layer=layer, head=head))
        g = _plain(logits.sel(layer=layer, head=head)).astype(np.float64)
        tr, tc = questionnaire2d(g, n_iters=questionnaire2d_iters)
        pp = paraproduct(g, row_order=tr.order, col_order=tc.order)
        pu = paraproduct(g)
        fig["original"].append(f)
        fig["organized3d"].append(f[np.ix_(org.tree_q.order, org.tree_k.order)])
        fig["organized2d"].append(np.asarray(pp.organized))
        fig["exact"].append(np.asarray(pp.exact))
        fig["approx"].append(np.asarray(pp.approximation))
        fig["residual"].append(np.asarray(pp.residual))
        rel.append(float(pp.relative_residual))
        rel_unorg.append(float(pu.relative_residual))
    dm = diffusion_map(org.affinity_h, n_components=3)
    fh = ("fig_head", "row", "col")
    out_ds = xr.Dataset(
        {"bihaar": (("qbasis", "kbasis", "unit"), c2.numpy()),
         "trihaar": (("qbasis", "kbasis", "hbasis"), c3.numpy()),
         "support_q": ("qbasis", sq), "level_q": ("qbasis", lq),
         "support_k": ("kbasis", sk), "level_k": ("kbasis", lk),
         "support_h": ("hbasis", sh), "level_h": ("hbasis", lh),
         "network_l1": ((), float(c3.abs().double().sum())),
         "network_l1_random": ((), float(np.mean(rand_l1))),
         "network_sparsity_random": ((), float(np.mean(rand_ratio))),
         "diffusion_coords": (("unit", "component"), np.asarray(dm.coords, dtype=np.float32)),
         "diffusion_eigenvalues": ("eig", np.asarray(dm.eigenvalues, dtype=np.float64)),
         **{f"fig_{k}": (fh, np.stack(v).astype(np.float32)) for k, v in fig.items()},
         "fig_rel_residual": ("fig_head", np.array(rel)),
         "fig_rel_residual_unorganized": ("fig_head", np.array(rel_unorg))},
        coords={**_unit_coords(x), "fig_layer": ("fig_head", [u[0] for u in units]),
                "fig_head_index": ("fig_head", [u[1] for u in units])},
        attrs={**{k: v for k, v in ds.attrs.items() if k in ("model", "sample", "kind")},
               **store.provenance_attrs(config_slice or {}, ds.attrs.get("checkpoint_sha256"),
                                        quantity=quantity)})
    store.write_store(out_ds, out)
    log.info("decomposed: network l1 %.4g (random trees %.4g); paraproduct residual %s (unorganized %s)",
             out_ds["network_l1"].item(), out_ds["network_l1_random"].item(),
             np.round(rel, 4).tolist(), np.round(rel_unorg, 4).tolist())


def entropy(decomposed_stores: list, out, head_top_k: int, network_top_k: int,
            config_slice: dict | None = None) -> None:
    """Per-head and per-network l1 entropies and sparsity for every sample (SPEC 4)."""
    from .entropy import _l1_over_l2, coarse_l1

    rows = {k: [] for k in ("head_entropy", "head_sparsity", "network_entropy", "network_sparsity",
                            "network_l1", "network_l1_random", "network_sparsity_random")}
    first = None
    for path in decomposed_stores:
        ds = store.read_store(path, require=("bihaar", "trihaar"), finite=("bihaar", "trihaar"))
        first = first or ds
        c2 = torch.from_numpy(ds["bihaar"].values)
        c3 = torch.from_numpy(ds["trihaar"].values)
        sup2 = [ds["support_q"].values, ds["support_k"].values]
        lev2 = [ds["level_q"].values, ds["level_k"].values]
        try:
            rows["head_entropy"].append(coarse_l1(c2, sup2, lev2, head_top_k))
            rows["network_entropy"].append(float(coarse_l1(c3, sup2 + [ds["support_h"].values],
                                                           lev2 + [ds["level_h"].values], network_top_k)))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc} (entropy.head_top_k / entropy.network_top_k)") from exc
        rows["head_sparsity"].append(_l1_over_l2(c2, (0, 1)).numpy())
        rows["network_sparsity"].append(float(_l1_over_l2(c3.reshape(-1), 0)))
        for k in ("network_l1", "network_l1_random", "network_sparsity_random"):
            rows[k].append(float(ds[k].values))
    n_s = len(decomposed_stores)
    layers = first["unit_layer"].values
    heads = first["unit_head"].values
    n_layer, n_head = int(layers.max()) + 1, int(heads.max()) + 1

    def grid(v):
        g = np.full((n_layer, n_head), np.nan)
        g[layers, heads] = v
        return g

    out_ds = xr.Dataset(
        {"head_entropy": (("sample", "layer", "head"), np.stack([grid(v) for v in rows["head_entropy"]])),
         "head_sparsity": (("sample", "layer", "head"), np.stack([grid(v) for v in rows["head_sparsity"]])),
         **{k: ("sample", np.asarray(rows[k])) for k in rows if k.startswith("network")}},
        coords={"sample": np.arange(n_s), "layer": np.arange(n_layer), "head": np.arange(n_head)},
        attrs={"model": first.attrs.get("model", ""),
               **store.provenance_attrs(config_slice or {}, first.attrs.get("checkpoint_sha256"),
                                        head_top_k=head_top_k, network_top_k=network_top_k)})
    store.write_store(out_ds, out)
    log.info("entropy: %d samples, network entropy %s", n_s, np.round(rows["network_entropy"], 3).tolist())


def tables(entropy_store, out_table1_csv, out_table1_md, out_table2_csv, out_table2_md,
           fraction: float = 0.1, model_name: str = "") -> None:
    """Table 1 (most frequent top/bottom heads, Jaccard stability) and Table 2 (network entropy)."""
    import pandas as pd

    from .entropy import extreme_heads, jaccard_stability

    ds = store.read_store(entropy_store, require=("head_entropy", "network_entropy"))
    e = ds["head_entropy"].values  # (sample, layer, head)
    n_s, n_layer, n_head = e.shape
    flat = e.reshape(n_s, -1)
    ext = extreme_heads(flat, fraction)
    jac = jaccard_stability(flat, fraction, "bottom")
    off = jac[~np.eye(n_s, dtype=bool)]
    mean_e = flat.mean(0)
    rows = []
    for which, counts in (("top", ext["top"]), ("bottom", ext["bottom"])):
        # most frequent first; ties: more extreme mean entropy first
        key = -mean_e if which == "top" else mean_e
        order = np.lexsort((key, -counts))[:3]
        for rank, u in enumerate(order, 1):
            rows.append({"model": model_name, "set": which, "rank": rank, "layer": int(u // n_head),
                         "head": int(u % n_head), "count": f"{int(counts[u])}/{n_s}",
                         "mean_entropy": float(mean_e[u])})
    t1 = pd.DataFrame(rows)
    stability = (float(off.mean()) if off.size else float("nan"))
    t2 = pd.DataFrame({"model": model_name, "sample": ds["sample"].values,
                       "network_entropy": ds["network_entropy"].values,
                       "network_sparsity": ds["network_sparsity"].values,
                       "network_sparsity_random_trees": ds["network_sparsity_random"].values,
                       "network_l1": ds["network_l1"].values,
                       "network_l1_random_trees": ds["network_l1_random"].values})
    for df, csv, md, note in (
            (t1, out_table1_csv, out_table1_md,
             f"\n\nSet size k = {ext['k']} of {n_layer * n_head} heads per sample. Bottom-{fraction:.0%} "
             f"Jaccard stability across {n_s} samples: mean {stability:.3f} "
             f"(min {off.min() if off.size else float('nan'):.3f}).\n"),
            (t2, out_table2_csv, out_table2_md,
             "\n\nnetwork_entropy: sum of the |coefficients| of the coarsest tri-Haar functions (the "
             "paper's measure); network_sparsity: l1/l2 of all tri-Haar coefficients (lower is sparser), "
             "beside the same under random trees.\n")):
        store.atomic_write_text(csv, df.to_csv(index=False))
        store.atomic_write_text(md, df.to_markdown(index=False, floatfmt=".4g") + note)


def figures(model_name: str, attention_stores: list, organized_stores: list, decomposed_stores: list,
            entropy_store, outs: dict, entropy_samples: int = 3, trihaar_samples: int = 5,
            trihaar_top_k: int = 100) -> None:
    """Figures 1-6 of the paper for one model, from the stored artifacts."""
    from . import plots
    from .entropy import coarsest
    from .haar import haar_basis

    dec0 = store.read_store(decomposed_stores[0])
    org0, _ = load_organization(organized_stores[0])
    names = [f"{int(l)}.{int(h)}" for l, h in zip(dec0["fig_layer"].values, dec0["fig_head_index"].values)]
    units = [f"{int(l)}.{int(h)}" for l, h in zip(dec0["unit_layer"].values, dec0["unit_head"].values)]
    i = 0
    plots.save(plots.fig1_organized_head(dec0["fig_original"].values[i], dec0["fig_organized3d"].values[i],
                                         f"{model_name}, head {names[i]}, sample 0"), outs["fig1"])
    plots.save(plots.fig2_paraproduct(dec0["fig_exact"].values[i], dec0["fig_approx"].values[i],
                                      dec0["fig_residual"].values[i], float(dec0["fig_rel_residual"].values[i]),
                                      float(dec0["fig_rel_residual_unorganized"].values[i]),
                                      f"{model_name}, head {names[i]}, sample 0"), outs["fig2"])
    plots.save(plots.fig3_head_geometry(dec0["diffusion_coords"].values, org0.affinity_h,
                                        org0.tree_h.labels, units, org0.tree_h.order), outs["fig3"])
    sup = np.outer(dec0["support_q"].values, dec0["support_k"].values).ravel()
    lev = np.add.outer(dec0["level_q"].values, dec0["level_k"].values).ravel()
    by_support = np.lexsort((np.arange(sup.size), lev, -sup))
    picks = list(range(min(2, len(names))))
    coeffs, sups = [], []
    for j in picks:
        u = int(dec0["fig_layer"].values[j]) * int(dec0["unit_head"].values.max() + 1) + int(dec0["fig_head_index"].values[j])
        coeffs.append(dec0["bihaar"].values[:, :, u].ravel()[by_support])
        sups.append(sup[by_support])
    bh = haar_basis(org0.tree_h)[0]
    plots.save(plots.fig4_bihaar(coeffs, sups, [names[j] for j in picks],
                                 bh[org0.tree_h.order][:, :min(6, bh.shape[1])]), outs["fig4"])
    ent = store.read_store(entropy_store)
    k = min(entropy_samples, ent.sizes["sample"])
    plots.save(plots.fig5_entropy_heatmaps(ent["head_entropy"].values[:k], [f"sample {s}" for s in range(k)]),
               outs["fig5"])
    vals = []
    k6 = min(trihaar_samples, len(decomposed_stores))
    for path in decomposed_stores[:k6]:
        d = store.read_store(path, require=("trihaar",))
        idx = coarsest([d["support_q"].values, d["support_k"].values, d["support_h"].values],
                       [d["level_q"].values, d["level_k"].values, d["level_h"].values],
                       min(trihaar_top_k, d["trihaar"].size))
        vals.append(d["trihaar"].values.ravel()[idx])
    plots.save(plots.fig6_top_trihaar(np.stack(vals), [f"sample {s}" for s in range(k6)]), outs["fig6"])


def summary(metrics: dict, table_paths: dict, out_md) -> None:
    """One Markdown page: training metrics and every model's tables."""
    lines = ["# oattn results\n"]
    for name, path in metrics.items():
        m = json.loads(Path(path).read_text()) if path else {}
        shown = {k: v for k, v in m.items() if k not in ("history",)}
        lines.append(f"## {name}\n\n" + ("Training: " + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                                                                 for k, v in shown.items()) + "\n" if shown else
                                         "Pretrained, not trained here.\n"))
        for label, p in table_paths[name].items():
            lines.append(f"### {label}\n\n{Path(p).read_text()}\n")
    store.atomic_write_text(out_md, "\n".join(lines))
