"""The version of oattn: written once, agreed on by the packaging, the citation and the changelog,
recorded with the git commit of the library's code in every store, and no reason to rerun."""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

import oattn_lib
from oattn_lib import store
from oattn_lib.fingerprint import code_fingerprint, module_closure

REPO = Path(__file__).resolve().parents[1]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_pyproject_reads_the_version_from_the_package():
    from setuptools.config.expand import read_attr

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "oattn_lib.__version__"}
    assert read_attr("oattn_lib.__version__", root_dir=REPO) == oattn_lib.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", oattn_lib.__version__)


def test_the_citation_and_the_changelog_name_the_version():
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert str(citation["version"]) == oattn_lib.__version__
    headings = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[0] == "Unreleased" and headings[1] == oattn_lib.__version__


def test_provenance_records_the_version_and_the_commit():
    attrs = store.provenance_attrs({"a": 1}, "0" * 64, code="organize:0123")
    assert attrs["oattn_version"] == oattn_lib.__version__
    assert ("oattn_commit" in attrs) == (store.code_commit() is not None)
    if (REPO / ".git").exists() and shutil.which("git"):
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert attrs["oattn_commit"].removesuffix("-dirty") == head.strip()


def _repo(path: Path) -> str:
    """A git repository at `path` with one commit of one file; its HEAD."""
    path.mkdir(parents=True, exist_ok=True)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    (path / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


@needs_git
def test_the_commit_is_the_librarys_not_the_current_directorys(tmp_path, monkeypatch):
    """A user runs the workflow as a module from their own repository: its HEAD is not oattn's."""
    users = _repo(tmp_path / "analysis")
    monkeypatch.chdir(tmp_path / "analysis")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "analysis" / ".git"))  # not even when git is told so
    store.code_commit.cache_clear()
    try:
        commit = store.code_commit()
    finally:
        store.code_commit.cache_clear()
    assert commit is None or not commit.startswith(users)
    assert (commit is None) == (not (REPO / ".git").exists())


@needs_git
def test_git_commit_says_dirty_for_tracked_changes_only(tmp_path):
    head = _repo(tmp_path / "r")
    assert store.git_commit(tmp_path / "r") == head
    (tmp_path / "r" / "new.txt").write_text("untracked\n")
    assert store.git_commit(tmp_path / "r") == head
    (tmp_path / "r" / "f.txt").write_text("two\n")
    assert store.git_commit(tmp_path / "r") == head + "-dirty"
    assert store.git_commit(tmp_path / "r" / "sub") is None            # not a work tree's top


def test_no_git_or_no_repository_is_no_commit(tmp_path, monkeypatch):
    assert store.git_commit(tmp_path) is None                          # not a repository
    (tmp_path / ".git").mkdir()
    assert store.git_commit(tmp_path) is None                          # git fails on it
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert store.git_commit(tmp_path) is None                          # no git at all


def test_a_version_bump_changes_no_fingerprint(tmp_path):
    """The version is provenance, not behaviour: bumping it reruns nothing, editing the package's
    code does; reading it from a stage does not make the package's lazy exports the stage's code."""
    lib = tmp_path / "oattn_lib"
    lib.mkdir()
    (lib / "_lazy.py").write_text("def lazy_exports(name, g, exports):\n    return [], None, None\n")
    (lib / "api.py").write_text("def extract():\n    return 1\n")
    init = lib / "__init__.py"
    init.write_text('from ._lazy import lazy_exports\n\n__version__ = "0.5.0"\n\n'
                    '__all__, __getattr__, __dir__ = lazy_exports(__name__, globals(), {"api": ("extract",)})\n')
    (lib / "store.py").write_text("from . import __version__\n\n\ndef attrs():\n    return {'v': __version__}\n")
    script = tmp_path / "stage.py"
    script.write_text("from oattn_lib import store\n\nstore.attrs()\n")
    assert "oattn_lib.api" not in module_closure(script, tmp_path)
    before = code_fingerprint(script, tmp_path)
    init.write_text(init.read_text().replace('"0.5.0"', '"0.6.0"'))
    assert code_fingerprint(script, tmp_path) == before
    init.write_text(init.read_text().replace("\n__all__", "_EDITED = 1\n__all__"))
    assert code_fingerprint(script, tmp_path) != before
    # and in the library itself: no stage runs the API for reading the version
    assert "oattn_lib.api" not in module_closure(REPO / "scripts" / "organize.py", REPO)
