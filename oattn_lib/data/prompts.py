"""A user's own texts: the prompts an `hf` model's samples are made of (config `data.texts`).

One text is one sample, at its own length. Four forms, told apart by the path:

- a plain text file (any suffix but .jsonl): one text per non-blank line; the two characters
  backslash and n inside a line are read as a newline (a multi-line prompt on one line), and
  a doubled backslash as one backslash;
- a JSON Lines file (`.jsonl`): one JSON object per non-blank line, the text in its field
  `field` (default `text`);
- a directory of `.txt` files: one text per file, whole, in the order of their names;
- a Hugging Face `datasets` dataset saved with `save_to_disk` (a directory holding
  `dataset_info.json` or `state.json`): one text per row of the column `field` (default
  `text`); a `DatasetDict` is read from its `test` split, else its only split.

Every problem is a `ValueError` of one line naming the config key it was given as (`key`), the
file and, for a bad line, the line number. Reading loads nothing in proportion to a number
read from a file: the texts are the file's own lines, objects or rows.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["read_texts", "texts_form", "unescape_line"]

_ESCAPE = re.compile(r"\\(\\|n)")


def unescape_line(line: str) -> str:
    """A line of a plain prompts file as its text: `\\n` a newline, `\\\\` one backslash."""
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else "\\", line)


def texts_form(path) -> str:
    """`jsonl`, `lines`, `txt_dir` or `dataset`: the form of the texts at `path` (which exists)."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_info.json").is_file() or (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
            return "dataset"
        return "txt_dir"
    return "jsonl" if p.suffix.lower() == ".jsonl" else "lines"


def _lines(path: Path, key: str) -> list[tuple[int, str]]:
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{key}: {path} is not UTF-8 text (byte {exc.start})") from None
    return [(i + 1, line) for i, line in enumerate(raw.splitlines()) if line.strip()]


def _jsonl(path: Path, field: str, key: str) -> list[str]:
    texts = []
    for number, line in _lines(path, key):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{key}: {path} line {number} is not JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or field not in obj:
            raise ValueError(f"{key}: {path} line {number} has no field {field!r} (data.field names the text field)")
        if not isinstance(obj[field], str):
            raise ValueError(f"{key}: {path} line {number}: field {field!r} is a {type(obj[field]).__name__}, "
                             "not a string")
        texts.append(obj[field])
    return texts


def _dataset(path: Path, field: str, key: str) -> list[str]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - a pinned requirement
        raise ValueError(f"{key}: {path} is a saved `datasets` dataset but the package is not installed") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # the library's errors name no key
        raise ValueError(f"{key}: {path} cannot be read as a saved dataset ({type(exc).__name__}: {exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        split = "test" if "test" in ds else next(iter(ds)) if len(ds) == 1 else None
        if split is None:
            raise ValueError(f"{key}: {path} holds the splits {sorted(ds)} and no `test` split; save the one to "
                             "analyse")
        ds = ds[split]
    if field not in ds.column_names:
        raise ValueError(f"{key}: {path} has no column {field!r} (data.field names the text column); columns: "
                         f"{ds.column_names}")
    texts = ds[field]
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ValueError(f"{key}: {path} row {bad}: column {field!r} holds a {type(texts[bad]).__name__}, not a "
                         "string")
    return list(texts)


def read_texts(path, field: str | None = None, key: str = "data.texts") -> list[str]:
    """The texts at `path` in their order (module docstring: the four forms).

    field: the JSON field or dataset column holding the text (None: `text`); key: the config
    key `path` was given as, named in every error. ValueError when the path is missing, holds
    no text, or a line, file or row is malformed; blank texts count as none.
    """
    p = Path(path)
    try:
        return _read_texts(p, field, key)
    except OSError as exc:  # permission, a name too long: `exists` swallows only "not found"
        raise ValueError(f"{key}: {exc.filename or p}: {exc.strerror or exc}") from None


def _read_texts(p: Path, field: str | None, key: str) -> list[str]:
    if not p.exists():
        raise ValueError(f"{key}: {p} does not exist")
    form = texts_form(p)
    if field and form in ("lines", "txt_dir"):
        what = "a plain text file" if form == "lines" else "a directory of .txt files"
        raise ValueError(f"{key}: {p} is {what}; a field name (data.field) applies only to .jsonl files and "
                         "saved datasets")
    field = field or "text"
    if form == "lines":
        texts = [unescape_line(line) for _, line in _lines(p, key)]
    elif form == "jsonl":
        texts = _jsonl(p, field, key)
    elif form == "dataset":
        texts = _dataset(p, field, key)
    else:
        files = sorted(f for f in p.iterdir() if f.suffix == ".txt" and f.is_file())
        texts = []
        for f in files:
            try:
                texts.append(f.read_text(encoding="utf-8"))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{key}: {f} is not UTF-8 text (byte {exc.start})") from None
        if not files:
            raise ValueError(f"{key}: {p} is a directory with no .txt file and no saved dataset")
    blank = [i for i, t in enumerate(texts) if not t.strip()]
    if blank:
        raise ValueError(f"{key}: {p}: text {blank[0]} is blank")
    if not texts:
        raise ValueError(f"{key}: {p} holds no text")
    return texts
