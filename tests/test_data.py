"""Data loaders, vocabulary, splits and downloads (oattn_lib.data).

Properties, on real data where it ships with Python or scikit-learn and on tiny
fixtures written in the exact on-disk formats of WikiText-103 and CIFAR-10 otherwise.
No test touches the network: downloads are tested against an HTTP server on the loopback
interface, serving files of the test's temporary directory.
"""
from __future__ import annotations

import ast
import hashlib
import io
import math
import os
import pickle
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from oattn_lib.data import (EOS, UNK, Vocab, build_text_dataset, cifar10_for_vit, digits_dataset,
                            download, fetch_cifar10, fetch_wikitext103, load_cifar10,
                            load_wikitext, split_documents, stdlib_corpus, wikitext_articles,
                            stdlib_named_documents, tokenize_words)

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ stdlib corpus

@pytest.fixture(scope="module")
def named_corpus() -> list[tuple[str, str]]:
    return stdlib_named_documents()


@pytest.fixture(scope="module")
def corpus(named_corpus) -> list[str]:
    return [text for _, text in named_corpus]


def _corpus_digest_in_subprocess(hash_seed: str, cache_dir: Path) -> str:
    code = ("import hashlib; from oattn_lib.data.text import stdlib_named_documents as f; "
            "h = hashlib.sha256()\n"
            "for n, t in f(): h.update(n.encode() + b'\\0' + t.encode() + b'\\1')\n"
            "print(h.hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "OATTN_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    return out.stdout.strip()


def test_stdlib_corpus_is_deterministic_across_processes(named_corpus, tmp_path):
    # a different hash seed changes set/dict iteration order: the corpus must not care; built
    # afresh there (an empty cache), it is the one this process has, which may come from the cache
    h = hashlib.sha256()
    for n, t in named_corpus:
        h.update(n.encode() + b"\0" + t.encode() + b"\1")
    assert _corpus_digest_in_subprocess("12345", tmp_path / "cache") == h.hexdigest()
    assert len(list((tmp_path / "cache").glob("stdlib-corpus-*.json"))) == 1  # and kept there


def test_the_kept_corpus_follows_every_edit_of_the_sources(tmp_path, monkeypatch):
    """The corpus is built once and kept in the cache directory; an edited, added or removed
    source file gives the corpus of the new sources, never the kept one."""
    monkeypatch.setenv("OATTN_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "lib"
    src.mkdir()
    (src / "a.py").write_text('"""First module."""\n')
    (src / "b.py").write_text('"""Second module."""\n')

    def files():
        return {n: t for n, t in stdlib_named_documents(src) if not n.startswith("pydoc_data.topics/")}

    assert files() == {"a.py": "First module.", "b.py": "Second module."}
    kept = list((tmp_path / "cache").glob("stdlib-corpus-*.json"))
    assert len(kept) == 1
    assert files() == {"a.py": "First module.", "b.py": "Second module."}  # read back
    (src / "a.py").write_text('"""Frist module."""\n')  # the same size: the time tells
    os.utime(src / "a.py", ns=(1, 1))
    assert files()["a.py"] == "Frist module."
    (src / "b.py").unlink()
    (src / "c.py").write_text('"""Third module."""\n')
    assert files() == {"a.py": "Frist module.", "c.py": "Third module."}
    for path in (tmp_path / "cache").glob("stdlib-corpus-*.json"):
        path.write_text("not json")  # a damaged cache file is ignored: built again
    assert files() == {"a.py": "Frist module.", "c.py": "Third module."}


def test_stdlib_corpus_is_large_real_english(corpus):
    n_words = sum(len(d.split()) for d in corpus)
    assert n_words > 300_000
    assert len(corpus) > 500
    assert len(set(corpus)) == len(corpus)  # duplicates removed
    counts = Counter(t for d in corpus[:300] for t in tokenize_words(d))
    for word in ("the", "and", "of", "is", "function", "return", "string", "object", "value"):
        assert counts[word] > 20, word
    # English, not Python: the most common words are English function words
    top = {w for w, _ in counts.most_common(40)}
    assert {"the", "a", "to", "of", "is"} <= top


def test_stdlib_corpus_is_not_python_code(corpus):
    lines = [ln.strip() for d in corpus for ln in d.splitlines() if ln.strip()]
    assert sum(ln.startswith("def ") for ln in lines) / len(lines) < 0.005
    assert not any(ln.startswith(">>>") for ln in lines)  # doctest examples removed
    for d in corpus:
        ls = [ln.strip() for ln in d.splitlines() if ln.strip()]
        if len(ls) >= 5:
            code = sum(ln.startswith(("def ", "class ", "import ")) for ln in ls)
            assert code / len(ls) <= 0.25, d[:200]
        # English prose does not parse as a Python module with statements in it
        try:
            tree = ast.parse(d)
        except (SyntaxError, ValueError):
            continue
        assert all(isinstance(node, ast.Expr) for node in tree.body), d[:200]


def test_stdlib_named_documents_skip_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("OATTN_CACHE_DIR", str(tmp_path / "cache"))  # no corpus of a temporary directory kept
    def write(rel, text, raw=None):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(raw if raw is not None else text.encode())

    write("zeta.py", '"""Zeta module docs."""\ndef f():\n    """Function f docs.\n\n'
          '    >>> f()\n    42\n\n    More prose."""\n')
    write("alpha/__init__.py", '"""Alpha package docs."""\nclass C:\n    """Class docs."""\n')
    write("beta.py", '"""Alpha package docs."""\n\nclass D:\n    """Class docs."""\n')  # same text
    write("test/t.py", '"""test suite"""\n')
    write("alpha/tests/t.py", '"""tests"""\n')
    write("idlelib/idle_test/t.py", '"""idle tests"""\n')
    write("lib2to3/tests/data/py2.py", 'print "python 2"\n')
    write("site-packages/pkg.py", '"""third party"""\n')
    write("broken.py", 'def (:\n')
    write("latin.py", "", raw=b'"""caf\xe9 \xff"""\n')
    write("nodoc.py", "x = 1\n")
    named = dict(stdlib_named_documents(tmp_path))
    files = [n for n in named if not n.startswith("pydoc_data.topics/")]
    assert files == ["alpha/__init__.py", "zeta.py"]
    assert named["alpha/__init__.py"] == "Alpha package docs.\n\nClass docs."
    assert named["zeta.py"] == "Zeta module docs.\n\nFunction f docs.\n\nMore prose."
    assert "pydoc_data.topics/else" in named  # the "if" topic is the same text: dropped
    assert "pydoc_data.topics/if" not in named
    assert stdlib_corpus(tmp_path) == list(named.values())


def test_stdlib_dir_missing_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        stdlib_corpus(tmp_path / "nowhere")


# -------------------------------------------------------------------- tokenising

def test_tokenize_words():
    text = "Hello, World... It's 3.14!\nSame paragraph.\n\n  \nNext ==== one"
    assert tokenize_words(text) == ["hello", ",", "world", "...", "it's", "3", ".", "14", "!",
                                    "same", "paragraph", ".", EOS, "next", "====", "one", EOS]
    assert tokenize_words("") == []
    assert tokenize_words("\n\n\n") == []
    with pytest.raises(ValueError, match="text"):
        tokenize_words(["not", "a", "str"])


# ------------------------------------------------------------------------- vocab

def test_vocab_order_is_frequency_then_alphabetical():
    tokens = "b a c a b a d <unk> <eos> e e".split()
    v = Vocab.build(tokens)
    assert v.itos == (UNK, EOS, "a", "b", "e", "c", "d")
    assert Vocab.build(list(reversed(tokens))) == v  # input order does not matter
    assert Vocab.build(tokens, min_freq=2).itos == (UNK, EOS, "a", "b", "e")
    assert Vocab.build(tokens, max_size=4).itos == (UNK, EOS, "a", "b")
    assert len(Vocab.build(tokens, max_size=4)) == 4


def test_vocab_encode_decode_round_trip_and_unk(tmp_path):
    train = tokenize_words("the cat sat on the mat.\n\nthe dog sat.")
    v = Vocab.build(train)
    ids = v.encode(train)
    assert ids.dtype == np.int64 and ids.shape == (len(train),)
    assert v.decode(ids) == train
    assert v.decode(torch.from_numpy(ids)) == train
    held_out = ["the", "zebra", "sat", EOS, UNK]
    enc = v.encode(held_out)
    assert enc.tolist() == [v.stoi["the"], 0, v.stoi["sat"], 1, 0]
    assert v.decode(enc) == ["the", UNK, "sat", EOS, UNK]
    assert v.encode([]).dtype == np.int64 and v.decode([]) == []
    with pytest.raises(ValueError, match="out of range"):
        v.decode([0, len(v)])

    path = tmp_path / "sub" / "vocab.json"
    v.to_json(path)
    assert Vocab.from_json(path) == v
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temp file left


def test_vocab_validation(tmp_path):
    with pytest.raises(ValueError, match="min_freq"):
        Vocab.build(["a"], min_freq=0)
    with pytest.raises(ValueError, match="max_size"):
        Vocab.build(["a"], max_size=1)
    with pytest.raises(ValueError, match="tokens"):
        Vocab.build("a string")
    with pytest.raises(ValueError, match="itos"):
        Vocab(("a", "b"))
    with pytest.raises(ValueError, match="more than once"):
        Vocab((UNK, EOS, "a", "a"))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        Vocab.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"itos": ["<unk>", "<eos>"]}')
    with pytest.raises(ValueError, match="bad.json"):
        Vocab.from_json(bad)


# ------------------------------------------------------------------------ splits

def test_split_documents_deterministic_disjoint_covering():
    docs = [f"document number {i}" for i in range(200)]
    a = split_documents(docs, seed=3)
    assert split_documents(docs, seed=3) == a
    assert split_documents(docs, seed=4) != a
    train, valid, test = a
    assert (len(train), len(valid), len(test)) == (180, 10, 10)
    assert set(train).isdisjoint(valid) and set(train).isdisjoint(test) \
        and set(valid).isdisjoint(test)
    assert sorted(train + valid + test) == sorted(docs)
    assert train == sorted(train, key=docs.index)  # corpus order kept within a split
    with pytest.raises(ValueError, match="fractions"):
        split_documents(docs, fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="seed"):
        split_documents(docs, seed=-1)


def test_build_text_dataset():
    docs = [f"Paragraph {i} about cats and dogs.\n\nWord{i} here." for i in range(40)]
    ds = build_text_dataset(docs, seed=0)
    v = ds["vocab"]
    for split in ("train", "valid", "test"):
        assert ds[split].dtype == np.int64 and ds[split].ndim == 1
        assert ds[split].max() < len(v)
    # the vocabulary comes from the training split only: held-out "wordN" are unknown
    train, valid, _ = split_documents(docs, seed=0)
    assert v.decode(ds["train"]) == [t for d in train for t in tokenize_words(d)]
    train_words = {t for d in train for t in tokenize_words(d)}
    valid_tokens = [t for d in valid for t in tokenize_words(d)]
    assert v.decode(ds["valid"]) == [t if t in train_words else UNK for t in valid_tokens]
    assert v.decode(ds["valid"]).count(UNK) == 2 * len(valid)  # "N" and "wordN" are new
    assert (ds["train"] == 1).sum() == 2 * len(train)  # one <eos> per paragraph
    again = build_text_dataset(docs, seed=0)
    assert again["vocab"] == v and all(np.array_equal(again[s], ds[s]) for s in ("train", "test"))


def test_build_text_dataset_errors():
    with pytest.raises(ValueError, match="empty"):
        build_text_dataset([])
    with pytest.raises(ValueError, match="test split"):
        build_text_dataset(["a b", "c d", "e f"], fractions=(0.9, 0.1, 0.0))
    with pytest.raises(ValueError, match="train split contain no words"):
        build_text_dataset(["  \n\n "] * 10)


# ---------------------------------------------------------------------- WikiText

# the exact layout of the release: a blank line (one space) around every line of text
_WIKI = {
    "train": " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles ( Japanese ) \n \n",
    "valid": " \n = Homarus gammarus = \n \n",
    "test": " \n = Robert <unk> = \n \n Robert is an actor . \n",
}


def _write_wikitext(root: Path) -> Path:
    base = root / "wikitext-103"
    base.mkdir(parents=True)
    for split, text in _WIKI.items():
        (base / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
    return base


def test_load_wikitext_format(tmp_path):
    _write_wikitext(tmp_path)
    data = load_wikitext(tmp_path)
    assert data["valid"] == ["=", "Homarus", "gammarus", "=", EOS]
    train = data["train"]
    assert train.count(EOS) == 2  # one per non-empty line; blank lines skipped
    assert train[:6] == ["=", "Valkyria", "Chronicles", "III", "=", EOS]
    assert "Senjō" in train and "<unk>" in train  # case and the release's <unk> kept
    assert data["test"][-6:] == ["Robert", "is", "an", "actor", ".", EOS]
    # the Transformer-XL reference keeps one <eos> per blank line
    txl = load_wikitext(tmp_path, skip_empty_lines=False)
    assert txl["train"].count(EOS) == 5 and txl["train"][0] == EOS
    assert list(load_wikitext(tmp_path, splits=("test",))) == ["test"]
    with pytest.raises(ValueError, match="splits"):
        load_wikitext(tmp_path, splits=("dev",))


def test_wikitext_articles_are_the_texts_from_one_title_to_the_next(tmp_path):
    base = _write_wikitext(tmp_path)
    assert wikitext_articles(tmp_path, "test") == ["= Robert <unk> =\nRobert is an actor ."]
    # a section heading (= = ... = =) stays inside its article; a title starts the next one
    (base / "wiki.test.tokens").write_text(
        " \n = One = \n \n First text . \n \n = = Early life = = \n \n More . \n \n = Two = \n \n Second . \n",
        encoding="utf-8")
    assert wikitext_articles(tmp_path) == ["= One =\nFirst text .\n= = Early life = =\nMore .", "= Two =\nSecond ."]
    with pytest.raises(ValueError, match="split"):
        wikitext_articles(tmp_path, "dev")


def test_an_llm_on_wikitext_draws_its_samples_from_the_test_articles(tmp_path):
    """An hf model with `data.corpus: wikitext103` gets the test split's articles as the texts its
    samples and held-out windows are drawn from (it had none: no sample could be drawn)."""
    from oattn_lib.models import adapter

    _write_wikitext(tmp_path)
    model = {"name": "lm", "kind": "hf", "path": "smollm2",
             "data": {"corpus": "wikitext103", "min_freq": 1, "max_size": 100, "seed": 0}}
    _, meta = adapter(model).prepare_data(model["data"], tmp_path)
    assert meta["test_texts"] == wikitext_articles(tmp_path, "test") == ["= Robert <unk> =\nRobert is an actor ."]


def test_load_wikitext_missing_file_names_path(tmp_path):
    base = _write_wikitext(tmp_path)
    (base / "wiki.valid.tokens").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_wikitext(tmp_path)
    msg = str(err.value)
    assert str(base / "wiki.valid.tokens") in msg
    assert "fetch_wikitext103" in msg and "data_root" in msg


# ----------------------------------------------------------------------- CIFAR-10

def _batch(n: int, start: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(start)
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), [(start + i) % 10 for i in range(n)]


def _write_cifar(root: Path, n: int = 3, protocol: int = 2) -> dict:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    written = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        data, labels = _batch(n, 10 * k)
        written[name] = (data, labels)
        # the release's keys are bytes (pickled by Python 2)
        with open(base / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"img%d.png" % i for i in range(n)]}, f, protocol=protocol)
    return written


