"""Code fingerprints of the workflow's stages: which library code a stage runs, as one hash.

Snakemake sees a rule's script, never the library the script calls, so editing
`oattn_lib/questionnaire.py` would leave every organized store stale. A stage's
fingerprint hashes its script and every `oattn_lib` module the script imports, directly
or through other modules (imports anywhere in a module count, function-local ones
included), found statically with `ast`: nothing is imported, so it is cheap at DAG build
time and never loads torch.

What is hashed is each module's syntax tree without docstrings (`ast.dump`, no line
numbers): editing a comment, a docstring or the layout changes nothing, editing code
does. The package's `__version__` is provenance (stores record it), not code: bumping it
changes nothing either (`PROVENANCE`). Parent packages' `__init__` modules count
(importing a submodule runs them). A module that imports with `importlib` pulls in every
module of its package, since the static graph cannot see which it loads. So does a lazy package (like `oattn_lib.data`,
through `oattn_lib._lazy.lazy_exports`) that is imported by name (`from oattn_lib.data
import text_dataset`); a lazy package that is only the parent of an imported module
(`oattn_lib` itself, whose `__init__` runs before `oattn_lib.stages.organize`) counts with
its own code and eager imports, not its lazy exports, which load on attribute access only.

Files of another language that a module or script reads (the explorer's `app.js` and
`page.css`) count as its code: it declares them, file names relative to its own directory,
in a module-level `__assets__ = ("app.js", ...)` of string literals, and the fingerprint of
every stage that runs the module hashes their bytes. Raw bytes, comments included: the
explorer embeds its assets verbatim in every page, so a comment there is part of the output
(a Python comment never is).

`code_version` makes a rule's `code` param of a fingerprint, the one place that reads
Snakemake's internals (`snakemake_internals_problems` lists what it relies on).

Every Snakemake invocation fingerprints each rule's script (about 20 of them, sharing most
modules), so a module's parse, digest and imports are computed once per process for its
text (an edited file is new text), and kept on disk between processes (`_DiskMemo`: the
user's cache directory, keyed by the SHA-256 of the text, so an edited file is a new key and
nothing goes stale): parsing the library's modules was most of a dry run's time, paid again
by every Snakemake command a user or a test types.
"""
from __future__ import annotations

import ast
import atexit
import dataclasses
import hashlib
import inspect
import json
import os
import sys
import tempfile
import weakref
from collections.abc import Set as AbstractSet
from functools import lru_cache
from pathlib import Path

from ._cachedir import user_cache_dir

__all__ = ["library_root", "library_beside", "workflow_file", "module_closure", "declared_assets",
           "code_fingerprint", "modules_fingerprint", "code_version", "snakemake_internals_problems", "SnakemakeInternalsError"]

PACKAGE = "oattn_lib"
PROVENANCE = frozenset({"__version__"})
"""Module-level names that record what produced an output, not how it is computed: a
module-level assignment of one to a string is not code (a version bump reruns nothing), and
importing one from a package counts the package's own code, not its lazy exports."""


def library_root() -> Path:
    """The directory holding the `oattn_lib` package."""
    return Path(__file__).resolve().parent.parent


def library_beside(directory: str | os.PathLike | None) -> str | None:
    """`directory` (the workflow's Snakefile's, None for a remote module) where it holds an
    `oattn_lib` package: a clone, or a copy of the project, fingerprints its own library; None
    otherwise, the installed library's (`library_root`)."""
    if directory is None or not os.path.isdir(os.path.join(directory, PACKAGE)):
        return None
    return str(directory)


def workflow_file(workflow, home, relative: str) -> str:
    """A file of the workflow's own as a local path, `relative` to `home`, the directory of the
    workflow's Snakefile as Snakemake gives it (`workflow.current_basedir` while the Snakefile
    is parsed): the file itself, or the source cache's copy of a remote module's (a `github()`
    Snakefile), never a path under the directory the user runs from."""
    if home.is_local:
        return os.path.join(home.get_path_or_uri(secret_free=False), relative)
    return workflow.sourcecache.get_path(home.join(relative))


