"""Stage `prepare_data`: a model's dataset (token-id splits and vocabulary, images, or held-out texts)."""
from __future__ import annotations

import logging
from pathlib import Path

from ..data import text as textdata
from ..store import save_json, save_npz

log = logging.getLogger("oattn")

__all__ = ["prepare_data"]


def prepare_data(kind: str, data: dict, out_npz, out_meta, data_root="resources") -> None:
    """Build a model's dataset: token-id splits and vocabulary, images, or held-out texts."""
    if kind in ("txl", "hf"):
        if data["corpus"] == "wikitext103":
            splits = textdata.load_wikitext(Path(data_root))
            vocab = textdata.Vocab.build(splits["train"], min_freq=data["min_freq"],
                                         max_size=data["max_size"])
            ids = {k: vocab.encode(v) for k, v in splits.items()}
            texts = None
        else:
            docs = textdata.stdlib_corpus()
            log.info("stdlib corpus: %d documents", len(docs))
            ds = textdata.build_text_dataset(docs, seed=data["seed"],
                                             min_freq=data["min_freq"],
                                             max_size=data["max_size"])
            vocab = ds.pop("vocab")
            ids = ds
            # a pretrained (hf) model is not trained here: every document can be drawn as a sample or
            # held out for the ablation (enough of them are 1024 tokens long for an LLM's samples);
            # a model trained here only ever sees its test split
            texts = docs if kind == "hf" else textdata.split_documents(docs, seed=data["seed"])[2]
        meta = {"kind": kind, "vocab": list(vocab.itos),
                "sizes": {k: int(v.size) for k, v in ids.items()}}
        if kind == "hf":
            # a transformer with its own tokenizer reads raw held-out text
            meta["test_texts"] = texts if texts is not None else []
        save_npz(out_npz, **ids)
        log.info("text splits (tokens): %s; vocabulary %d", meta["sizes"], len(vocab))
    elif kind == "vit":
        from ..data import images  # torch: only for image datasets

        name = data["dataset"]
        size = data["image_size"]
        if name == "digits":
            d = images.digits_dataset(size=size, seed=data["seed"])
            arrays = {k: d[k] for k in ("train_images", "train_labels", "test_images", "test_labels")}
            meta = {"kind": kind, "dataset": name, "mean": d["mean"], "std": d["std"]}
        else:
            root = Path(data_root)
            tr, trl = images.load_cifar10(root, "train")
            te, tel = images.load_cifar10(root, "test")
            arrays = {"train_images": tr, "train_labels": trl, "test_images": te, "test_labels": tel}
            meta = {"kind": kind, "dataset": name, "image_size": size, "layout": "NHWC uint8"}
        meta["sizes"] = {k: int(v.shape[0]) for k, v in arrays.items() if k.endswith("labels")}
        save_npz(out_npz, **arrays)
        log.info("image dataset %s: %s", name, meta["sizes"])
    else:
        raise ValueError(f"kind: unknown model kind {kind!r} (allowed: txl, vit, hf)")
    save_json(out_meta, meta)