def test_load_cifar10_layout(tmp_path):
    written = _write_cifar(tmp_path)
    images, labels = load_cifar10(tmp_path, "train")
    assert images.shape == (15, 32, 32, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64
    assert labels.tolist() == sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    # pixel (channel c, row r, col k) of image j sits at data[j, c*1024 + r*32 + k]
    data = written["data_batch_2"][0]
    j, c, r, k = 1, 2, 5, 30
    assert images[3 + j, r, k, c] == data[j, c * 1024 + r * 32 + k]
    # a planted pixel round trip
    planted = np.zeros((1, 3072), np.uint8)
    planted[0, 1 * 1024 + 7 * 32 + 3] = 200  # green, row 7, column 3
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": planted, b"labels": [4]}, f)
    test_images, test_labels = load_cifar10(tmp_path, "test")
    assert test_labels.tolist() == [4]
    assert list(zip(*np.nonzero(test_images[0]))) == [(7, 3, 1)]
    # the full inverse: back to the release's row layout
    back = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    assert np.array_equal(back[:3], written["data_batch_1"][0])


def test_load_cifar10_errors(tmp_path):
    _write_cifar(tmp_path)
    base = tmp_path / "cifar-10-batches-py"
    with open(base / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 32, 32, 3), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError, match=r"data_batch_3.*\(2, 32, 32, 3\)"):
        load_cifar10(tmp_path, "train")
    (base / "test_batch").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_cifar10(tmp_path, "test")
    assert str(base / "test_batch") in str(err.value) and "fetch_cifar10" in str(err.value)
    with pytest.raises(ValueError, match="split"):
        load_cifar10(tmp_path, "valid")