class LibrarySnapshot:
    """The library's files read once, for a process that fingerprints many scripts while the
    library does not change: a Snakefile's parse, where every rule's `code` param fingerprints
    its script (the rules share most modules) and the fingerprints are fixed once parsed
    (`code_version` keeps one per workflow). Used as `with snapshot:` around the calls; entering
    again reuses what the last `with` read. Outside a `with`, every call reads the files afresh.

    Kept: which file a module name resolves to, each file's text, each module's digest line and
    each script's or module's closure, by path and name."""

    def __init__(self) -> None:
        self.memo: dict[tuple, object] = {}
        self._outer: LibrarySnapshot | None = None

    def __enter__(self) -> LibrarySnapshot:
        global _SNAPSHOT
        self._outer, _SNAPSHOT = _SNAPSHOT, self
        return self

    def __exit__(self, *exc) -> None:
        global _SNAPSHOT
        _SNAPSHOT, self._outer = self._outer, None


_SNAPSHOT: LibrarySnapshot | None = None


def _snapshotted(kind: str):
    """`func`'s result memoised in the active `LibrarySnapshot` (none outside a `with`) by
    `kind` and its arguments, which must be hashable."""
    def wrap(func):
        def inner(*args):
            if _SNAPSHOT is None:
                return func(*args)
            key = (kind, *args)
            memo = _SNAPSHOT.memo
            if key not in memo:
                memo[key] = func(*args)
            return memo[key]
        inner.__wrapped__ = func
        inner.__doc__ = func.__doc__
        return inner
    return wrap


@_snapshotted("text")
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@_snapshotted("file")
def _module_file(root: Path, name: str) -> Path | None:
    parts = name.split(".")
    base = root.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _is_package(root: Path, name: str) -> bool:
    return (root.joinpath(*name.split(".")) / "__init__.py").is_file()


def _parse_text(text: str, filename: str) -> ast.Module:
    try:
        return ast.parse(text, filename=filename)
    except SyntaxError as exc:
        raise SyntaxError(f"{filename}: cannot fingerprint a module that does not parse ({exc.msg}, "
                          f"line {exc.lineno})") from None


@dataclasses.dataclass(frozen=True)
class _Imports:
    """The `oattn_lib` modules one module or script imports: `named`, those its code names (a
    module, or a package whose attributes it uses: `from oattn_lib.data import text_dataset`,
    `import oattn_lib`); `parents`, packages that only run their `__init__` because a module
    under them is imported (`from oattn_lib import store` runs oattn_lib's); `lazy`, the
    modules this package exports lazily (`lazy_exports`), which load on attribute access only."""
    named: frozenset[str]
    parents: frozenset[str]
    lazy: frozenset[str]


class _DiskMemo:
    """Digests and import sets of module texts, kept between processes in one JSON file of the
    user's cache directory (`$OATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/oattn`, else
    `~/.cache/oattn`; one file per Python minor version, whose `ast.dump` it depends on).

    A key is the SHA-256 of what the value is a function of: a text's digest of the text; its
    imports of the text, the module's name and the list of the library's module files (which
    names resolve to modules). The file is read once per process and, where this process added
    entries, merged with its current contents and replaced atomically at exit; a cache that
    cannot be read or written is ignored (everything is computed, as without it)."""

    def __init__(self) -> None:
        self.path = user_cache_dir() / f"fingerprints-py{sys.version_info[0]}{sys.version_info[1]}.json"
        self.entries: dict[str, object] | None = None
        self.added: dict[str, object] = {}

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str):
        if self.entries is None:
            self.entries = self._read()
        return self.entries.get(key)

    def put(self, key: str, value) -> None:
        if not self.added:
            atexit.register(self.save)
        self.entries[key] = self.added[key] = value

    def save(self) -> None:
        if not self.added:
            return
        merged = self._read()
        if len(merged) > 50_000:  # old texts pile up over many edits: start again
            merged = {}
        merged.update(self.added)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".fingerprints-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(merged, fh)
            os.replace(tmp, self.path)
        except OSError:
            pass
        self.added = {}


_MEMO = _DiskMemo()


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@lru_cache(maxsize=16)
def _module_files(root: str) -> str:
    """The library's module files under `root` (relative paths, one string): which names
    resolve to modules, what an import set depends on besides the text."""
    base = Path(root) / PACKAGE
    return "\n".join(sorted(str(p.relative_to(root)) for p in base.rglob("*.py")))


