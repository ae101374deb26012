"""Process set-up shared by every stage: logging to the rule's log file, thread caps, device."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch

log = logging.getLogger("oattn")

__all__ = ["setup_logging", "resolve_device"]


def setup_logging(log_path: str | os.PathLike | None, threads: int | None = None) -> logging.Logger:
    """Log to `log_path` (and stderr); uncaught errors are logged before they propagate.

    `threads` (the rule's) caps torch's intra-op threads, so parallel jobs do not
    oversubscribe the cores.
    """
    if threads:
        torch.set_num_threads(int(threads))
        # numba's pool is sized when numba is imported (a stage module may already have
        # done so); changing NUMBA_NUM_THREADS afterwards is an error, so cap it at run time
        import numba

        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
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
    return log


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' requested in the config but no CUDA device is visible")
    return torch.device(name)
