"""Stage `softmax_free_table`: Table 5 and Figure 8 of the softmax-free experiment from every
run's metrics and stores (`oattn_lib.softmax_free`)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from .. import plots, store
from ..softmax_free import table5_frame, table5_markdown

log = logging.getLogger("oattn")

__all__ = ["table5"]


def table5(runs: list[dict], out_csv, out_md, out_fig) -> None:
    """Table 5 (csv and Markdown) and Figure 8 from every run of the experiment.

    runs: dicts with model, kind, attention, seed, metrics (the run's metrics.json), entropy
    (its entropy store, written by the entropy stage) and paraproduct (a softmax run's
    residual store, or None). One table row per (model, attention), in the order the runs
    come. A diverged run's stores are not read (`softmax_free.table5_frame`).
    """
    loaded = []
    for r in runs:
        metrics = json.loads(Path(r["metrics"]).read_text())
        run = {**r, "metrics": metrics, "head_entropy": None, "head_sparsity": None, "paraproduct": None}
        if not metrics.get("diverged"):
            e = store.read_store(r["entropy"], require=("head_entropy", "head_sparsity"))
            run["head_entropy"], run["head_sparsity"] = e["head_entropy"].values, e["head_sparsity"].values
            if r.get("paraproduct"):
                p = store.read_store(r["paraproduct"], require=("rel_residual", "rel_residual_unorganized"))
                run["paraproduct"] = np.stack([p["rel_residual"].values.ravel(),
                                               p["rel_residual_unorganized"].values.ravel()], 1)
        loaded.append(run)
    df, dists = table5_frame(loaded)
    store.atomic_write_text(out_csv, df.to_csv(index=False))
    store.atomic_write_text(out_md, table5_markdown(df))
    plots.save(plots.fig8_softmax_free(dists), out_fig)
    log.info("Table 5: %d rows over %d runs", len(df), len(runs))
