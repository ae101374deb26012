"""The docstrings of the engine, the stores and the API hold numpydoc's sections.

Every public function, class and method of the modules below (found by walking them: a name
without a leading underscore, defined in the module, and the public methods and properties of its
public classes) passes numpydoc's validation on the checks that pyproject.toml's
`[tool.numpydoc_validation]` enforces, the same ones `numpydoc lint oattn_lib/haar.py` runs: a
summary on one line, every parameter documented with its type and no parameter that does not
exist, a Returns (or Yields) section where something is returned. The API reference of the site
(docs/reference/api.md) is generated from these sections.

A dataclass documents its fields under Attributes, as a result type reads (a frozen
`Organization`, `Paraproduct`, ...): numpydoc's lint, which reads the source, sees no `__init__`
and so no parameters in one, while its validation by import sees the generated `__init__`'s. Here
a dataclass is held to its fields instead: each public field documented (PR01), and each
documented attribute a field or an attribute of the class (PR02).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import tomllib
from pathlib import Path

from numpydoc.docscrape import NumpyDocString, get_doc_object
from numpydoc.validate import get_validation_checks, validate

ROOT = Path(__file__).resolve().parents[1]
# the engine, the stores and the API (docs/development.md): one module per concept of the method
MODULES = ("questionnaire", "emd", "trees", "haar", "sweep", "entropy", "paraproduct", "tree_kernels",
           "diffusion", "smoothness", "clustering", "temperature", "store", "network",
           "api", "analysis", "comparison", "adapters", "heads")


def enforced_checks(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """The codes of `[tool.numpydoc_validation]` `checks`, as numpydoc's own lint reads them."""
    config = tomllib.loads(pyproject.read_text())["tool"]["numpydoc_validation"]
    return get_validation_checks(set(config["checks"]))


def public_objects(module) -> list[tuple[str, object]]:
    """(dotted name, object) of each public function and class defined in `module`, and of each
    public method and property of those classes, in the module's order."""
    members = (property, functools.cached_property)
    found = []
    for name, obj in vars(module).items():
        target = inspect.unwrap(obj) if callable(obj) else obj  # an lru_cache's function
        if (name.startswith("_") or not (inspect.isfunction(target) or inspect.isclass(target))
                or target.__module__ != module.__name__):
            continue
        found.append((f"{module.__name__}.{name}", target))
        if inspect.isclass(target):
            for attr, member in vars(target).items():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, members)):
                    found.append((f"{module.__name__}.{name}.{attr}", member))
    return found


def field_problems(cls) -> list[tuple[str, str]]:
    """(code, message) where a dataclass's Attributes (or Parameters) do not match its public fields."""
    doc = NumpyDocString(inspect.getdoc(cls) or "")
    documented = {n.strip() for section in ("Attributes", "Parameters") for names, _, _ in doc[section]
                  for n in names.split(",")}
    fields = {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
    out = []
    if fields - documented:
        out.append(("PR01", f"Fields {sorted(fields - documented)} not documented under Attributes"))
    unknown = sorted(n for n in documented - fields if not hasattr(cls, n))
    if unknown:
        out.append(("PR02", f"Unknown attributes {unknown}"))
    return out


def problems(module, checks: set[str]) -> list[str]:
    """'name: CODE message' for each enforced check that a public object of `module` fails."""
    out = []
    for name, obj in public_objects(module):
        errors = validate(get_doc_object(obj))["errors"]
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            errors = [e for e in errors if e[0] not in ("PR01", "PR02", "PR03")] + field_problems(obj)
        out += [f"{name}: {code} {message}" for code, message in errors if code in checks]
    return out


def test_every_public_object_of_the_engine_stores_and_api_passes_the_enforced_checks():
    checks = enforced_checks()
    modules = [importlib.import_module(f"oattn_lib.{m}") for m in MODULES]
    assert sum(len(public_objects(m)) for m in modules) > 100  # the walk found the library
    found = [p for m in modules for p in problems(m, checks)]
    assert not found, ("docstrings without numpydoc's sections (`numpydoc lint FILE`; the codes in "
                       "pyproject.toml's [tool.numpydoc_validation]):\n" + "\n".join(found))


def test_the_check_names_a_public_function_without_parameters_or_returns(tmp_path, monkeypatch):
    """The walk and the enforced codes catch what they are there for: a function whose
    parameters and return value are undocumented, a documented parameter that does not exist,
    a public function or method without a docstring, a dataclass field left out of Attributes
    and an attribute that is not there; private names and imported ones are not its concern."""
    (tmp_path / "undocumented_mod.py").write_text('''
from dataclasses import dataclass
from os.path import join


def scale(x, factor):
    """Scale x by factor."""
    return x * factor


def ghost(x):
    """Return x.

    Parameters
    ----------
    x : float
        The value.
    y : float
        Not a parameter.

    Returns
    -------
    float
        x itself.
    """
    return x


def bare():
    return 1


def _private(x):
    return x


class Thing:
    """A thing.

    Parameters
    ----------
    size : int
        Its size.
    """

    def __init__(self, size):
        self.size = size

    def grow(self, by):
        return self.size + by


@dataclass(frozen=True)
class Result:
    """A result.

    Attributes
    ----------
    value : float
        The value.
    spread : float
        Not a field.
    """

    value: float
    count: int
    _cache: object = None
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "undocumented_mod", raising=False)
    module = importlib.import_module("undocumented_mod")
    found = problems(module, enforced_checks())
    named = sorted((p.split(": ", 1)[0], p.split(": ", 1)[1].split()[0]) for p in found)
    assert named == [("undocumented_mod.Result", "PR01"), ("undocumented_mod.Result", "PR02"),
                     ("undocumented_mod.Thing.grow", "GL08"), ("undocumented_mod.bare", "GL08"),
                     ("undocumented_mod.ghost", "PR02"), ("undocumented_mod.scale", "PR01"),
                     ("undocumented_mod.scale", "RT01")], found
    assert "['count']" in " ".join(found) and "['spread']" in " ".join(found)
