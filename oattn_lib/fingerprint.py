"""Code fingerprints of the workflow's stages: which library code a stage runs, as one hash.

Snakemake sees a rule's script, never the library the script calls, so editing
`oattn_lib/questionnaire.py` would leave every organized store stale. A stage's
fingerprint hashes its script and every `oattn_lib` module the script imports, directly
or through other modules (imports anywhere in a module count, function-local ones
included), found statically with `ast`: nothing is imported, so it costs milliseconds at
DAG build time and never loads torch.

What is hashed is each module's syntax tree without docstrings (`ast.dump`, no line
numbers): editing a comment, a docstring or the layout changes nothing, editing code
does. Parent packages' `__init__` modules count (importing a submodule runs them). A
module that imports with `importlib` or declares lazy exports (a lazy package like
`oattn_lib.data`, through `oattn_lib._lazy.lazy_exports`) pulls in
every module of its package, since the static graph cannot see which it loads.

Every Snakemake invocation fingerprints each rule's script (about 20 of them, sharing most
modules), so a module's parse, digest and imports are computed once per process for its
text (an edited file is new text): a dry run spent 4 of its 5 s re-parsing the same modules.
"""
from __future__ import annotations

import ast
import hashlib
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["library_root", "module_closure", "code_fingerprint", "modules_fingerprint"]

PACKAGE = "oattn_lib"


def library_root() -> Path:
    """The directory holding the `oattn_lib` package."""
    return Path(__file__).resolve().parent.parent


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


def _module_imports(root: Path, name: str | None, path: Path) -> set[str]:
    """`_imported_modules` of the file `path`, computed once per text of the file."""
    return set(_imports_of_text(str(root), name, path.read_text(encoding="utf-8"), str(path)))


@lru_cache(maxsize=4096)
def _imports_of_text(root: str, name: str | None, text: str, filename: str) -> frozenset[str]:
    return frozenset(_imported_modules(Path(root), name, _parse_text(text, filename)))


def _imported_modules(root: Path, name: str | None, tree: ast.Module) -> set[str]:
    """`oattn_lib` modules imported anywhere in `tree` (of module `name`, None for a script)."""
    package = None
    if name is not None:
        package = name if _is_package(root, name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
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
            found.add(mod)
            for alias in node.names:  # `from oattn_lib import store` names a module
                if _module_file(root, f"{mod}.{alias.name}") is not None:
                    found.add(f"{mod}.{alias.name}")
        elif (isinstance(node, ast.Call) and package is not None
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "lazy_exports"))):
            # a lazy package (oattn_lib._lazy.lazy_exports) may import any of its modules
            found.update(_package_modules(root, package))
    # importing a submodule runs every parent package's __init__
    for mod in list(found):
        parts = mod.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return {m for m in found if _module_file(root, m) is not None}


def _package_modules(root: Path, package: str) -> set[str]:
    pkg_dir = root.joinpath(*package.split("."))
    return {f"{package}.{p.stem}" for p in pkg_dir.glob("*.py") if p.stem != "__init__"}


def module_closure(script: str | os.PathLike, root: str | os.PathLike | None = None) -> list[str]:
    """Every `oattn_lib` module that `script` (a file) imports, transitively, sorted."""
    root = Path(root) if root is not None else library_root()
    return _closure(root, _module_imports(root, None, Path(script).resolve()))


def _closure(root: Path, modules) -> list[str]:
    todo = list(modules)
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo.extend(_module_imports(root, mod, _module_file(root, mod)) - seen)
    return sorted(seen)


def _strip_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _code_digest(path: Path) -> str:
    return _digest_of_text(path.read_text(encoding="utf-8"))


@lru_cache(maxsize=4096)
def _digest_of_text(text: str) -> str:
    tree = _strip_docstrings(ast.parse(text))
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()


def code_fingerprint(script: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """SHA-256 (hex, first 16 characters) of `script`'s code and of every library module it
    runs (`module_closure`), docstrings, comments and layout excluded."""
    root = Path(root) if root is not None else library_root()
    h = hashlib.sha256(_code_digest(Path(script)).encode())
    for mod in module_closure(script, root):
        h.update(f"\n{mod}:{_code_digest(_module_file(root, mod))}".encode())
    return h.hexdigest()[:16]


def modules_fingerprint(modules, root: str | os.PathLike | None = None) -> str:
    """Like `code_fingerprint`, for library modules (names such as "oattn_lib.emd") and every
    library module they import, without a script."""
    root = Path(root) if root is not None else library_root()
    h = hashlib.sha256()
    for mod in _closure(root, modules):
        h.update(f"\n{mod}:{_code_digest(_module_file(root, mod))}".encode())
    return h.hexdigest()[:16]