@_snapshotted("imports")
def _module_imports(root: Path, name: str | None, path: Path) -> _Imports:
    """`_imported_modules` of the file `path`, computed once per text of the file."""
    return _imports_of_text(str(root), name, _text(path), str(path))


@lru_cache(maxsize=4096)
def _imports_of_text(root: str, name: str | None, text: str, filename: str) -> _Imports:
    key = "imports2:" + _key(root, _module_files(root), name or "", text)
    hit = _MEMO.get(key)
    if hit is not None:
        return _Imports(*(frozenset(v) for v in hit))
    got = _imported_modules(Path(root), name, _parse_text(text, filename))
    _MEMO.put(key, [sorted(got.named), sorted(got.parents), sorted(got.lazy)])
    return got


def _imported_modules(root: Path, name: str | None, tree: ast.Module) -> _Imports:
    """`oattn_lib` modules imported anywhere in `tree` (of module `name`, None for a script)."""
    package = None
    if name is not None:
        package = name if _is_package(root, name) else name.rpartition(".")[0]
    named: set[str] = set()
    lazy: set[str] = set()
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            # `import a.b.c` binds `a`: every package on the way is reachable by attribute
            for a in node.names:
                if a.name.split(".")[0] == PACKAGE:
                    parts = a.name.split(".")
                    named.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    continue
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != PACKAGE:
                continue
            subs = {f"{mod}.{a.name}" for a in node.names if _module_file(root, f"{mod}.{a.name}") is not None}
            named.update(subs)  # `from oattn_lib import store` names a module
            if any(f"{mod}.{a.name}" not in subs and a.name not in PROVENANCE for a in node.names):
                # and any other name is an attribute of `mod`
                named.add(mod)
            else:
                imported.add(mod)
        elif (isinstance(node, ast.Call) and package is not None
              and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"):
            # importlib: the static graph cannot see which module of the package it loads
            named.update(_package_modules(root, package))
        elif (isinstance(node, ast.Call) and package is not None
              and isinstance(node.func, ast.Name) and node.func.id == "lazy_exports"):
            # a lazy package (oattn_lib._lazy.lazy_exports) may import any of its modules
            lazy.update(_package_modules(root, package))
    # importing a submodule runs every parent package's __init__
    parents = set(imported)
    for mod in named | imported:
        parts = mod.split(".")
        parents.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def existing(mods):
        return frozenset(m for m in mods if _module_file(root, m) is not None)

    return _Imports(existing(named), existing(parents - named), existing(lazy))


def _package_modules(root: Path, package: str) -> set[str]:
    pkg_dir = root.joinpath(*package.split("."))
    return {f"{package}.{p.stem}" for p in pkg_dir.glob("*.py") if p.stem != "__init__"}


def module_closure(script: str | os.PathLike, root: str | os.PathLike | None = None) -> list[str]:
    """Every `oattn_lib` module that `script` (a file) imports, transitively, sorted."""
    root = Path(root) if root is not None else library_root()
    imports = _module_imports(root, None, Path(script).resolve())
    return list(_closure(root, imports.named, imports.parents))


@_snapshotted("closure")
def _closure(root: Path, named, parents=()) -> tuple[str, ...]:
    """`named` and `parents` (as in `_Imports`) and what they import, transitively: a package
    reached only as a parent adds its code and its own imports, not its lazy exports."""
    todo = [(m, True) for m in named] + [(m, False) for m in parents]
    seen: set[str] = set()
    full: set[str] = set()
    while todo:
        mod, by_name = todo.pop()
        if mod in full or (mod in seen and not by_name):
            continue
        imports = _module_imports(root, mod, _module_file(root, mod))
        if mod not in seen:
            seen.add(mod)
            todo += [(m, True) for m in imports.named] + [(m, False) for m in imports.parents]
        if by_name:
            full.add(mod)
            todo += [(m, True) for m in imports.lazy]
    return tuple(sorted(seen))


def _strip_provenance(tree: ast.Module) -> ast.Module:
    """`tree` without its module-level assignments of a `PROVENANCE` name to a string."""
    def provenance(node) -> bool:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        return (len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id in PROVENANCE
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str))

    tree.body = [node for node in tree.body if not provenance(node)] or [ast.Pass()]
    return tree


def _strip_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _code_digest(path: Path) -> str:
    return _digest_of_text(_text(path))


