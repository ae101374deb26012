"""Code fingerprints of the stages: which library modules a stage runs, and what changes them."""
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.settings.types import RerunTrigger

from oattn_lib.fingerprint import (LibrarySnapshot, SnakemakeInternalsError, code_fingerprint, code_version,
                                   declared_assets, module_closure, modules_fingerprint,
                                   snakemake_internals_problems)

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
    # the stages that run the questionnaire: never train or extract, nor figures, which reads
    # the organized stores' trees (and reruns when organize rewrites them), not its code
    assert changed == {"organize", "decompose"}
    edit(q, "def _edited():\n    return 1\n\n\n", "")
    assert fingerprints(project) == before, "reverting the edit restores every fingerprint"
    edit(project / "oattn_lib" / "plots" / "style.py", "DPI = ", "_UNUSED = 0\nDPI = ")
    changed = {s for s, v in fingerprints(project).items() if v != before[s]}
    assert changed == {"figures", "prune"}  # prune draws Figure 7


def test_a_snapshot_reads_each_library_once_and_gives_the_same_fingerprints(project, tmp_path):
    """The Snakefile fingerprints every rule inside one LibrarySnapshot: the same values as
    without it, each library root its own, and an edit seen by the next snapshot only."""
    other = tmp_path / "other"
    shutil.copytree(project / "scripts", other / "scripts")
    shutil.copytree(project / "oattn_lib", other / "oattn_lib")
    edit(other / "oattn_lib" / "questionnaire.py", "def questionnaire3d(", "def _edited():\n    return 1\n\n\ndef questionnaire3d(")
    plain = fingerprints(project), fingerprints(other), modules_fingerprint(["oattn_lib.emd"], project)
    snapshot = LibrarySnapshot()
    with snapshot:
        # in turns, so that a memo keyed without its root would hand one library's to the other
        assert (fingerprints(project), fingerprints(other), modules_fingerprint(["oattn_lib.emd"], project)) == plain
    assert plain[0]["organize"] != plain[1]["organize"] and plain[0]["train"] == plain[1]["train"]
    q = project / "oattn_lib" / "questionnaire.py"
    edit(q, "def questionnaire3d(", "def _edited():\n    return 1\n\n\ndef questionnaire3d(")
    with snapshot:  # read before the edit: the Snakefile's view of the library while it parses
        assert fingerprints(project)["organize"] == plain[0]["organize"]
    assert fingerprints(project)["organize"] == plain[1]["organize"]  # outside: read afresh
    with LibrarySnapshot():
        assert fingerprints(project)["organize"] == plain[1]["organize"]


def test_the_lazily_exported_api_is_in_no_stage(project):
    """`oattn_lib` exports its Python API lazily: a stage imports modules under the package, which
    runs its __init__ but never loads the API, so editing the API changes no stage's fingerprint
    (a lazy package imported by name, like oattn_lib.data in prepare_data, still counts whole)."""
    before = fingerprints(project)
    assert not any("oattn_lib.api" in closure(project, s) for s in before)
    edit(project / "oattn_lib" / "api.py", "def extract(", "def _edited():\n    return 1\n\n\ndef extract(")
    assert fingerprints(project) == before


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


# -- assets: files of another language a module declares ------------------------------------------
def all_fingerprints(project):
    return {p.stem: code_fingerprint(p, project) for p in sorted((project / "scripts").glob("*.py"))}


def test_an_asset_edit_changes_the_stages_that_run_its_module_only(project):
    before = all_fingerprints(project)
    app = project / "oattn_lib" / "explorer" / "app.js"
    original = app.read_bytes()
    # a comment counts: the page embeds app.js verbatim, comments included
    app.write_bytes(original + b"// edited\n")
    changed = {s for s, v in all_fingerprints(project).items() if v != before[s]}
    assert changed == {"explorer", "explorer_index"}  # the scripts whose modules import explorer.page
    app.write_bytes(original)
    assert all_fingerprints(project) == before, "reverting the edit restores every fingerprint"
    edit(project / "oattn_lib" / "explorer" / "page.css", "body{", "body{color:red;")
    assert {s for s, v in all_fingerprints(project).items() if v != before[s]} == {"explorer", "explorer_index"}


def test_files_no_module_declares_do_not_count(project):
    before = all_fingerprints(project)
    (project / "oattn_lib" / "explorer" / "notes.js").write_text("// not an asset of any module\n")
    schema = project / "oattn_lib" / "schemas" / "config.schema.yaml"
    schema.write_text(schema.read_text() + "\n# an edit\n")
    assert all_fingerprints(project) == before


