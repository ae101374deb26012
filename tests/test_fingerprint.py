"""Code fingerprints of the stages: which library modules a stage runs, and what changes them."""
import shutil
from pathlib import Path

import pytest

from oattn_lib.fingerprint import code_fingerprint, module_closure

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path):
    """A copy of the scripts and the library, to edit."""
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    shutil.copytree(REPO / "oattn_lib", tmp_path / "oattn_lib", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def closure(project, script):
    return set(module_closure(project / "scripts" / f"{script}.py", project))


def test_closure_follows_imports_through_modules_and_functions(project):
    org = closure(project, "organize")
    # organize -> stages.organize -> questionnaire -> emd, trees (module-level and local imports)
    assert {"oattn_lib.stages.organize", "oattn_lib.questionnaire", "oattn_lib.emd", "oattn_lib.trees",
            "oattn_lib.store", "oattn_lib.stages", "oattn_lib"} <= org
    assert "oattn_lib.plots" not in org and "oattn_lib.train" not in org
    assert "oattn_lib.plots" in closure(project, "figures")
    assert "oattn_lib.questionnaire" not in closure(project, "train")
    assert "oattn_lib.questionnaire" not in closure(project, "extract")
    # a lazy package (importlib) pulls in all of its modules: the static graph cannot see which
    assert {"oattn_lib.data.text", "oattn_lib.data.images"} <= closure(project, "prepare_data")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def fingerprints(project):
    return {s: code_fingerprint(project / "scripts" / f"{s}.py", project)
            for s in ("prepare_data", "train", "extract", "organize", "decompose", "entropy", "tables",
                      "figures", "prune", "summary")}


def test_a_code_edit_changes_exactly_the_stages_that_run_it(project):
    before = fingerprints(project)
    q = project / "oattn_lib" / "questionnaire.py"
    edit(q, "def questionnaire3d(", "def _edited():\n    return 1\n\n\ndef questionnaire3d(")
    after = fingerprints(project)
    changed = {s for s in before if before[s] != after[s]}
    # figures reads trees through the questionnaire's Organization; never train or extract
    assert changed == {"organize", "decompose", "figures"}
    edit(q, "def _edited():\n    return 1\n\n\n", "")
    assert fingerprints(project) == before, "reverting the edit restores every fingerprint"
    edit(project / "oattn_lib" / "plots" / "style.py", "DPI = ", "_UNUSED = 0\nDPI = ")
    changed = {s for s, v in fingerprints(project).items() if v != before[s]}
    assert changed == {"figures", "prune"}  # prune draws Figure 7


def test_comments_docstrings_and_layout_do_not_count(project):
    before = fingerprints(project)
    q = project / "oattn_lib" / "questionnaire.py"
    text = q.read_text()
    first_def = text.index("def questionnaire3d(")
    doc_start = text.index('"""', first_def)
    q.write_text(text[:doc_start] + '"""Reworded."""\n    # a new comment\n\n    ' + text[text.index('"""', doc_start + 3) + 3:].lstrip())
    assert fingerprints(project) == before
    edit(project / "scripts" / "organize.py", "setup_logging(", "setup_logging(  # why\n    ")
    assert fingerprints(project) == before


def test_a_script_edit_changes_its_own_fingerprint_only(project):
    before = fingerprints(project)
    edit(project / "scripts" / "tables.py", "fraction=snakemake.params.fraction", "fraction=float(snakemake.params.fraction)")
    changed = {s for s, v in fingerprints(project).items() if v != before[s]}
    assert changed == {"tables"}


def test_a_module_that_does_not_parse_is_named(project):
    (project / "oattn_lib" / "questionnaire.py").write_text("def broken(:\n")
    with pytest.raises(SyntaxError, match="questionnaire.py"):
        code_fingerprint(project / "scripts" / "organize.py", project)
