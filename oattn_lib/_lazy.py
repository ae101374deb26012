"""Lazy package exports (PEP 562): a package names what its submodules export, and each
name is imported on first use, so importing the package (or a light submodule of it) does
not import torch."""
from __future__ import annotations

from importlib import import_module

__all__ = ["lazy_exports"]


def lazy_exports(package: str, namespace: dict, exports: dict[str, tuple[str, ...]]):
    """`__all__`, `__getattr__` and `__dir__` for `package`, whose submodule `m` exports the
    names `exports[m]`; `namespace` is the package's globals(), where a loaded name is kept."""
    module_of = {name: module for module, names in exports.items() for name in names}
    names = list(module_of)

    def __getattr__(name: str):
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # the caller is the lazy package: the code fingerprint (oattn_lib.fingerprint) counts
        # every module of a package that calls lazy_exports, not of this one
        value = getattr(import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(names))

    return names, __getattr__, __dir__
