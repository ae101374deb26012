"""Word-level text data for the Transformer-XL experiments (docs/method.md §9.2).

Two sources:

- WikiText-103 (the paper's data) read from its on-disk release, `load_wikitext`.
- A real-English corpus that ships with Python itself, `stdlib_corpus`: the pydoc
  documentation topics and the docstrings of the standard library's own source. It
  needs no download, so small models can be trained and tested anywhere.

The corpus is built in `oattn_lib.data.stdlib` (re-exported here). Text becomes token ids through `tokenize_words` and a `Vocab` built on the training
split only; `split_documents` holds out whole documents, so validation and test text is
text the model never saw.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..store import atomic_write_text
from .stdlib import stdlib_corpus, stdlib_named_documents

__all__ = ["stdlib_corpus", "stdlib_named_documents", "tokenize_words", "Vocab",
           "split_documents", "build_text_dataset", "text_dataset", "load_wikitext", "wikitext_articles",
           "UNK", "EOS", "WIKITEXT_FILES"]

UNK = "<unk>"
EOS = "<eos>"


# ----------------------------------------------------------------------- tokenising

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
# a word: letters/digits/underscores, with inner apostrophes kept (don't, python's);
# otherwise a run of one repeated punctuation character ('.', '...', '==', '****')
_TOKEN = re.compile(r"\w+(?:'\w+)*|([^\w\s])\1*")


def tokenize_words(text: str) -> list[str]:
    """Split text into lower-case word and punctuation tokens, `<eos>` after paragraphs.

    - Paragraphs are separated by blank lines; each non-empty paragraph is followed by
      one ``<eos>`` token, like the end of a line of WikiText. Single newlines inside a
      paragraph are ordinary whitespace (docstrings and topics are hard-wrapped).
    - A word is a run of letters, digits and underscores, with inner apostrophes kept
      (``don't``, ``python's``); ``3.14`` gives ``3 . 14``.
    - Any other visible character is a token by itself, and a run of the same
      character is one token (``...``, ``==``, ``****``).

    >>> tokenize_words("Hello, world...\\n\\nIt's 3.14!")
    ['hello', ',', 'world', '...', '<eos>', "it's", '3', '.', '14', '!', '<eos>']
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected a str, got {type(text).__name__}")
    tokens: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text.lower()):
        words = [m.group(0) for m in _TOKEN.finditer(paragraph)]
        if words:
            tokens.extend(words)
            tokens.append(EOS)
    return tokens


# --------------------------------------------------------------------------- vocab


