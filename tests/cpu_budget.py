"""pytest plugin: the suite's CPU time per test module, for the budget CI holds (bench/budget.py).

With OATTN_TEST_CPU_DIR set, every process that runs tests (an xdist worker, or pytest itself
with -n 0) measures the CPU time (user and system) of itself and of the child processes it
waited for (the Snakemake runs, the jobs' interpreters; the Snakemake commands that
tests/wfutil.py forks from its command server, which are not its children, as it reports them)
around each test's setup, call and teardown, adds it to the test's module, and at the end writes
`$OATTN_TEST_CPU_DIR/<worker>.json` = {"modules": {"tests/test_x.py": s, ...}, "total": s}, the
total being the process's whole CPU time: what it spent outside any test (the interpreter's
start-up, the imports of collecting every module, which each xdist worker does) is the part
`session:collection`.
The build of a session-scoped fixture (the shared workflow run) is counted under
`fixture:<name>`, not under whichever module happened to ask for it first (a session fixture
built inside another's body, by `request.getfixturevalue`, under its own name only). A session
fixture's teardown, at the end of the session, falls on the last test's module. Without the
variable the plugin does nothing. Each run needs an empty directory: every file in it is summed.
"""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

_DIR = os.environ.get("OATTN_TEST_CPU_DIR")
_modules: dict[str, float] = {}
_in_fixture = [0.0]  # CPU of session fixtures built during the current test
_building: list[float] = []  # per session fixture being built, outermost first: CPU counted inside it


def _cpu() -> float:
    """This process's CPU and its children's, with the Snakemake commands that tests/wfutil.py
    ran in processes forked from its command server (this process waited for them, but they are
    not its children) and without the commands it ran in the background (counted under their
    own part: `_background`)."""
    import sys

    wfutil = sys.modules.get("wfutil")
    if wfutil is None:
        return _usage()
    with wfutil.CPU_LOCK:
        return _usage() + wfutil.forked_cpu_unreaped() - sum(wfutil.BACKGROUND_CPU.values())


def _usage() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _background() -> dict[str, float]:
    import sys

    wfutil = sys.modules.get("wfutil")
    return dict(wfutil.BACKGROUND_CPU) if wfutil is not None else {}


if _DIR:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        _in_fixture[0] = 0.0
        t0 = _cpu()
        yield
        module = item.nodeid.split("::", 1)[0]
        _modules[module] = _modules.get(module, 0.0) + _cpu() - t0 - _in_fixture[0]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(fixturedef, request):
        if fixturedef.scope != "session":
            yield
            return
        t0 = _cpu()
        _building.append(0.0)
        yield
        inner = _building.pop()  # counted under the session fixtures built inside this one
        own = _cpu() - t0 - inner
        counted = inner
        if own >= 0.1:  # pytest's own session fixtures cost nothing to speak of
            key = f"fixture:{fixturedef.argname}"
            _modules[key] = _modules.get(key, 0.0) + own
            counted += own
        if _building:
            _building[-1] += counted
        else:
            _in_fixture[0] += counted

    def pytest_sessionfinish(session):
        if not _modules:  # the xdist controller runs no test
            return
        import sys

        if "wfutil" in sys.modules:  # its command server's own CPU, once it has ended
            sys.modules["wfutil"].stop_server()
        out = Path(_DIR)
        out.mkdir(parents=True, exist_ok=True)
        for part, s in _background().items():  # a background build's CPU, whenever it ended
            _modules[part] = _modules.get(part, 0.0) + s
        _modules["session:collection"] = _cpu() + sum(_background().values()) - sum(_modules.values())
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        path = out / f"{worker}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"modules": _modules, "total": sum(_modules.values())}, indent=1))
        tmp.replace(path)