def test_load_cifar10_refuses_code_in_pickles(tmp_path):
    _write_cifar(tmp_path)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(ValueError, match="refusing"):
        load_cifar10(tmp_path, "test")


def test_cifar10_for_vit():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2, 32, 32, 3), dtype=np.uint8)
    x = cifar10_for_vit(images, size=224)
    assert isinstance(x, torch.Tensor) and x.shape == (2, 3, 224, 224) and x.dtype == torch.float32
    # a constant image stays constant, normalised per channel
    flat = np.full((1, 32, 32, 3), (255, 0, 128), np.uint8)
    y = cifar10_for_vit(flat, size=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert torch.allclose(y[0, :, 10, 20], torch.tensor([1.0, -1.0, 128 / 255 * 2 - 1]), atol=1e-6)
    same = cifar10_for_vit(torch.from_numpy(images), size=32, mean=(0, 0, 0), std=(1, 1, 1))
    assert torch.allclose(same.permute(0, 2, 3, 1) * 255, torch.from_numpy(images).float(), atol=1e-4)
    with pytest.raises(ValueError, match="images"):
        cifar10_for_vit(images[0])
    with pytest.raises(ValueError, match="uint8"):
        cifar10_for_vit(images.astype(np.float32))


# ------------------------------------------------------------------------ digits

@pytest.fixture(scope="module")
def digits():
    return digits_dataset(size=32, test_fraction=0.2, seed=0)


def test_digits_shapes_labels_and_normalisation(digits):
    tr, te = digits["train_images"], digits["test_images"]
    assert tr.dtype == np.float32 and tr.shape[1:] == (3, 32, 32)
    assert te.shape[1:] == (3, 32, 32) and len(tr) + len(te) == 1797
    assert len(te) == math.ceil(0.2 * 1797)  # scikit-learn rounds the test size up
    assert digits["train_labels"].dtype == np.int64
    assert set(digits["train_labels"].tolist()) == set(range(10))
    assert np.array_equal(tr[:, 0], tr[:, 2])  # gray replicated to RGB
    assert abs(tr.mean()) < 1e-4 and abs(tr.std() - 1) < 1e-3  # standardised on train
    raw = tr * digits["std"] + digits["mean"]
    assert raw.min() > -1e-5 and raw.max() < 1 + 1e-5


def test_digits_split_stratified_and_deterministic(digits):
    from sklearn.datasets import load_digits

    y = load_digits().target
    per_class = np.bincount(y, minlength=10)
    test_counts = np.bincount(digits["test_labels"], minlength=10)
    assert np.all(np.abs(test_counts - 0.2 * per_class) <= 1)
    again = digits_dataset(size=16, seed=0)
    assert np.array_equal(again["test_labels"], digits["test_labels"])
    other = digits_dataset(size=16, seed=1)
    assert not np.array_equal(other["test_labels"], digits["test_labels"])


def test_digits_upsampling_preserves_mean_intensity(digits):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    idx = np.arange(len(d.target))
    train_idx, _ = train_test_split(idx, test_size=0.2, stratify=d.target, random_state=0)
    orig = d.images[np.sort(train_idx)] / 16.0
    # 8 -> 32 is an integer factor: with pixel-centre alignment every input pixel gets
    # total weight 4 x 4, so each image's mean is preserved exactly
    up = digits["train_images"][:, 0] * digits["std"] + digits["mean"]
    assert np.abs(up.mean(axis=(1, 2)) - orig.mean(axis=(1, 2))).max() < 1e-5
    # so does a fractional factor (2.5), approximately in general
    odd = digits_dataset(size=20, seed=0)
    up = odd["train_images"][:, 0] * odd["std"] + odd["mean"]
    assert up.shape[1:] == (20, 20)
    per_image = np.abs(up.mean(axis=(1, 2)) - orig.mean(axis=(1, 2)))
    assert per_image.max() < 0.03 and per_image.mean() < 0.01
    with pytest.raises(ValueError, match="test_fraction"):
        digits_dataset(test_fraction=1.0)


# ---------------------------------------------------------------------- downloads

@pytest.fixture
def served(tmp_path, monkeypatch):
    """The URL of a file under tmp_path (`served(path)`), answered by an HTTP server on the
    loopback interface for the test's duration (a proxy in the environment is bypassed)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield lambda path: f"{base}/{Path(path).relative_to(tmp_path).as_posix()}"
    server.shutdown()
    server.server_close()
    thread.join()


def _fixture_file(served, path: Path, payload: bytes) -> tuple[str, str, str]:
    path.write_bytes(payload)
    return served(path), hashlib.sha256(payload).hexdigest(), hashlib.md5(payload).hexdigest()


def test_download_over_http(tmp_path, served):
    url, sha, md5 = _fixture_file(served, tmp_path / "src.bin", os.urandom(3 << 20))
    dest = tmp_path / "out" / "dest.bin"
    assert download(url, dest, sha256=sha, md5=md5) == dest
    assert dest.read_bytes() == (tmp_path / "src.bin").read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["dest.bin"]


def test_download_checksum_mismatch_leaves_nothing(tmp_path, served):
    url, sha, md5 = _fixture_file(served, tmp_path / "src.bin", b"payload")
    dest = tmp_path / "out" / "dest.bin"
    with pytest.raises(RuntimeError, match="checksum mismatch") as err:
        download(url, dest, sha256="0" * 64)
    assert url in str(err.value) and str(dest) in str(err.value)
    with pytest.raises(RuntimeError, match="MD5"):
        download(url, dest, md5="0" * 32)
    with pytest.raises(RuntimeError, match="MD5"):  # the second checksum is checked before the move too
        download(url, dest, sha256=sha, md5="0" * 32)
    assert list(dest.parent.iterdir()) == []
    with pytest.raises(ValueError, match="sha256"):
        download(url, dest, sha256="not-hex")
    assert download(url, dest, sha256=sha, md5=md5).read_bytes() == b"payload"


def test_download_skips_existing_verified_file(tmp_path, served):
    url, sha, _ = _fixture_file(served, tmp_path / "src.bin", b"new content")
    dest = tmp_path / "dest.bin"
    dest.write_bytes(b"new content")
    (tmp_path / "src.bin").unlink()  # a second fetch would fail: the skip must happen
    assert download(url, dest, sha256=sha) == dest
    dest.write_bytes(b"kept as is")  # no checksum given: an existing file is kept
    assert download(url, dest).read_bytes() == b"kept as is"
    # an existing file that fails the check is fetched again (here: the source is gone)
    with pytest.raises(RuntimeError, match="failed") as err:
        download(url, dest, sha256=sha)
    assert url in str(err.value) and str(dest) in str(err.value) and "place it" in str(err.value)
    assert dest.read_bytes() == b"kept as is"


def test_download_network_failure_message(tmp_path, served):
    missing = served(tmp_path / "nowhere.zip")
    with pytest.raises(RuntimeError) as err:
        download(missing, tmp_path / "x.zip")
    msg = str(err.value)
    assert missing in msg and str(tmp_path / "x.zip") in msg and "place it" in msg
    assert not (tmp_path / "x.zip").exists()
    local = (tmp_path / "nowhere.zip").as_uri()  # pooch fetches over http, https and ftp only
    with pytest.raises(RuntimeError, match="unsupported URL scheme 'file'") as err:
        download(local, tmp_path / "x.zip")
    assert local in str(err.value) and "place it" in str(err.value)


def test_fetch_cifar10_over_http(tmp_path, served):
    src = tmp_path / "src"
    written = _write_cifar(src)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    url, _, md5 = _fixture_file(served, tmp_path / "cifar.tar.gz", buf.getvalue())
    root = tmp_path / "data"
    target = fetch_cifar10(root, urls=[url], md5=md5)
    assert target == root / "cifar-10-batches-py"
    images, labels = load_cifar10(root, "test")
    assert labels.tolist() == written["test_batch"][1]
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]
    assert fetch_cifar10(root, urls=[served(tmp_path / "gone.tar.gz")], md5=md5) == target  # already there


def test_fetch_rejects_archive_escaping_root(tmp_path, served):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("wikitext-103/wiki.train.tokens", " a \n")
        zf.writestr("../evil.txt", "x")
    url, _, md5 = _fixture_file(served, tmp_path / "w.zip", buf.getvalue())
    root = tmp_path / "data"
    with pytest.raises(RuntimeError, match="refusing"):
        fetch_wikitext103(root, urls=[url], md5=md5)
    assert not (tmp_path / "evil.txt").exists() and not (root / "wikitext-103").exists()


def test_fetch_rejects_a_link_in_a_tar(tmp_path, served):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        link = tarfile.TarInfo("cifar-10-batches-py/test_batch")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    url, _, md5 = _fixture_file(served, tmp_path / "c.tar.gz", buf.getvalue())
    root = tmp_path / "data"
    with pytest.raises(RuntimeError, match="not a regular file"):
        fetch_cifar10(root, urls=[url], md5=md5)
    assert not (root / "cifar-10-batches-py").exists()


def test_fetch_wikitext103_over_http(tmp_path, served):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for split, text in _WIKI.items():
            zf.writestr(f"wikitext-103/wiki.{split}.tokens", text)
    url, _, md5 = _fixture_file(served, tmp_path / "w.zip", buf.getvalue())
    root = tmp_path / "data"
    # the first source fails, the mirror answers
    fetch_wikitext103(root, urls=[served(tmp_path / "dead.zip"), url], md5=md5)
    assert load_wikitext(root)["valid"] == ["=", "Homarus", "gammarus", "=", EOS]
    assert not list(root.glob(".extract-*")) and not list(root.glob("tmp*"))


def test_a_pretrained_model_draws_from_every_document_a_trained_one_from_its_test_split(tmp_path):
    """hf models are not trained here: every document of the corpus may be a sample (an LLM at
    1024 tokens needs the long ones); a txl model's texts stay its held-out test split."""
    import json
    from oattn_lib.config import complete_model
    from oattn_lib.data.stdlib import stdlib_corpus
    from oattn_lib.data.text import split_documents
    from oattn_lib.stages.data import prepare_data
    docs = stdlib_corpus()
    hf = complete_model({"name": "lm", "kind": "hf", "path": "minilm", "data": {"corpus": "stdlib"}})
    prepare_data("hf", hf["data"], tmp_path / "hf.npz", tmp_path / "hf.json")
    assert json.loads((tmp_path / "hf.json").read_text())["test_texts"] == docs
    train, _, test = split_documents(docs, seed=hf["data"]["seed"])
    assert 0 < len(test) < len(docs) and not set(test) & set(train)