@lru_cache(maxsize=4096)
def _digest_of_text(text: str) -> str:
    key = "digest2:" + _key(text)
    hit = _MEMO.get(key)
    if hit is None:
        tree = _strip_provenance(_strip_docstrings(ast.parse(text)))
        hit = hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()
        _MEMO.put(key, hit)
    return hit


def declared_assets(path: str | os.PathLike) -> list[Path]:
    """The files the module or script `path` declares in its module-level `__assets__` (names
    relative to its directory), in the declared order; [] where it declares none."""
    path = Path(path)
    return [path.parent / name for name in _assets_of_text(path.read_text(encoding="utf-8"), str(path))]


@lru_cache(maxsize=4096)
def _assets_of_text(text: str, filename: str) -> tuple[str, ...]:
    if "__assets__" not in text:  # most modules: no second parse
        return ()
    for node in _parse_text(text, filename).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__assets__" for t in targets):
            try:
                names = ast.literal_eval(node.value)
            except ValueError:
                names = None
            if not (isinstance(names, (tuple, list)) and all(isinstance(n, str) for n in names)) \
                    or any(os.path.isabs(n) for n in names):
                raise ValueError(f"{filename}, line {node.lineno}: __assets__ must be a tuple of string literals, "
                                 "file names relative to the module's directory")
            return tuple(names)
    return ()


def _assets_digest(label: str, path: Path) -> str:
    """Lines naming each asset `path` declares and the SHA-256 of its bytes; "" for none."""
    out = []
    for name in _assets_of_text(_text(path), str(path)):
        asset = path.parent / name
        try:
            data = asset.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: declares the asset {name!r} in __assets__, but {asset} does not "
                                    "exist") from None
        out.append(f"\n{label}/{name}:{hashlib.sha256(data).hexdigest()}")
    return "".join(out)


