"""Shared test settings: offline Hugging Face, a non-interactive matplotlib, one torch thread.

Tiny models run faster on one thread than on two competing ones, and a test suite that
runs beside other work must not oversubscribe the cores.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# as the Snakefile sets it for every job: torch's idle OpenMP threads must not spin beside numba's
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

torch.set_num_threads(1)


from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# the suite's CPU time per test module, with OATTN_TEST_CPU_DIR set (bench/budget.py)
pytest_plugins = ["cpu_budget"]


def _shared_run_dir(config) -> Path:
    """Where the shared run is built: beside every xdist worker's temporary directory, else in
    this process's."""
    base = config._tmp_path_factory.getbasetemp()  # pytest's tmp_path_factory, before any fixture
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "clean_run_shared"


def _build_clean_run(shared: Path, background: bool) -> None:
    """Build the shared run in `shared` unless it is there: under a file lock that every process
    of the session takes, so that one builds it and the others wait for it."""
    import shutil

    from filelock import FileLock
    from wfutil import TINY, snakemake

    done = shared / ".complete"
    with FileLock(str(shared) + ".lock"):
        if done.exists():
            return
        if shared.exists():  # a build that failed in another process: start again
            shutil.rmtree(shared)
        shared.mkdir()
        # in the background, a subprocess whose CPU goes to fixture:clean_run whenever it ends
        # (the command server runs one command at a time: the tests' own must not wait behind it)
        snakemake(shared, TINY, background="fixture:clean_run" if background else None)
        done.touch()


class _Background:
    """The shared run, built by a thread of this process from the end of collection on, while
    the tests that do not read it run: the run's jobs leave a core idle at times, and collecting
    takes each worker a while."""
    thread = None
    error: BaseException | None = None

    @classmethod
    def start(cls, shared: Path) -> None:
        import threading

        def build():
            try:
                _build_clean_run(shared, background=True)
            except BaseException as exc:  # raised again by the fixture, in the test that asks
                cls.error = exc

        cls.thread = threading.Thread(target=build, name="clean_run", daemon=True)
        cls.thread.start()


def pytest_collection_finish(session):
    """Start the shared run's build once this process knows that one of its tests reads it."""
    if session.config.option.collectonly or not any("clean_run" in getattr(item, "fixturenames", ())
                                                    for item in session.items):
        return
    _Background.start(_shared_run_dir(session.config))


def pytest_sessionfinish(session):
    if _Background.thread is not None and _Background.thread.is_alive():
        from wfutil import stop_background

        stop_background()
        _Background.thread.join(timeout=60)


def pytest_collection_modifyitems(session, config, items):
    """Modules in the order they are handed to xdist's workers: those that do not read the shared
    run first, which run while it is being built, then those that do; in each, the costliest
    first (their CPU recorded in bench/budget.yaml), so that no long module is left to run alone
    at the end. The tests of a module keep their order. Every xdist worker collects the same
    items and orders them alike."""
    import yaml

    try:
        cost = yaml.safe_load((Path(__file__).parent.parent / "bench" / "budget.yaml").read_text())["test"]["parts"]
    except (OSError, KeyError, TypeError):
        cost = {}
    reads: dict[str, bool] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        reads[module] = reads.get(module, False) or "clean_run" in getattr(item, "fixturenames", ())
    order = {m: i for i, m in enumerate(reads)}
    items.sort(key=lambda item: (reads[m := item.nodeid.split("::", 1)[0]], -float(cost.get(m, 0.0)), order[m]))


@pytest.fixture(scope="session")
def clean_run(request, tmp_path_factory):
    """One uninterrupted run of the real workflow on the tiny test config, made once for the
    whole test session and copied into each process that asks for it.

    The build starts at the end of collection in a thread of every process that has a test
    reading it (`_Background`); with pytest-xdist every worker is such a process, and the first
    to take the file lock builds the run in a directory all workers share while the others wait
    for it. A test that asks for the run while it is being built waits for it. Every worker works
    on its own copy (results/ and Snakemake's .snakemake/ records, whose paths are relative), so
    that tests writing configs or reports into it never meet another process's."""
    import shutil

    shared = _shared_run_dir(request.config)
    if _Background.thread is not None:
        _Background.thread.join()
        if _Background.error is not None:
            raise _Background.error
    else:  # a run without the collection hook (a fixture asked for by name only)
        _build_clean_run(shared, background=False)
    workdir = tmp_path_factory.mktemp("oattn_workflow")
    shutil.copytree(shared / "results", workdir / "results", symlinks=True)
    shutil.copytree(shared / ".snakemake", workdir / ".snakemake", symlinks=True,
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    shutil.copy2(shared / "config.yaml", workdir / "config.yaml")
    return workdir


def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist (`make test` runs `-n 2`): every test module goes whole to one worker,
    so that its module fixtures (a model, a browser) are built once, in the order
    `pytest_collection_modifyitems` gives them; the modules that read the shared workflow run
    (`clean_run`) spread over the workers like any other."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist's default puts the modules with most tests first
    return LoadScopeScheduling(config, log)