@dataclass(frozen=True, eq=False)
class Vocab:
    """A word vocabulary: id -> token (`itos`) and back.

    Id 0 is ``<unk>`` (every unknown token encodes to it) and id 1 is ``<eos>``; the
    other tokens follow in the order they were given. Build one from training tokens
    with `Vocab.build`.
    """

    itos: tuple[str, ...]
    stoi: dict = field(init=False, repr=False, compare=False)

    unk_id = 0
    eos_id = 1

    def __post_init__(self):
        itos = self.itos
        if isinstance(itos, str) or not isinstance(itos, Sequence):
            raise ValueError(f"itos: expected a sequence of str tokens, got {type(itos).__name__}")
        itos = tuple(itos)
        bad = [t for t in itos if not isinstance(t, str) or not t]
        if bad:
            raise ValueError(f"itos: tokens must be non-empty str, got {bad[0]!r}")
        if itos[:2] != (UNK, EOS):
            raise ValueError(f"itos: must start with the reserved tokens {UNK!r}, {EOS!r}; "
                             f"got {list(itos[:2])}. Build vocabularies with Vocab.build")
        stoi = {t: i for i, t in enumerate(itos)}
        if len(stoi) != len(itos):
            dup = next(t for t, c in Counter(itos).items() if c > 1)
            raise ValueError(f"itos: token {dup!r} appears more than once")
        object.__setattr__(self, "itos", itos)
        object.__setattr__(self, "stoi", stoi)

    @classmethod
    def build(cls, tokens: Iterable[str], min_freq: int = 1, max_size: int | None = None) -> "Vocab":
        """Vocabulary of the tokens seen at least `min_freq` times.

        Order: ``<unk>``, ``<eos>``, then by count (descending), ties alphabetically,
        so the same tokens always give the same ids. `max_size` caps the total size,
        the two reserved tokens included (None: no cap). The reserved tokens in the
        input (WikiText contains ``<unk>`` and ``<eos>``) are not counted.
        """
        if isinstance(min_freq, bool) or not isinstance(min_freq, (int, np.integer)) or min_freq < 1:
            raise ValueError(f"min_freq: expected an integer >= 1, got {min_freq!r}")
        if max_size is not None and (isinstance(max_size, bool)
                                     or not isinstance(max_size, (int, np.integer)) or max_size < 2):
            raise ValueError(f"max_size: expected None or an integer >= 2 (room for {UNK} and "
                             f"{EOS}), got {max_size!r}")
        if isinstance(tokens, str):
            raise ValueError("tokens: expected a sequence of tokens, got one str; "
                             "tokenize it first with tokenize_words")
        counts = Counter(tokens)
        bad = next((t for t in counts if not isinstance(t, str) or not t), None)
        if bad is not None:
            raise ValueError(f"tokens: expected non-empty str tokens, got {bad!r}")
        counts.pop(UNK, None)
        counts.pop(EOS, None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[: int(max_size) - 2]
        return cls((UNK, EOS, *kept))

    def __len__(self) -> int:
        return len(self.itos)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __hash__(self) -> int:
        return hash(self.itos)

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, first={list(self.itos[2:7])})"

    def __contains__(self, token) -> bool:
        return token in self.stoi

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Token ids as an int64 array; tokens not in the vocabulary become ``<unk>`` (0)."""
        if isinstance(tokens, str):
            raise ValueError("tokens: expected a sequence of tokens, got one str; "
                             "tokenize it first with tokenize_words")
        get = self.stoi.get
        return np.fromiter((get(t, 0) for t in tokens), dtype=np.int64)

    def decode(self, ids) -> list[str]:
        """Tokens of an integer sequence (numpy array, tensor or list) of ids."""
        arr = np.asarray(ids.detach().cpu() if hasattr(ids, "detach") else ids)
        if arr.size == 0:
            return []
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"ids: expected a 1-D integer sequence, got dtype {arr.dtype} "
                             f"and shape {arr.shape}")
        if arr.min() < 0 or arr.max() >= len(self):
            bad = arr[(arr < 0) | (arr >= len(self))][0]
            raise ValueError(f"ids: id {int(bad)} is out of range for a vocabulary of "
                             f"size {len(self)} (valid: 0..{len(self) - 1})")
        itos = self.itos
        return [itos[i] for i in arr.tolist()]

    def to_json(self, path: str | os.PathLike) -> None:
        """Save to `path` as JSON (written atomically: temp file, then rename)."""
        payload = {"format": "oattn.Vocab", "version": 1, "itos": list(self.itos)}
        atomic_write_text(path, json.dumps(payload, ensure_ascii=False))

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "Vocab":
        """Load a vocabulary saved by `to_json`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary file {str(path)!r} does not exist; "
                                    "save one with Vocab.to_json")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{str(path)!r}: not a JSON vocabulary file ({exc})") from exc
        if not isinstance(payload, dict) or payload.get("format") != "oattn.Vocab" \
                or "itos" not in payload:
            raise ValueError(f"{str(path)!r}: not a vocabulary written by Vocab.to_json "
                             "(missing format 'oattn.Vocab' or 'itos')")
        if payload.get("version") != 1:
            raise ValueError(f"{str(path)!r}: vocabulary format version "
                             f"{payload.get('version')!r} is not supported (expected 1)")
        return cls(tuple(payload["itos"]))


# -------------------------------------------------------------------------- splits

def _check_docs(docs) -> list[str]:
    if isinstance(docs, str) or not isinstance(docs, Sequence):
        raise ValueError(f"docs: expected a list of document strings, got {type(docs).__name__}")
    bad = next((i for i, d in enumerate(docs) if not isinstance(d, str)), None)
    if bad is not None:
        raise ValueError(f"docs: document {bad} is a {type(docs[bad]).__name__}, expected str")
    return list(docs)


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