def code_fingerprint(script: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """SHA-256 (hex, first 16 characters) of `script`'s code and of every library module it
    runs (`module_closure`), docstrings, comments and layout excluded, and of the bytes of the
    assets these declare (`declared_assets`)."""
    root = Path(root) if root is not None else library_root()
    h = hashlib.sha256(_code_digest(Path(script)).encode())
    h.update(_assets_digest("script", Path(script)).encode())
    for mod in module_closure(script, root):
        h.update(_module_digest(root, mod).encode())
    return h.hexdigest()[:16]


@_snapshotted("digest")
def _module_digest(root: Path, mod: str) -> str:
    path = _module_file(root, mod)
    return f"\n{mod}:{_code_digest(path)}" + _assets_digest(mod, path)


def modules_fingerprint(modules, root: str | os.PathLike | None = None) -> str:
    """Like `code_fingerprint`, for library modules (names such as "oattn_lib.emd") and every
    library module they import, without a script."""
    root = Path(root) if root is not None else library_root()
    h = hashlib.sha256()
    for mod in _closure(root, tuple(modules)):
        h.update(_module_digest(root, mod).encode())
    return h.hexdigest()[:16]


# -- the rules' `code` param -----------------------------------------------------------------
class SnakemakeInternalsError(RuntimeError):
    """The installed Snakemake lacks, or has changed, an internal that `code_version` reads."""


def _snakemake_version() -> str:
    try:
        from snakemake import __version__
        return __version__
    except ImportError:
        return "(unknown version)"


def _signature(func) -> list[str] | None:
    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None


def snakemake_internals_problems() -> list[str]:
    """What `code_version` reads of the installed Snakemake and finds missing or changed, one
    sentence each; [] when everything is as it expects (Snakemake 9):

    - `snakemake.settings.types.RerunTrigger.CODE`, and `DAGSettings().rerun_triggers`: a set of
      `RerunTrigger`, holding CODE by default (a user turns the code trigger off with
      `--rerun-triggers mtime params input`);
    - `Workflow.dag_settings`: a dataclass field, None until the DAG is built, then the run's
      `DAGSettings`;
    - `Workflow.get_rule(name)`, `Rule.output` (a property) and `_IOFile.apply_wildcards(wildcards)`:
      the path of a job's first output;
    - `Workflow.modifier` (a property) and `WorkflowModifier.modify_rulename(name)`: the name a rule
      is registered under, which a module's `use rule * from oattn as oattn_*` prefixes;
    - `Workflow.persistence` (a property) and `Persistence.params(path)`: the params recorded with an
      output, a list holding each param's value as its `repr` (`Persistence._serialize_param`).
      The class is `snakemake.persistence.Persistence` up to Snakemake 9.16 and the base of its
      file and database back-ends, `snakemake.persistence.PersistenceBase`, from 9.17 on.
    """
    try:
        import snakemake.api  # noqa: F401  first: importing snakemake.workflow first is circular
        import snakemake.persistence
        from snakemake.io import _IOFile
        from snakemake.modules import WorkflowModifier
        from snakemake.rules import Rule
        from snakemake.settings.types import DAGSettings, RerunTrigger
        from snakemake.workflow import Workflow
    except ImportError as exc:
        return [f"a module or name moved ({exc})"]
    Persistence = getattr(snakemake.persistence, "Persistence", None) or getattr(
        snakemake.persistence, "PersistenceBase", None)
    if Persistence is None:
        return ["a module or name moved (snakemake.persistence has neither Persistence nor PersistenceBase)"]
    problems = []
    if not isinstance(getattr(RerunTrigger, "CODE", None), RerunTrigger):
        problems.append("RerunTrigger has no member CODE")
    try:
        triggers = DAGSettings().rerun_triggers
    except Exception as exc:  # a new required setting or a renamed field
        problems.append(f"DAGSettings().rerun_triggers fails ({type(exc).__name__}: {exc})")
    else:
        if not (isinstance(triggers, AbstractSet) and triggers and all(isinstance(t, RerunTrigger) for t in triggers)):
            problems.append(f"DAGSettings().rerun_triggers is {triggers!r}, not a set of RerunTrigger")
        elif getattr(RerunTrigger, "CODE", None) not in triggers:
            problems.append(f"the default DAGSettings().rerun_triggers {sorted(t.name for t in triggers)} lack CODE")
    fields = {f.name: f for f in dataclasses.fields(Workflow)} if dataclasses.is_dataclass(Workflow) else {}
    if "dag_settings" not in fields:
        problems.append("Workflow has no dataclass field dag_settings")
    elif fields["dag_settings"].default is not None:
        problems.append(f"Workflow.dag_settings defaults to {fields['dag_settings'].default!r}, not None")
    if _signature(getattr(Workflow, "get_rule", None)) != ["self", "name"]:
        problems.append("Workflow.get_rule(name) is missing or takes other arguments")
    if not isinstance(inspect.getattr_static(Workflow, "modifier", None), property):
        problems.append("Workflow.modifier is not a property")
    if _signature(getattr(WorkflowModifier, "modify_rulename", None)) != ["self", "rulename"]:
        problems.append("WorkflowModifier.modify_rulename(rulename) is missing or takes other arguments")
    if not isinstance(inspect.getattr_static(Workflow, "persistence", None), property):
        problems.append("Workflow.persistence is not a property")
    if not isinstance(inspect.getattr_static(Rule, "output", None), property):
        problems.append("Rule.output is not a property")
    if _signature(getattr(_IOFile, "apply_wildcards", None)) != ["self", "wildcards"]:
        problems.append("_IOFile.apply_wildcards(wildcards) is missing or takes other arguments")
    if _signature(getattr(Persistence, "params", None)) != ["self", "path"]:
        problems.append("Persistence.params(path) is missing or takes other arguments")
    try:  # a method that does not use self, so it runs without a Persistence (which makes directories)
        recorded = Persistence._serialize_param_builtin(None, "stage:0123")
    except Exception as exc:
        problems.append(f"Persistence._serialize_param_builtin fails ({type(exc).__name__}: {exc})")
    else:
        if recorded != repr("stage:0123"):
            problems.append(f"Persistence records the param 'stage:0123' as {recorded!r}, not as its repr")
    return problems


_PARSE: tuple[weakref.ref, LibrarySnapshot] | None = None


def _parse_snapshot(workflow) -> LibrarySnapshot:
    """One `LibrarySnapshot` per Snakefile parse: every rule's `code_version` of the same
    `workflow` object reads the library's files once (the rules share most modules), and a new
    workflow (another parse, another process's run) reads them afresh."""
    global _PARSE
    if _PARSE is None or _PARSE[0]() is not workflow:
        try:
            _PARSE = (weakref.ref(workflow), LibrarySnapshot())
        except TypeError:  # an object without weak references: no snapshot shared
            return LibrarySnapshot()
    return _PARSE[1]


def code_version(workflow, rule_name: str, name: str, *, script: str | os.PathLike | None = None,
                 modules=None, root: str | os.PathLike | None = None):
    """The `code` param of the rule `rule_name`: a function of a job's wildcards giving
    "<name>:<fingerprint>", so that Snakemake's params trigger reruns exactly the jobs whose code
    changed (an edit of oattn_lib/questionnaire.py reruns organize and what follows, never
    training). The fingerprint is `code_fingerprint(script, root)`, or
    `modules_fingerprint(modules, root)` for a rule that runs library modules without a script,
    computed once, here, when the Snakefile is parsed.

    With Snakemake's code trigger off (`--rerun-triggers mtime params input`), a job's param is
    the value recorded with its first output, so a code edit reruns nothing.

    `workflow` is the Snakefile's `workflow`. What this reads of it and of Snakemake is listed by
    `snakemake_internals_problems`; where that is missing or changed, this raises
    SnakemakeInternalsError, here or when the DAG is built, never returning a wrong fingerprint.
    """
    if (script is None) == (modules is None):
        raise ValueError(f"code_version({rule_name!r}): give exactly one of script and modules")
    problems = snakemake_internals_problems()
    if problems:
        raise SnakemakeInternalsError(
            f"code_version({rule_name!r}) relies on Snakemake internals that Snakemake {_snakemake_version()} "
            f"changed: {'; '.join(problems)}. Adapt oattn_lib.fingerprint.code_version to this Snakemake.")
    from snakemake.settings.types import RerunTrigger

    with _parse_snapshot(workflow):
        fp = code_fingerprint(script, root) if modules is None else modules_fingerprint(modules, root)
    value = f"{name}:{fp}"
    prefix = repr(f"{name}:")[:-1]  # the start of the value's repr, as Snakemake records it

    def changed(what: str) -> SnakemakeInternalsError:
        return SnakemakeInternalsError(f"code_version({rule_name!r}): Snakemake {_snakemake_version()}'s {what}; "
                                       "adapt oattn_lib.fingerprint.code_version to this Snakemake")

    def get(obj, attr: str, where: str):
        try:
            return getattr(obj, attr)
        except AttributeError:
            raise changed(f"{where}.{attr} is missing") from None

    # the name the rule is registered under (a module's `use rule * from oattn as oattn_*` prefixes
    # it), known while the module's rules are parsed, not when the DAG is built
    registered = get(get(workflow, "modifier", "workflow"), "modify_rulename", "workflow.modifier")(rule_name)

    def version(wildcards) -> str:
        # the rerun triggers are known once the DAG is built, not while rules are parsed
        settings = get(workflow, "dag_settings", "workflow")
        if settings is None:
            return value
        triggers = get(settings, "rerun_triggers", "workflow.dag_settings")
        if not (isinstance(triggers, AbstractSet) and all(isinstance(t, RerunTrigger) for t in triggers)):
            raise changed(f"workflow.dag_settings.rerun_triggers is {triggers!r}, not a set of RerunTrigger")
        if RerunTrigger.CODE in triggers:
            return value
        output = get(get(workflow, "get_rule", "workflow")(registered), "output", f"workflow.get_rule({registered!r})")
        path = output[0].apply_wildcards(wildcards)
        persistence = get(workflow, "persistence", "workflow")
        if persistence is None:
            raise changed("workflow.persistence is None while the DAG is built")
        recorded = get(persistence, "params", "workflow.persistence")(path)
        if recorded is None:  # nothing recorded: the job runs anyway
            return value
        if not (isinstance(recorded, list) and all(isinstance(v, str) for v in recorded)):
            raise changed(f"workflow.persistence.params({str(path)!r}) is {recorded!r}, not a list of reprs")
        for text in recorded:
            if text.startswith(prefix):
                try:
                    old = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    old = None
                if not (isinstance(old, str) and old.startswith(f"{name}:")):
                    raise changed(f"recorded param {text!r} of {str(path)!r} is not the repr of a code param")
                return old
        return value

    return version
