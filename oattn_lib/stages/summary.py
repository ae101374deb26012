"""Stage `summary`: one Markdown page of every model's training metrics and tables."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .. import store

log = logging.getLogger("oattn")

__all__ = ["summary"]


def summary(metrics: dict, table_paths: dict, out_md) -> None:
    """One Markdown page: training metrics and every model's tables."""
    lines = ["# oattn results\n"]
    for name, path in metrics.items():
        m = json.loads(Path(path).read_text()) if path else {}
        shown = {k: v for k, v in m.items() if k not in ("history",)}
        lines.append(f"## {name}\n\n" + ("Training: " + ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                                                                 for k, v in shown.items()) + "\n" if shown else
                                         "Pretrained, not trained here.\n"))
        for label, p in table_paths[name].items():
            lines.append(f"### {label}\n\n{Path(p).read_text()}\n")
    store.atomic_write_text(out_md, "\n".join(lines))