def split_documents(docs: Sequence[str], fractions: Sequence[float] = (0.9, 0.05, 0.05),
                    seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """Split documents into (train, valid, test) lists, whole documents at a time.

    Documents are shuffled with `seed` (numpy's default_rng) and cut by `fractions`
    (train, valid, test; non-negative, summing to 1). A held-out split with a positive
    fraction gets at least one document (round(fraction * n) otherwise); train gets the
    rest. Each split keeps the corpus order of its documents. Deterministic in `seed`.
    """
    docs = _check_docs(docs)
    seed = _check_seed(seed)
    try:
        fr = np.asarray(fractions, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"fractions: expected three numbers, got {fractions!r}") from exc
    if fr.shape != (3,) or not np.all(np.isfinite(fr)) or np.any(fr < 0) \
            or not np.isclose(fr.sum(), 1.0, atol=1e-6):
        raise ValueError(f"fractions: expected three non-negative numbers (train, valid, test) "
                         f"summing to 1, got {fractions!r}")
    n = len(docs)
    n_held = [0 if f == 0 else max(1, int(round(f * n))) for f in fr[1:]]
    if n_held[0] + n_held[1] > n:
        raise ValueError(f"docs: {n} documents cannot fill the valid and test splits "
                         f"({n_held[0]} + {n_held[1]} documents for fractions {tuple(fr)}); "
                         "pass more documents")
    perm = np.random.default_rng(seed).permutation(n)
    valid_idx = np.sort(perm[:n_held[0]])
    test_idx = np.sort(perm[n_held[0]:n_held[0] + n_held[1]])
    train_idx = np.sort(perm[n_held[0] + n_held[1]:])
    return ([docs[i] for i in train_idx], [docs[i] for i in valid_idx],
            [docs[i] for i in test_idx])


def build_text_dataset(docs: Sequence[str], seed: int = 0, min_freq: int = 1,
                       max_size: int | None = None,
                       fractions: Sequence[float] = (0.9, 0.05, 0.05)) -> dict:
    """Token-id streams for language modelling from a list of documents.

    Splits with `split_documents(docs, fractions, seed)`, tokenises every document with
    `tokenize_words` and concatenates each split in order; the `Vocab` is built from
    the training split only (`min_freq`, `max_size` as in `Vocab.build`), so held-out
    words missing from it encode to ``<unk>``.

    Returns dict(train, valid, test: 1-D int64 id arrays, vocab: Vocab).
    """
    docs = _check_docs(docs)
    if not docs:
        raise ValueError("docs: the corpus is empty; pass a list of document strings "
                         "(for example stdlib_corpus())")
    splits = dict(zip(("train", "valid", "test"), split_documents(docs, fractions, seed)))
    tokens = {}
    for name, part in splits.items():
        if not part:
            raise ValueError(f"fractions={tuple(fractions)!r}: the {name} split of {len(docs)} "
                             f"documents is empty; give it a positive fraction or pass more "
                             "documents")
        toks = [t for doc in part for t in tokenize_words(doc)]
        if not toks:
            raise ValueError(f"docs: the {len(part)} documents of the {name} split contain no "
                             "words; remove empty or whitespace-only documents")
        tokens[name] = toks
    vocab = Vocab.build(tokens["train"], min_freq=min_freq, max_size=max_size)
    out = {name: vocab.encode(toks) for name, toks in tokens.items()}
    out["vocab"] = vocab
    return out


# ----------------------------------------------------------------------- WikiText

WIKITEXT_FILES = {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens",
                  "test": "wiki.test.tokens"}


def _wikitext_missing(path: Path, root: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"WikiText-103 file {str(path)!r} does not exist. Provide it with "
        f"oattn_lib.data.fetch_wikitext103({str(root)!r}) (what the workflow's download "
        f"rule runs), or unzip wikitext-103-v1.zip so that {str(root)!r} holds "
        "wikitext-103/wiki.{train,valid,test}.tokens, or set `data_root` in the config to "
        "the directory that holds wikitext-103/")


def load_wikitext(root: str | os.PathLike, skip_empty_lines: bool = True,
                  splits: Sequence[str] = ("train", "valid", "test")) -> dict[str, list[str]]:
    """WikiText-103 token lists for train, valid and test, from the released files.

    Reads ``root/wikitext-103/wiki.{train,valid,test}.tokens`` (UTF-8; the text is
    already tokenised: tokens separated by spaces, rare words as ``<unk>``). Every
    line's tokens are followed by ``<eos>``, as in the Transformer-XL reference
    preprocessing; case is kept (TXL uses lower_case=False for WikiText-103).

    `skip_empty_lines=True` drops blank lines (every other line of the release is a
    lone space). The TXL reference code does not skip them: each blank line there
    contributes a lone ``<eos>``; pass False to reproduce its token stream exactly.

    `splits` selects what to read: the training file has about 103M tokens (a list of
    them is large even with the strings shared), the test file 0.25M.
    """
    if isinstance(splits, str) or not set(splits) <= set(WIKITEXT_FILES) or not splits:
        raise ValueError(f"splits: expected a non-empty subset of {tuple(WIKITEXT_FILES)}, "
                         f"got {splits!r}")
    root = Path(root)
    base = root / "wikitext-103"
    paths = {split: base / WIKITEXT_FILES[split] for split in WIKITEXT_FILES if split in splits}
    for path in paths.values():  # fail before spending minutes on the training file
        if not path.is_file():
            raise _wikitext_missing(path, root)
    out = {}
    for split, path in paths.items():
        tokens: list[str] = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                words = line.split()
                if not words and skip_empty_lines:
                    continue
                tokens.extend(map(sys.intern, words))  # one str object per distinct word
                tokens.append(EOS)
        out[split] = tokens
    return out


# an article's title line: ` = Title = ` (its sections' headings are ` = = Section = = `)
_ARTICLE_TITLE = re.compile(r"^ = [^=].* = $")


def wikitext_articles(root: str | os.PathLike, split: str = "test") -> list[str]:
    """The articles of a WikiText-103 split as texts, in the file's order: each from its title
    line (`` = Title = ``) to the next article's, its non-blank lines joined by newlines, as the
    release writes them (tokens separated by spaces, rare words as ``<unk>``).

    Parameters
    ----------
    root : str or PathLike
        The directory holding ``wikitext-103/`` (the config's data_root).
    split : {"train", "valid", "test"}
        Which file to read.

    Returns
    -------
    list of str
        One text per article; lines before the first title, if any, are an article of their own.

    Raises
    ------
    FileNotFoundError
        The split's file is missing (the message says how to get it).
    """
    if split not in WIKITEXT_FILES:
        raise ValueError(f"split: expected one of {tuple(WIKITEXT_FILES)}, got {split!r}")
    root = Path(root)
    path = root / "wikitext-103" / WIKITEXT_FILES[split]
    if not path.is_file():
        raise _wikitext_missing(path, root)
    articles: list[list[str]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if _ARTICLE_TITLE.match(line) or not articles:
                articles.append([])
            articles[-1].append(line.strip())
    return ["\n".join(lines) for lines in articles]


def text_dataset(data: dict, data_root: str | os.PathLike = "resources") -> tuple[dict, Vocab, list[str]]:
    """A model's text dataset from its `data` config slice: (token-id splits train, valid and
    test, their `Vocab`, the corpus' documents). `corpus` wikitext103 reads the files under
    `data_root`, its documents the test split's articles (`wikitext_articles`: a pretrained
    model's samples and held-out texts, read by its own tokenizer); otherwise the stdlib corpus
    is split by `build_text_dataset` with the slice's `seed`, `min_freq` and `max_size`, its
    documents every document of the corpus."""
    if data["corpus"] == "wikitext103":
        splits = load_wikitext(Path(data_root))
        vocab = Vocab.build(splits["train"], min_freq=data["min_freq"], max_size=data["max_size"])
        return {k: vocab.encode(v) for k, v in splits.items()}, vocab, wikitext_articles(data_root, "test")
    import logging

    docs = stdlib_corpus()
    logging.getLogger("oattn").info("stdlib corpus: %d documents", len(docs))
    ds = build_text_dataset(docs, seed=data["seed"], min_freq=data["min_freq"], max_size=data["max_size"])
    vocab = ds.pop("vocab")
    return ds, vocab, docs
