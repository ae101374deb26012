"""Stage `kernels`: the compiled CPU kernels (numba) built once into their disk cache, before the
jobs that run them.

numba compiles a kernel the first time it is called with a new signature and, with
`cache=True`, keeps the machine code on disk beside the module (`__pycache__`; the
user's cache directory when that is not writable), keyed by the source file, the
signature and the CPU. Without a step of its own, the first organize and decompose jobs
of a run each compiled the same kernels at once. `compile_kernels` runs the real organize
and decompose stages on a tiny synthetic sample, so every kernel is compiled with the
signatures the stages call it with; the jobs after it load them (each logs at exit how
many it loaded and compiled: `runtime.kernel_stats`). Outside the workflow the first call of
the Python API runs it (`kernel_notice`), and `python -m oattn_lib.stages.kernels` runs it
ahead, printing what it did. Warm-ups on one machine take turns (`cache_lock`): two runs, or
two workflows of a test session, started together on a fresh machine compile each kernel
once, the second loading what the first compiled.
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

from .. import emd, store, sweep, tree_kernels  # noqa: F401  (the kernel modules, runtime.KERNEL_MODULES)
from ..kernel_notice import cached_dispatchers, mark_checked, missing_kernels
from ..runtime import kernel_stats
from .decompose import decompose
from .organize import organize

log = logging.getLogger("oattn")

__all__ = ["kernels", "compile_kernels", "expected_kernels", "cache_lock"]

LOCK_NAME = "oattn-kernels.lock"
"""The lock file `cache_lock` takes, in numba's cache directory of the kernels."""


def expected_kernels() -> list[str]:
    """The names (`module.function`) of every cached numba kernel of the kernel modules."""
    return sorted(cached_dispatchers())


def _tiny_sample(path: Path, n: int = 12, n_layer: int = 2, n_head: int = 3, seed: int = 0) -> None:
    """An attention store of a causal model (scores, masked-softmax probs and the mask) with
    structure enough for every branch of the trees."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, n_layer, n_head, n, 4))
    scores = np.einsum("lhqd,lhkd->lhqk", q, k) - 0.2 * np.abs(np.arange(n)[:, None] - np.arange(n)[None])
    allowed = np.tril(np.ones((n, n), dtype=bool))
    z = np.where(allowed, scores, -np.inf)
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    dims = ("layer", "head", "query", "key")
    ds = xr.Dataset({"scores": (dims, scores.astype(np.float32)), "probs": (dims, probs.astype(np.float32)),
                     "allowed": (("layer", "query", "key"), np.broadcast_to(allowed, (n_layer, n, n)).copy())},
                    coords={"layer": np.arange(n_layer), "head": np.arange(n_head), "query": np.arange(n),
                            "key": np.arange(n), "token": ("query", np.arange(n))},
                    attrs={"model": "kernels", "kind": "txl", "sample": 0})
    store.write_store(ds, path / "zarr.json")


@contextlib.contextmanager
def cache_lock():
    """Hold an exclusive lock on the kernels' numba cache directory (its file `LOCK_NAME`) for
    the block, waiting for another process that holds it and saying so.

    numba writes each kernel's machine code to its cache without coordination: processes that
    compile the same kernel at once each pay the whole compilation. `compile_kernels` runs in
    this lock, so a second warm-up waits for the first and then loads every kernel from the
    cache. An advisory lock (`fcntl.flock`): released when its process ends, however it ends.
    Where there is no such lock (not POSIX) or the directory cannot be written, no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    where = missing_kernels()[1]
    try:
        os.makedirs(where, exist_ok=True)
        fd = os.open(os.path.join(where, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.perf_counter()
            log.info("kernels: another process is compiling into %s; waiting for it", where)
            fcntl.flock(fd, fcntl.LOCK_EX)
            log.info("kernels: waited %.1f s", time.perf_counter() - t0)
        yield
    finally:
        os.close(fd)  # releases the lock


def compile_kernels(workdir=None) -> dict:
    """Compile every numba kernel into numba's disk cache for this machine, as the first call of
    the Python API or a questionnaire would: done once, later calls and processes load them.

    Runs the organize and decompose stages on a tiny synthetic sample, so that every kernel is
    compiled with the signatures the stages call it with (a kernel already cached is loaded),
    holding `cache_lock`: a warm-up started while another runs waits for it, then loads.
    The workflow's rule `kernels`; in a notebook, `oattn_lib.stages.kernels.compile_kernels()`; from a shell,
    `python -m oattn_lib.stages.kernels`.

    Parameters
    ----------
    workdir : str or os.PathLike, optional
        Where the tiny sample's stores are written, then removed; default the system's
        temporary directory.

    Returns
    -------
    dict: `numba` (its version), `cpu` (the host CPU's name for LLVM), `machine`, `seconds`
    taken, and `kernels`: per kernel (`module.function`) the signatures `compiled` and
    `loaded` from the cache and the cache's directory `cache` (`runtime.kernel_stats`).

    Raises
    ------
    RuntimeError
        Where the warm-up did not run some kernel of `expected_kernels()`.
    """
    import numba

    mark_checked()  # the entry points it runs would announce the compiling this reports
    t0 = time.perf_counter()
    with cache_lock(), tempfile.TemporaryDirectory(dir=workdir, prefix="oattn-kernels-") as tmp:
        root = Path(tmp)
        att = root / "attention.zarr" / "zarr.json"
        _tiny_sample(att.parent, n=40)  # rows in several tiles of the L1 kernel (emd._L1Sum)
        for quantity in ("scores", "probs"):
            org, dec = root / f"organized-{quantity}.zarr" / "zarr.json", root / f"decomposed-{quantity}.zarr" / "zarr.json"
            organize(att, org, quantity, params={"n_iters": 1})
            decompose(att, org, dec, quantity, figure_heads=[[0, 0], [-1, -1]], questionnaire2d_iters=1,
                      random_tree_seeds=1)
    stats = kernel_stats()
    missing = sorted(set(expected_kernels()) - {k for k, v in stats.items() if v["loaded"] + v["compiled"]})
    if missing:
        raise RuntimeError(f"kernels: {missing} were not run by the warm-up; extend stages.kernels.compile_kernels")
    report = {"numba": numba.__version__, "cpu": _host_cpu(), "machine": platform.machine(),
              "seconds": round(time.perf_counter() - t0, 2), "kernels": stats}
    log.info("kernels: %d compiled, %d loaded from the cache in %.1f s (%s)",
             sum(v["compiled"] for v in stats.values()), sum(v["loaded"] for v in stats.values()),
             report["seconds"], next(iter(stats.values()))["cache"])
    return report


def _host_cpu() -> str:
    import llvmlite.binding as llvm

    return llvm.get_host_cpu_name()


def kernels(out_json) -> None:
    """Compile every kernel (or find it in the cache) and record what was done in `out_json`."""
    store.save_json(out_json, compile_kernels())


def _summary(report: dict) -> str:
    kernels = report["kernels"].values()
    return (f"numba {report['numba']} on {report['cpu']} ({report['machine']}): "
            f"{sum(v['compiled'] for v in kernels)} kernel signatures compiled, "
            f"{sum(v['loaded'] for v in kernels)} loaded from the cache, in {report['seconds']:.1f} s; "
            f"cache: {next(iter(kernels))['cache']}")


if __name__ == "__main__":
    # `python -m oattn_lib.stages.kernels`: compile ahead what a notebook's first call would
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(_summary(compile_kernels()))
