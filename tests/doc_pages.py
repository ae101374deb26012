"""The project's documentation as the tests read it: README.md and every page under docs/.

The tests that run what the documentation shows (its snakemake commands, its recipes, the files
a page tells the reader to save) read every page through this module, so that a command moved
from the README to a page stays tested, and the link checks see the pages as mkdocs does.
"""
from __future__ import annotations

import re
import textwrap
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a fenced code block, also indented (inside a list item, an admonition or a content tab):
# its language, the rest of its info line (`title="name"`) and its body, dedented
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.M | re.S)
_TITLE = re.compile(r'\btitle="([^"]+)"')
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?!\n))*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_ATTR_ID = re.compile(r"\{\s*#([\w-]+)[^}]*\}\s*$")


def doc_pages(root: Path = REPO) -> list[Path]:
    """README.md, then every Markdown page under docs/, in path order."""
    docs = root / "docs"
    return [root / "README.md", *sorted(p for p in docs.rglob("*.md") if p.is_file())]


def code_blocks(text: str, lang: str | None = None) -> list[tuple[str, str, str]]:
    """(language, info line, body) of every fenced block of `text`, bodies dedented; only the
    blocks in `lang` where it is given."""
    out = []
    for m in _FENCE.finditer(text):
        if lang is None or m.group("lang") == lang:
            body = textwrap.dedent("\n".join(line[len(m.group("indent")):] if line.startswith(m.group("indent"))
                                             else line for line in m.group("body").splitlines()))
            out.append((m.group("lang"), m.group("info").strip(), body + ("\n" if body else "")))
    return out


def titled_files(pages: list[Path] | None = None) -> dict[str, str]:
    """The files the pages tell the reader to save: each block titled `title="name"`, by name.
    Two blocks of one name must hold the same text."""
    files: dict[str, str] = {}
    for page in pages if pages is not None else doc_pages():
        for _, info, body in code_blocks(page.read_text(encoding="utf-8")):
            if (m := _TITLE.search(info)):
                name = m.group(1)
                assert files.get(name, body) == body, f"{page}: a second, different {name}"
                files[name] = body
    return files


def without_code_blocks(text: str) -> str:
    """`text` without its fenced code blocks."""
    return _FENCE.sub("", text)


def prose(text: str) -> str:
    """`text` without its code blocks and inline code: what mkdocs reads links and headings in."""
    return _INLINE_CODE.sub("", without_code_blocks(text))


def links(text: str) -> list[str]:
    """The target of every Markdown link and image of `text`, outside code."""
    return _LINK.findall(prose(text))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs' default) gives a heading."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(text: str) -> set[str]:
    """The anchors of a page: each heading's slug (a repeated one gets `_1`, `_2`, ... as the toc
    extension numbers them) or its explicit `{#id}`."""
    seen: set[str] = set()
    for m in _HEADING.finditer(without_code_blocks(text)):
        title = m.group(2)
        if (explicit := _ATTR_ID.search(title)):
            seen.add(explicit.group(1))
            continue
        base = anchor = slug(title)
        n = 0
        while anchor in seen:
            n += 1
            anchor = f"{base}_{n}"
        seen.add(anchor)
    return seen
