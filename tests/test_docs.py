"""The repository documents its own method: every citation points into docs/method.md.

(a) No file of the code, workflow, tests, benchmarks, CI, the Snakefile or the README cites a
document a reader of the repository cannot open (the project's former private specification)
or an issue by its number: a comment states its reason itself.
(b) Every citation `method.md §N` or `method.md §N.M` (also lists and ranges such as
`method.md §3, §6-§8`) names a heading that exists in docs/method.md (`## N. Title`,
`### N.M Title`).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
SCANNED_DIRS = ("oattn_lib", "scripts", "workflow", "tests", "bench", ".ci")
SCANNED_FILES = ("Snakefile", "README.md")
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", ".hypothesis", ".snakemake"}

# Built from pieces so that this file does not match its own patterns.
_PRIVATE_DOC_WORD = re.compile(r"\b" + "SP" + r"EC\b")  # the upper-case word: a citation
_PRIVATE_DOC_FILE = re.compile(r"\b" + "sp" + r"ec\.md\b", re.IGNORECASE)  # its file, in any case
_ISSUE = re.compile(r"\b[Ii]ssues?\s*(?:no\.?\s*)?#?\s*\d+")
_CITATION = re.compile(r"method\.md((?:\s*(?:,|and|to|-|–)?\s*§\d+(?:\.\d+)?)+)")
_SECTION = re.compile(r"§(\d+(?:\.\d+)?)")


def scanned_files(root: Path = ROOT) -> list[Path]:
    """Every text file of the scanned directories, the Snakefile and the README."""
    out = [root / name for name in SCANNED_FILES if (root / name).is_file()]
    for d in SCANNED_DIRS:
        base = root / d
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and not SKIPPED_PARTS & set(p.relative_to(root).parts) and p.suffix not in (
                    ".pyc", ".nbi", ".nbc", ".png", ".zarr", ".npz"):
                out.append(p)
    return out


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def method_sections(path: Path = METHOD) -> set[str]:
    """Section numbers of docs/method.md: "3" for `## 3. Title`, "3.2" for `### 3.2 Title`."""
    text = path.read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. \S", text, flags=re.MULTILINE))
    sections |= set(re.findall(r"^### (\d+\.\d+) \S", text, flags=re.MULTILINE))
    return sections


def forbidden_mentions(text: str) -> list[str]:
    """Mentions of the former private specification, and issue numbers, in `text`."""
    found = [m.group(0) for m in _PRIVATE_DOC_WORD.finditer(text)]
    found += [m.group(0) for m in _PRIVATE_DOC_FILE.finditer(text) if not _PRIVATE_DOC_WORD.match(m.group(0))]
    found += [m.group(0) for m in _ISSUE.finditer(text)]
    return found


def bad_citations(text: str, sections: set[str]) -> list[str]:
    """The `method.md §...` sections cited in `text` that docs/method.md does not have."""
    bad = []
    for m in _CITATION.finditer(text):
        bad += [s for s in _SECTION.findall(m.group(1)) if s not in sections]
    return bad


def _line(text: str, needle: str) -> int:
    return text[:text.find(needle)].count("\n") + 1


def test_method_document_has_numbered_sections():
    text = METHOD.read_text(encoding="utf-8")
    tops = [int(n) for n in re.findall(r"^## (\d+)\. \S", text, flags=re.MULTILINE)]
    assert tops == list(range(1, len(tops) + 1)), f"docs/method.md: sections not numbered 1..n: {tops}"
    for sub in re.findall(r"^### (\d+)\.(\d+) \S", text, flags=re.MULTILINE):
        assert sub[0] in {str(t) for t in tops}, f"docs/method.md: subsection {'.'.join(sub)} has no section"


def test_no_private_document_or_issue_numbers():
    problems = []
    for path in scanned_files():
        text = _text(path)
        if text is None:
            continue
        for hit in forbidden_mentions(text):
            problems.append(f"{path.relative_to(ROOT)}:{_line(text, hit)}: {hit!r}")
    assert not problems, ("cite docs/method.md (or state the reason) instead of:\n  "
                          + "\n  ".join(problems))


def test_every_method_citation_names_an_existing_section():
    sections = method_sections()
    problems = []
    for path in scanned_files():
        text = _text(path)
        if text is None:
            continue
        for section in bad_citations(text, sections):
            problems.append(f"{path.relative_to(ROOT)}: §{section}")
    assert not problems, ("citations of docs/method.md sections that do not exist:\n  "
                          + "\n  ".join(problems))


@pytest.mark.parametrize("text, bad", [
    ("see docs/method.md §3.2", []),
    ("(docs/method.md §3, §6-§8)", []),
    ("docs/method.md\n    §2.2-§2.4", []),
    ("see docs/method" ".md §3.9", ["3.9"]),  # split: this file is scanned too
    ("(docs/method" ".md §2, §99)", ["99"]),
])
def test_the_citation_check_flags_missing_sections(text, bad):
    sections = {"2", "2.2", "2.4", "3", "3.2", "6", "8"}
    assert bad_citations(text, sections) == bad


@pytest.mark.parametrize("text, n_hits", [
    ("# as the " + "SP" + "EC says", 1),
    ("see ../shared/" + "SP" + "EC.md", 1),
    ("(issue" + " 6)", 1),
    ("Issues #" + "12 and 13", 1),
    ("TensorAttentionSpec and spec.side", 0),
    ("the tissue 5 is not an issue", 0),
])
def test_the_mention_check_flags_private_documents_and_issue_numbers(text, n_hits):
    assert len(forbidden_mentions(text)) == n_hits


def test_the_readme_states_the_latest_fresh_clone_figure_of_each_command():
    """The README's figure for `make run` and for `make test` is the latest fresh-clone row of
    bench/fresh_clone.csv for that command (set-up included), so that a new measurement
    recorded there and not in the README, or a figure typed by hand, fails."""
    import csv

    rows = list(csv.DictReader((ROOT / "bench" / "fresh_clone.csv").open()))
    readme = (ROOT / "README.md").read_text()
    for command in ("run", "test"):
        latest = [r for r in rows if r["command"] == command and r["note"].startswith("fresh clone") and r["total_s"]][-1]
        total = float(latest["total_s"])
        figure = f"{int(total // 60)} min {int(total) % 60:02d} s on a fresh clone"
        assert figure in readme, (command, figure, latest)
