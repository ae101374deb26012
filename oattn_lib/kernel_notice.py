"""The first call that compiles the numba kernels says so, and how long it took.

numba compiles each kernel of `runtime.KERNEL_MODULES` (emd, sweep, tree_kernels) the first
time it meets a new signature and keeps the machine code in its disk cache, per CPU: on a
fresh machine the first questionnaire pays a compilation that later calls and processes do
not. The workflow compiles them in a job of their own (rule `kernels`, `stages.kernels`). In a
notebook, the first call in a process of an entry point decorated with `announces_kernels`
(the questionnaires, the Python API) reads numba's cache index of each kernel, compiling
nothing. Where a kernel module has no machine code for this CPU in the cache (a fresh
machine or cache, another numba, a changed or reinstalled source file) it says, before the
work, that it compiles the kernels once per machine, where they are kept and how to do it
ahead (`python -m oattn_lib.stages.kernels`, or `oattn_lib.stages.kernels.compile_kernels()`); after the
work, how many signatures were compiled and the seconds the call took. A first call that
compiles without having said so (a kernel only some data reach, argument types the warm-up
does not cover) says so after it. The Python API passes `ahead`: where any kernel is missing
it compiles all of them first, with the signatures the stages use, so that its later calls
and processes compile nothing.

Where the lines go: the "oattn" logger at INFO when it has a handler in effect (a workflow
job, a notebook that configured logging); otherwise stderr, prefixed "oattn: ", because an
unconfigured logger drops INFO and a notebook's user would wait without a word. Later calls
in the process check nothing (a module-level flag): the cost after the first is one test.
"""
from __future__ import annotations

import functools
import logging
import sys
import time

from .runtime import KERNEL_MODULES, kernel_stats

log = logging.getLogger("oattn")

__all__ = ["announces_kernels", "missing_kernels", "cached_dispatchers", "mark_checked", "AHEAD"]

AHEAD = "python -m oattn_lib.stages.kernels"
_checked = False


def cached_dispatchers() -> dict:
    """{`module.function`: numba Dispatcher} of every kernel of `runtime.KERNEL_MODULES` that
    numba caches on disk (`cache=True`; the inlined helpers are not). Imports those modules."""
    from numba.core.dispatcher import Dispatcher

    # imported by name, not through importlib: the code fingerprint (oattn_lib.fingerprint) reads
    # an importlib call as an import of every module of the package
    from . import emd, sweep, tree_kernels  # noqa: F401  (runtime.KERNEL_MODULES)

    out = {}
    for name in KERNEL_MODULES:
        for attr, obj in vars(sys.modules[name]).items():
            if isinstance(obj, Dispatcher) and type(obj._cache).__name__ != "NullCache":
                out[f"{name.rsplit('.', 1)[-1]}.{attr}"] = obj
    return out


def missing_kernels() -> tuple[list[str], str]:
    """The kernels (`module.function`) with no machine code for this machine in numba's disk
    cache, and the cache's directory (beside the package, or under `NUMBA_CACHE_DIR`).

    A kernel is missing where its index file (`<function>-<line>.py<XY>.nbi`) is absent, written
    by another numba version, stale for its source file (numba's own checks, `_load_index`), or
    holds no entry for this CPU and this bytecode (the second and third parts of numba's index
    key: the codegen's magic tuple, the hashes of the function's code). Reads the index files;
    compiles nothing.
    """
    missing, where = [], ""
    for name, d in sorted(cached_dispatchers().items()):
        where = where or d._cache.cache_path
        try:
            here = d._cache._index_key(None, d.targetctx.codegen())[1:]
            cached = any(key[1:] == here for key in d._cache._cache_file._load_index())
        except Exception:  # an unreadable index: numba will compile
            cached = False
        if not cached:
            missing.append(name)
    return missing, where


def mark_checked() -> None:
    """Make this process's entry points skip the check: for the warm-up itself
    (`stages.kernels.compile_kernels`), which reports what it compiled."""
    global _checked
    _checked = True


def _say(message: str) -> None:
    if log.hasHandlers():
        log.info(message)
    else:
        print(f"oattn: {message}", file=sys.stderr, flush=True)


def _compiled() -> int:
    return sum(v["compiled"] for v in kernel_stats().values())


def announces_kernels(func=None, *, ahead=None):
    """Decorate an entry point that runs numba kernels: its first call in a process says
    whether it compiles them (see the module's docstring).

    Parameters
    ----------
    func : callable
        The entry point. Without it, returns the decorator (`@announces_kernels(ahead=...)`).
    ahead : callable, optional
        Called without arguments before `func` where kernels are missing: compiles all of them
        (the API passes `stages.kernels.compile_kernels`). Should it fail, its error is said and
        `func` compiles what it needs itself.
    """
    if func is None:
        return functools.partial(announces_kernels, ahead=ahead)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        global _checked
        if _checked:
            return func(*args, **kwargs)
        _checked = True  # nested entry points (the API's calls of the questionnaire) stay quiet
        missing, where = missing_kernels()
        names = cached_dispatchers()
        # a call compiles for sure where `ahead` will, or where a kernel module has nothing in the
        # cache (each questionnaire runs kernels of every module); a kernel that only some data
        # reach (emd's packing of zero columns) may stay missing for good: not announced before
        cached_modules = {n.split(".")[0] for n in names if n not in missing}
        announced = bool(missing) and (ahead is not None or cached_modules != {n.split(".")[0] for n in names})
        if announced:
            what = "all the kernels first" if ahead else f"the kernels {func.__name__} runs"
            _say(f"numba: compiling {what} for this CPU, once per machine ({len(missing)} of {len(names)} are "
                 f"not in the cache at {where}; later calls and processes load them). To compile all of them "
                 f"ahead: {AHEAD}")
        before, t0 = _compiled(), time.perf_counter()
        try:
            if announced and ahead is not None:
                try:
                    ahead()
                except Exception as e:  # the call itself still compiles what it needs
                    _say(f"numba: compiling ahead failed ({type(e).__name__}: {e}); {func.__name__} compiles "
                         f"what it runs")
            return func(*args, **kwargs)
        finally:
            compiled, seconds = _compiled() - before, time.perf_counter() - t0
            if announced:
                _say(f"numba: compiled {compiled} kernel signatures; {func.__name__} took {seconds:.1f} s with "
                     f"the compiling (later calls skip it)")
            elif compiled:
                _say(f"numba: {func.__name__} compiled {compiled} kernel signatures that were not in the cache "
                     f"at {where}, in {seconds:.1f} s with its work (later calls and processes load them; "
                     f"{AHEAD} compiles the workflow's ahead)")
    return wrapper
