"""Process set-up shared by every stage: logging to the rule's log file, thread caps, device.

Nothing here imports torch or numba: a stage that does not compute with them (entropy,
tables, summary) starts without their import, the largest part of a job's start-up
(bench/startup.py measures each stage's).
"""
from __future__ import annotations

import atexit
import gc
import logging
import os
import re
import sys
import time
from pathlib import Path

log = logging.getLogger("oattn")

__all__ = ["setup_logging", "resolve_device", "startup_seconds", "cap_threads", "kernel_stats", "KERNEL_MODULES",
           "job_usage", "read_job_usage"]

# the imports that dominate a job's start-up, named in its log's first line
HEAVY_MODULES = ("torch", "numba", "transformers", "torchvision", "matplotlib", "plotly")
# environment variables that size the thread pools of libraries not yet imported
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


def startup_seconds() -> float:
    """Seconds since this process started (interpreter start, Snakemake's preamble, imports)."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


def cap_threads(threads: int) -> None:
    """Cap torch's intra-op threads and numba's threads at `threads`: directly where the library is
    imported, through its environment variables where it is not (yet)."""
    threads = max(1, int(threads))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if "numba" in sys.modules:
        # numba's pool is sized when numba is imported; changing NUMBA_NUM_THREADS afterwards
        # is an error, so cap it at run time
        numba = sys.modules["numba"]
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    for var in _THREAD_VARS:
        if var == "NUMBA_NUM_THREADS" and "numba" in sys.modules:
            continue
        if var == "OMP_NUM_THREADS" and "torch" in sys.modules:
            continue
        os.environ[var] = str(threads)


def setup_logging(log_path: str | os.PathLike | None, threads: int | None = None) -> logging.Logger:
    """Log to `log_path` (and stderr); uncaught errors are logged before they propagate.

    `threads` (the rule's) caps torch's and numba's threads (`cap_threads`), so parallel
    jobs do not oversubscribe the cores. The first line logged is the job's start-up time.
    """
    if threads:
        cap_threads(threads)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    logging.captureWarnings(True)
    previous = sys.excepthook

    def log_uncaught(exc_type, exc, tb):
        log.error("stage failed: %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))
        previous(exc_type, exc, tb)

    sys.excepthook = log_uncaught
    # once per process however often it is set up; atexit runs last-in first-out, so the usage
    # is the log's last line
    for at_exit in (_log_usage, _log_kernels):
        atexit.unregister(at_exit)
        atexit.register(at_exit)
    heavy = [m for m in HEAVY_MODULES if m in sys.modules]
    log.info("start-up %.2f s (interpreter, imports; loaded: %s)", startup_seconds(), ", ".join(heavy) or "none")
    return log


# the modules that define numba kernels (cache=True); rule `kernels` compiles them first
# (stages.kernels). Named, not imported: this module imports nothing of the library, so that
# no stage's code fingerprint depends on the engine through it.
KERNEL_MODULES = ("oattn_lib.emd", "oattn_lib.sweep", "oattn_lib.tree_kernels")


def kernel_stats() -> dict[str, dict]:
    """Per numba kernel of the kernel modules this process has loaded: the signatures it compiled
    (`compiled`) and loaded from numba's disk cache (`loaded`), and the cache's directory."""
    if "numba" not in sys.modules:
        return {}
    from numba.core.dispatcher import Dispatcher

    out = {}
    for mod_name in KERNEL_MODULES:
        mod = sys.modules.get(mod_name)
        for attr, obj in (vars(mod).items() if mod is not None else ()):
            if isinstance(obj, Dispatcher) and type(obj._cache).__name__ != "NullCache":
                s = obj.stats
                out[f"{mod_name.rsplit('.', 1)[-1]}.{attr}"] = {
                    "loaded": int(sum(s.cache_hits.values())), "compiled": int(sum(s.cache_misses.values())),
                    "cache": str(s.cache_path)}
    return out


def _log_kernels() -> None:
    """At exit: how many numba kernels the job loaded from the disk cache and how many it compiled
    (rule `kernels` compiles them first; a job compiling any means the cache missed)."""
    stats = kernel_stats().values()
    loaded, compiled = sum(s["loaded"] for s in stats), sum(s["compiled"] for s in stats)
    if loaded or compiled:
        log.info("numba kernels: %d loaded from the cache, %d compiled", loaded, compiled)


def job_usage() -> dict[str, float]:
    """What this process has used so far: `wall_s` since it started, `cpu_s` (user and system,
    every thread, and the children it waited for), and `peak_rss_mb`, its resident set's high-water
    mark (VmHWM; a child's peak where one was larger).

    Snakemake's `benchmark:` files sample a job every 0.5 s for its first 15 s and every 30 s
    after: a 40-second job's `cpu_time` stops at 15 s, and a peak between two samples is missed.
    These are the whole job's, read from the kernel's own accounting once the job is done.
    """
    import resource

    t = os.times()
    peak_kb = 0.0
    try:
        with open("/proc/self/status") as fh:
            # VmHWM, not ru_maxrss: the latter carries the parent's peak over the exec
            peak_kb = float(next(line for line in fh if line.startswith("VmHWM")).split()[1])
    except (OSError, StopIteration):
        peak_kb = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    peak_kb = max(peak_kb, float(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
    return {"wall_s": startup_seconds(), "cpu_s": t.user + t.system + t.children_user + t.children_system,
            "peak_rss_mb": peak_kb / 1024}


_USAGE = "resources used: wall {wall_s:.2f} s, CPU {cpu_s:.2f} s, peak RSS {peak_rss_mb:.1f} MB"
_USAGE_RE = re.compile(r" resources used: wall (?P<wall_s>[0-9.]+) s, CPU (?P<cpu_s>[0-9.]+) s, "
                       r"peak RSS (?P<peak_rss_mb>[0-9.]+) MB")


def _log_usage() -> None:
    """At exit: the job's `job_usage`, the last line of its log (read back by `read_job_usage`),
    and the heavy libraries (`HEAVY_MODULES`) the job had loaded by then: what its start-up line
    names and what it imported on the way.

    Then moves every object the garbage collector tracks to its permanent generation
    (`gc.freeze`): the interpreter's shutdown otherwise walks them all in its last collections,
    and a job that imported torch, numba and xarray holds enough of them for that walk to cost
    a good part of a small job's CPU, after its usage line. Nothing is left to run there: the job's stores are written and closed, its log
    flushed line by line, and the objects are freed with the process."""
    heavy = [m for m in HEAVY_MODULES if m in sys.modules]
    log.info(_USAGE.format(**job_usage()) + "; loaded: " + (", ".join(heavy) or "none"))
    gc.freeze()


def read_job_usage(log_path: str | os.PathLike) -> dict[str, float] | None:
    """The `job_usage` a job's log ends with (its last such line), or None where the log is
    missing or has none (a job killed before it exited, or a log older than this line)."""
    found = None
    try:
        with open(log_path, errors="replace") as fh:
            for line in fh:
                if " resources used: " in line:
                    m = _USAGE_RE.search(line)
                    found = {k: float(v) for k, v in m.groupdict().items()} if m else found
    except OSError:
        return None
    return found


def resolve_device(name: str = "auto"):
    """The torch device the config's `device` names: `auto` is CUDA when present, else the CPU."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' requested in the config but no CUDA device is visible")
    return torch.device(name)
