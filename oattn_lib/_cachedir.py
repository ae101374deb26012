"""The user's cache directory for what the library keeps between processes (code fingerprints,
the stdlib corpus): `$OATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/oattn`, else `~/.cache/oattn`."""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    return Path(os.environ.get("OATTN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "oattn"))
