"""Datasets of the paper and small stand-ins that need no download (SPEC 7).

- `text`: WikiText-103 (`load_wikitext`) and the English text shipped with Python
  (`stdlib_corpus`), word tokenisation, `Vocab`, document-level splits.
- `images`: CIFAR-10 (`load_cifar10`, `cifar10_for_vit`) and scikit-learn's digits
  (`digits_dataset`).
- `download`: `download`, `fetch_wikitext103`, `fetch_cifar10`, only ever called
  explicitly (by the workflow's download rules).

Names are imported on first use (PEP 562), so text-only scripts do not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "text": ("stdlib_corpus", "stdlib_named_documents", "tokenize_words", "Vocab",
             "split_documents", "build_text_dataset", "load_wikitext", "UNK", "EOS",
             "WIKITEXT_FILES"),
    "images": ("digits_dataset", "load_cifar10", "cifar10_for_vit", "CIFAR10_CLASSES",
               "IMAGENET_MEAN", "IMAGENET_STD"),
    "download": ("download", "fetch_wikitext103", "fetch_cifar10", "WIKITEXT103_URLS",
                 "WIKITEXT103_MD5", "CIFAR10_URL", "CIFAR10_MD5"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
