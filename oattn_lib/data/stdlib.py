"""Real English text that ships with Python itself (the stand-in for WikiText-103 of docs/method.md §9.2).

The documentation topics of `pydoc_data.topics` and the docstrings of the standard
library's own sources, read with `ast` (never imported); no download, so small models can
be trained and tested anywhere. `oattn_lib.data.text` turns it into token ids.
"""
from __future__ import annotations

import ast
import os
import re
import sysconfig
from pathlib import Path

__all__ = ["stdlib_corpus", "stdlib_named_documents"]

# Directory names never read for docstrings: third-party code and the test suites
# (test code is Python, not English, and lib2to3/tests holds Python 2 sources).
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                        "__pycache__"})
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _strip_doctests(text: str) -> str:
    """Drop doctest examples: a `>>>` line and everything after it up to a blank line
    (the doctest rule for where an example's expected output ends)."""
    out, in_example = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_example = True
        elif not stripped:
            in_example = False
        if not in_example:
            out.append(line)
    return re.sub(r"\n\s*\n(\s*\n)+", "\n\n", "\n".join(out))  # one blank line where examples were


def _source_files(stdlib_dir: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(stdlib_dir):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        rel = Path(dirpath).relative_to(stdlib_dir)
        files.extend(rel / f for f in filenames if f.endswith(".py"))
    return sorted(files, key=lambda p: p.as_posix())


def _file_docstrings(path: Path) -> str | None:
    """The module, class and function docstrings of one source file, in source order,
    joined by blank lines; None when the file cannot be read, decoded or parsed."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        # ValueError covers UnicodeDecodeError and source with NUL bytes
        return None
    nodes = [n for n in ast.walk(tree) if isinstance(n, _DOC_NODES)]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))  # the module (no lineno) first
    docs = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            doc = _strip_doctests(doc).strip()
            if doc:
                docs.append(doc)
    return "\n\n".join(docs) if docs else None


def stdlib_named_documents(stdlib_dir: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """`stdlib_corpus` with a name for each document, as (name, text) pairs.

    Names are ``pydoc_data.topics/<topic>`` for documentation topics and the path of the
    source file relative to `stdlib_dir` (posix separators) for docstrings.
    """
    if stdlib_dir is None:
        stdlib_dir = sysconfig.get_paths()["stdlib"]
    root = Path(stdlib_dir)
    if not root.is_dir():
        raise FileNotFoundError(
            f"stdlib_dir: {str(root)!r} is not a directory; pass the directory that holds "
            "the standard library's .py sources (sysconfig.get_paths()['stdlib'])")
    import pydoc_data.topics
    from pydoc_data.topics import topics  # plain data: a dict of str, no side effects

    files = _source_files(root)
    cache = _cache_path(root, files, Path(pydoc_data.topics.__file__))
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    named = [(f"pydoc_data.topics/{key}", _strip_doctests(topics[key]).strip())
             for key in sorted(topics)]
    for rel in files:
        text = _file_docstrings(root / rel)
        if text:
            named.append((rel.as_posix(), text))
    # identical documents (generated codec modules, copies) would leak across splits
    seen, unique = set(), []
    for name, text in named:
        if text and text not in seen:
            seen.add(text)
            unique.append((name, text))
    _write_cache(cache, unique)
    return unique


# -- the corpus kept between processes ---------------------------------------------------------
# Parsing every source file of the standard library takes seconds, and every prepare_data job
# of a stdlib model (and many tests) builds the same corpus: it is kept in the user's cache
# directory (oattn_lib._cachedir), in a file
# named by the SHA-256 of everything it is a function of: this module's code, the stdlib
# directory, and each source file's and the topics file's path, size and modification time.
# Any change there names another file, so nothing stale is read; a file that cannot be read
# or written is ignored (the corpus is built, as without it).
def _cache_path(root: Path, files: list[Path], topics: Path) -> Path | None:
    import hashlib
    import json
    import sys

    try:
        stats = [(str(p), p.stat()) for p in [topics, *(root / rel for rel in files)]]
        key = json.dumps([Path(__file__).read_text(encoding="utf-8"), str(root), sys.version,
                          [(p, st.st_size, st.st_mtime_ns) for p, st in stats]])
    except OSError:
        return None
    from .._cachedir import user_cache_dir

    return user_cache_dir() / f"stdlib-corpus-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _read_cache(path: Path | None) -> list[tuple[str, str]] | None:
    import json

    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(data, list) and all(isinstance(d, list) and len(d) == 2 for d in data)):
        return None
    return [(str(name), str(text)) for name, text in data]


def _write_cache(path: Path | None, named: list[tuple[str, str]]) -> None:
    import json
    import tempfile

    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".stdlib-corpus-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(named, fh)
        os.replace(tmp, path)
    except OSError:
        pass


def stdlib_corpus(stdlib_dir: str | os.PathLike | None = None) -> list[str]:
    """Real English text that ships with Python: a list of documents.

    1. The documentation topics of `pydoc_data.topics` (the text `help('if')` shows),
       one document per topic, in sorted topic order.
    2. The docstrings of the standard library's .py sources under `stdlib_dir`
       (default ``sysconfig.get_paths()['stdlib']``), one document per file (module,
       class and function docstrings in source order, separated by blank lines), files
       in sorted path order. Sources are parsed with `ast`, never imported. Skipped:
       directories named site-packages, dist-packages, test, tests, idle_test (so
       idlelib/idle_test and lib2to3/tests), files that fail to read, decode or parse.
       Doctest examples (a ``>>>`` line up to the next blank line) are removed: they
       are code, not English.

    Exact duplicate documents are kept once (the first in the order above).
    Deterministic for a given Python installation; another Python version gives another
    corpus (CPython 3.11.7: 722 documents, 327k whitespace-separated words of which 63k
    from the topics, 457k `tokenize_words` tokens). Built once per installation and kept in
    the user's cache directory (`_cache_path`): parsing the sources takes seconds.
    """
    return [text for _, text in stdlib_named_documents(stdlib_dir)]
