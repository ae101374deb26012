"""Stage `compare`: two models' analyses side by side (docs/method.md §15), from their heads tables
and Table 2: the head-by-head table, the per-sample measures, the figure and a page."""
from __future__ import annotations

import logging

import pandas as pd

from .. import store
from ..comparison import Comparison, head_changes, model_differences, side_from_files
from ..plots import save

log = logging.getLogger("oattn")

__all__ = ["compare"]

NOT_COMPARED = "not compared head by head: two models (compare[].heads)"


def compare(a: dict, b: dict, out_heads, out_models, out_figure, out_page, *, heads: bool, permutations: int,
            bootstrap: int, seed: int) -> None:
    """Compare the analyses `a` and `b`, each {"name", "rows", "summary", "table2"} (the model's name,
    its heads.parquet, heads_summary.parquet and tables/table2.csv), and write the head-by-head
    table (CSV; no rows, a note in the log, where `heads` is false), the per-sample measures (CSV),
    the figure (PNG) and the page (HTML)."""
    sa, sb = (side_from_files(s["name"], s["rows"], s["summary"], s["table2"]) for s in (a, b))
    kwargs = {"permutations": permutations, "bootstrap": bootstrap, "seed": seed}
    by_head = head_changes(sa, sb, **kwargs) if heads else None
    result = Comparison(sa, sb, by_head, model_differences(sa, sb, **kwargs))
    store.atomic_write_text(out_heads, (by_head if by_head is not None else pd.DataFrame(
        columns=["layer", "head", "verdict"])).to_csv(index=False))
    store.atomic_write_text(out_models, result.models.to_csv(index=False))
    save(result.figure(), out_figure)
    result.page(out_page)
    if by_head is None:
        log.info("%s vs %s: %s", sa.name, sb.name, NOT_COMPARED)
    else:
        log.info("%s vs %s: %d of %d heads changed rank", sa.name, sb.name, int(by_head["changed"].sum()),
                 len(by_head))
    for r in result.models.itertuples():
        log.info("%s: a %.4g, b %.4g, difference %.4g (%s)", r.measure, r.a, r.b, r.difference, r.verdict)