def test_every_file_of_another_language_in_the_library_is_a_declared_asset():
    # an undeclared asset would be code that edits without rerunning what it changes
    lib = REPO / "oattn_lib"
    declared = {a.resolve() for p in lib.rglob("*.py") if "__pycache__" not in p.parts for a in declared_assets(p)}
    files = {p.resolve() for ext in ("js", "css", "html") for p in lib.rglob(f"*.{ext}")}
    assert files and files <= declared, f"not declared in any module's __assets__: {sorted(files - declared)}"
    assert all(a.is_file() for a in declared)


def test_a_declared_asset_must_exist_and_be_named_by_literals(tmp_path):
    script = tmp_path / "s.py"
    script.write_text('__assets__ = ("style.css",)\n')
    with pytest.raises(FileNotFoundError, match=r"s\.py: declares the asset 'style.css'"):
        code_fingerprint(script, tmp_path)
    (tmp_path / "style.css").write_text("p{}\n")
    first = code_fingerprint(script, tmp_path)
    (tmp_path / "style.css").write_text("p{margin:0}\n")
    assert code_fingerprint(script, tmp_path) != first  # a script declares assets as a module does
    for bad in ('NAME = "a.css"\n__assets__ = (NAME,)\n', '__assets__ = "style.css"\n', '__assets__ = ("/abs.css",)\n'):
        script.write_text(bad)
        with pytest.raises(ValueError, match=r"s\.py, line \d: __assets__ must be a tuple of string literals"):
            code_fingerprint(script, tmp_path)


