"""Datasets of the paper and small stand-ins that need no download (docs/method.md §9).

- `text`: WikiText-103 (`load_wikitext`) and the English text shipped with Python
  (`stdlib_corpus`), word tokenisation, `Vocab`, document-level splits.
- `images`: CIFAR-10 (`load_cifar10`, `cifar10_for_vit`) and scikit-learn's digits
  (`digits_dataset`).
- `download`: `download`, `fetch_wikitext103`, `fetch_cifar10`, only ever called
  explicitly (by the workflow's download rules).

Names are imported on first use (PEP 562), so text-only scripts do not import torch.
"""
from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "text": ("stdlib_corpus", "stdlib_named_documents", "tokenize_words", "Vocab",
             "split_documents", "build_text_dataset", "load_wikitext", "wikitext_articles", "UNK", "EOS",
             "WIKITEXT_FILES"),
    "images": ("digits_dataset", "load_cifar10", "cifar10_for_vit", "CIFAR10_CLASSES",
               "IMAGENET_MEAN", "IMAGENET_STD"),
    "download": ("download", "fetch_wikitext103", "fetch_cifar10", "WIKITEXT103_URLS",
                 "WIKITEXT103_MD5", "CIFAR10_URL", "CIFAR10_MD5"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