def test_the_explorer_page_embeds_its_assets_verbatim():
    from oattn_lib.explorer import page

    assert page.__assets__ == ("page.css", "app.js")
    for name in page.__assets__:
        assert page.asset(name) == (REPO / "oattn_lib" / "explorer" / name).read_text(encoding="utf-8")
    with pytest.raises(ValueError, match="'other.js' is not one of"):
        page.asset("other.js")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_explorer_script_parses():
    import subprocess

    proc = subprocess.run(["node", "--check", str(REPO / "oattn_lib" / "explorer" / "app.js")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- code_version: a rule's `code` param, and what it reads of Snakemake ------------------------------
class FakeIOFile:
    def __init__(self, pattern):
        self.pattern = pattern

    def apply_wildcards(self, wildcards):
        return self.pattern.format(**wildcards)


MISSING = object()


def fake_workflow(triggers=None, records=None, **replace):
    """The least of a Snakemake workflow that code_version reads: `triggers` None before the DAG is
    built; `records`: {output path: the params Snakemake recorded with it, each value's repr};
    `replace`: attributes to set instead, or to remove (MISSING)."""
    records = records or {}
    wf = SimpleNamespace(
        dag_settings=None if triggers is None else SimpleNamespace(rerun_triggers=set(triggers)),
        get_rule=lambda name: SimpleNamespace(output=[FakeIOFile(f"results/{{model}}/{name}.txt")]),
        modifier=SimpleNamespace(modify_rulename=lambda name: name),
        persistence=SimpleNamespace(params=records.get))
    for key, value in replace.items():
        if value is MISSING:
            delattr(wf, key)
        else:
            setattr(wf, key, value)
    return wf


@pytest.fixture
def stage(tmp_path):
    script = tmp_path / "organize.py"
    script.write_text("x = 1\n")
    return script


OFF = {RerunTrigger.MTIME, RerunTrigger.PARAMS, RerunTrigger.INPUT}  # --rerun-triggers mtime params input
OUT = "results/m/organize.txt"


def test_code_version_is_the_current_fingerprint_unless_the_code_trigger_is_off(stage, tmp_path):
    value = f"organize:{code_fingerprint(stage, tmp_path)}"
    recorded = {OUT: [repr(2), repr("organize:0ld0ld0ld0ld0ld0"), repr({"n_iters": 1})]}

    def version(triggers, records=recorded):
        wf = fake_workflow(triggers, records)
        return code_version(wf, "organize", "organize", script=stage, root=tmp_path)({"model": "m"})

    assert version(None) == value  # the Snakefile is parsed, no DAG yet
    assert version(RerunTrigger.all()) == value
    assert version(OFF) == "organize:0ld0ld0ld0ld0ld0"  # the value recorded with the job's first output
    assert version(OFF, {}) == value  # nothing recorded: the job runs anyway
    assert version(OFF, {OUT: [repr("organize_2:aaaa")]}) == value  # another stage's code param
    with pytest.raises(ValueError, match="exactly one of script and modules"):
        code_version(fake_workflow(), "organize", "organize", root=tmp_path)


def test_code_version_reads_the_record_of_a_module_rule_under_its_prefixed_name(stage, tmp_path):
    """Used as a module with `use rule * from oattn as oattn_*`, the rule organize is registered as
    oattn_organize: the record read with the code trigger off is that rule's output's."""
    prefixed = SimpleNamespace(modify_rulename=lambda name: f"oattn_{name}")
    records = {"results/m/oattn_organize.txt": [repr("organize:0ld0ld0ld0ld0ld0")]}
    version = code_version(fake_workflow(OFF, records, modifier=prefixed), "organize", "organize", script=stage,
                           root=tmp_path)
    assert version({"model": "m"}) == "organize:0ld0ld0ld0ld0ld0"
    with pytest.raises(SnakemakeInternalsError, match=r"workflow\.modifier is missing"):
        code_version(fake_workflow(OFF, modifier=MISSING), "organize", "organize", script=stage, root=tmp_path)


@pytest.mark.parametrize("workflow, message", [
    # triggers by name: CODE would never be found, and a code edit would silently rerun nothing
    (fake_workflow({"mtime", "params"}), r"rerun_triggers is \{.*\}, not a set of RerunTrigger"),
    (fake_workflow(OFF, dag_settings=MISSING), r"workflow\.dag_settings is missing"),
    (fake_workflow(OFF, dag_settings=SimpleNamespace()), r"workflow\.dag_settings\.rerun_triggers is missing"),
    (fake_workflow(OFF, get_rule=MISSING), r"workflow\.get_rule is missing"),
    (fake_workflow(OFF, persistence=MISSING), r"workflow\.persistence is missing"),
    (fake_workflow(OFF, persistence=None), r"workflow\.persistence is None"),
    (fake_workflow(OFF, persistence=SimpleNamespace()), r"workflow\.persistence\.params is missing"),
    (fake_workflow(OFF, {OUT: {"code": "organize:abc"}}), r"params\('results/m/organize\.txt'\) is \{.*\}, not a list"),
    (fake_workflow(OFF, {OUT: ["'organize:abc"]}), r"recorded param \"'organize:abc\" .* is not the repr of a code"),
], ids=["triggers-by-name", "no-dag_settings", "no-rerun_triggers", "no-get_rule", "no-persistence",
        "persistence-None", "no-params", "params-not-a-list", "params-not-reprs"])
def test_code_version_fails_loudly_where_snakemake_changed(stage, tmp_path, workflow, message):
    version = code_version(workflow, "organize", "organize", script=stage, root=tmp_path)
    with pytest.raises(SnakemakeInternalsError, match=message):
        version({"model": "m"})


def test_the_installed_snakemake_has_what_code_version_reads():
    import snakemake

    problems = snakemake_internals_problems()
    assert problems == [], (f"Snakemake {snakemake.__version__} changed what oattn_lib.fingerprint.code_version "
                            f"reads: {'; '.join(problems)}")


@pytest.mark.parametrize("owner, attr, replacement, message", [
    ("snakemake.workflow.Workflow", "get_rule", None, r"Workflow\.get_rule\(name\) is missing"),
    ("snakemake.rules.Rule", "output", None, r"Rule\.output is not a property"),
    ("snakemake.persistence.Persistence", "params", None, r"Persistence\.params\(path\) is missing"),
    ("snakemake.persistence.Persistence", "_serialize_param_builtin", lambda self, value: str(value),
     r"records the param 'stage:0123' as 'stage:0123', not as its repr"),
], ids=["get_rule", "Rule.output", "Persistence.params", "params-not-reprs"])
def test_code_version_refuses_a_snakemake_without_what_it_reads(monkeypatch, stage, tmp_path, owner, attr,
                                                                replacement, message):
    import importlib

    import snakemake.api  # noqa: F401  (snakemake.workflow imported first is circular)

    module, _, name = owner.rpartition(".")
    mod = importlib.import_module(module)
    # Snakemake 9.17 renamed the class whose params are read, PersistenceBase
    cls = getattr(mod, name, None) or getattr(mod, f"{name}Base")
    if replacement is None:
        monkeypatch.delattr(cls, attr)
    else:
        monkeypatch.setattr(cls, attr, replacement)
    assert any(re.search(message, p) for p in snakemake_internals_problems())
    with pytest.raises(SnakemakeInternalsError, match=r"relies on Snakemake internals that Snakemake .* changed: .*"
                       + message):
        code_version(fake_workflow(), "organize", "organize", script=stage, root=tmp_path)


TINY_SNAKEFILE = """
import os
from oattn_lib.fingerprint import code_version

SCRIPT = os.path.join(workflow.basedir, "stage.py")

rule stage:
    output: "out/{x}.txt"
    params: code=code_version(workflow, "stage", "stage", script=SCRIPT, root=workflow.basedir)
    shell: "echo {params.code} > {output}"
"""


def test_code_version_in_a_real_snakemake_run(tmp_path):
    """The installed Snakemake, end to end: the param is the fingerprint, Snakemake records it as
    its repr, a code edit plans the job again, and with the code trigger off it plans nothing."""
    from wfutil import run_snakemake

    (tmp_path / "Snakefile").write_text(TINY_SNAKEFILE)
    script = tmp_path / "stage.py"
    script.write_text("x = 1\n")

    def snakemake(*args):
        proc = run_snakemake(["--cores", "1", "out/a.txt", *args], cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    snakemake()
    first = f"stage:{code_fingerprint(script, tmp_path)}"
    assert (tmp_path / "out" / "a.txt").read_text().strip() == first
    assert "Nothing to be done" in snakemake("-n")
    script.write_text("x = 2\n")
    assert "rule stage:" in snakemake("-n")
    assert "Nothing to be done" in snakemake("-n", "--rerun-triggers", "mtime", "params", "input")
    script.write_text("x = 1\n")
    assert "Nothing to be done" in snakemake("-n")


def _fingerprints_in_a_process(project, cache: Path) -> dict:
    import json
    import os
    import subprocess
    import sys
    code = ("import json, sys; from pathlib import Path; from oattn_lib.fingerprint import code_fingerprint; "
            f"p = Path({str(project)!r}); print(json.dumps({{s: code_fingerprint(p / 'scripts' / f'{{s}}.py', p) "
            "for s in ('organize', 'decompose', 'figures', 'train', 'prepare_data')}))")
    env = {**os.environ, "OATTN_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_fingerprints_kept_between_processes_are_the_ones_computed(project, tmp_path):
    """The on-disk memo of module digests and imports (what makes a dry run cheap) gives every
    later process the fingerprints it would compute itself: an edited module is new text, a new
    module file changes what an import resolves to, and a corrupt memo is ignored."""
    cache = tmp_path / "cache"
    first = _fingerprints_in_a_process(project, cache)
    assert first == {s: code_fingerprint(project / "scripts" / f"{s}.py", project) for s in first}
    memo = next(cache.glob("fingerprints-py*.json"))
    assert len(memo.read_text()) > 1000
    assert _fingerprints_in_a_process(project, cache) == first  # read back, not recomputed
    edit(project / "oattn_lib" / "trees.py", "import numpy as np", "import numpy as np\nEDITED = 1")
    edited = _fingerprints_in_a_process(project, cache)
    assert edited["organize"] != first["organize"]
    assert edited == _fingerprints_in_a_process(project, tmp_path / "cache-2")
    # `from oattn_lib.models import data` names an attribute until a module of that name exists
    (project / "oattn_lib" / "stages" / "train.py").write_text(
        (project / "oattn_lib" / "stages" / "train.py").read_text() + "\nfrom oattn_lib.trees import newmod\n")
    before_new = _fingerprints_in_a_process(project, cache)
    (project / "oattn_lib" / "trees").mkdir()
    shutil.move(project / "oattn_lib" / "trees.py", project / "oattn_lib" / "trees" / "__init__.py")
    (project / "oattn_lib" / "trees" / "newmod.py").write_text("X = 1\n")
    with_new = _fingerprints_in_a_process(project, cache)
    assert with_new["train"] != before_new["train"]
    assert with_new == _fingerprints_in_a_process(project, tmp_path / "empty-cache")
    memo.write_text("{not json")
    assert _fingerprints_in_a_process(project, cache) == with_new


def test_a_workflows_own_files_and_library_are_found_from_its_snakefile(tmp_path):
    """Used as a module, the workflow's scripts are read beside its own Snakefile (a local one), or
    from the source cache's copy (a remote one), never from the user's directory; its library is
    the one beside it where there is one, else the installed one."""
    from oattn_lib.fingerprint import library_beside, workflow_file

    local = SimpleNamespace(is_local=True, get_path_or_uri=lambda secret_free: str(tmp_path))
    assert workflow_file(None, local, "scripts/organize.py") == str(tmp_path / "scripts" / "organize.py")
    asked = []
    remote = SimpleNamespace(is_local=False, join=lambda rel: ("github", rel))
    cache = SimpleNamespace(sourcecache=SimpleNamespace(get_path=lambda f: asked.append(f) or "/cache/organize.py"))
    assert workflow_file(cache, remote, "scripts/organize.py") == "/cache/organize.py"
    assert asked == [("github", "scripts/organize.py")]
    assert library_beside(None) is None and library_beside(tmp_path) is None
    (tmp_path / "oattn_lib").mkdir()
    assert library_beside(tmp_path) == str(tmp_path)
