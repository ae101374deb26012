"""Stage `explorer`: the interactive explorer page of one model, and the index of the models' pages."""
from __future__ import annotations

import logging
import os

from .. import store
from ..plan import shown_samples
from ..explorer.build import assemble_payload, model_payload, table_payload
from ..explorer.page import read_meta, render_index, render_page, shown_note
from .explorer_samples import read_page_plan, read_page_samples

log = logging.getLogger("oattn")

__all__ = ["explorer", "explorer_index"]


def explorer(model: str, kind: str, attention_stores: list, organized_stores: list, decomposed_stores: list,
             entropy_store, table1_csv, table2_csv, out, *, quantity: str, crop=None, figure_heads,
             questionnaire2d_iters: int, heads_2d: int, max_side: int, data_mb: float,
             table3_csv=None, table4_csv=None, rankings_csv=None, stability_store=None, stability_csv=None,
             organized2d_stores: list | None = None, page_plan=None, page_samples: list | None = None,
             max_samples: int | None = None, masked: str = "row_mean") -> None:
    """Write `out`, the explorer page of one model: its samples, head grid, diffusion map of heads,
    the four views of the selected head and Tables 1-2 (3-4 where the prune stage ran; with the
    stability stage's store and table, each head's entropy range over the replicates and the
    spread of every measure).

    The page shows the first `max_samples` samples (all where None), one store of each kind
    given per shown sample; Tables 1-2 cover every sample. data_mb bounds the embedded data
    (before compression); plotly.js comes on top. The heads
    shown in 2-D have their organizations read from `organized2d_stores` (the organize2d stage's,
    one per sample), or made here where none are given (a notebook). With `page_plan` and
    `page_samples` (the files of stages.explorer_samples, for a model of one job per sample, in
    sample order) the samples come encoded already and the stores are not read. `masked`: the rule
    the analysis applied to the scores' masked entries, said on the page (the page draws them empty
    either way: docs/method.md §9.5)."""
    tables = [table_payload("Table 1: most frequent top and bottom heads by Haar entropy", table1_csv, "head",
                            "Click a row to select its head."),
              table_payload("Table 2: network entropy and sparsity per sample", table2_csv, "sample",
                            "Click a row to show its sample.")]
    if table3_csv is not None:
        tables.append(table_payload("Table 3: head ablation, area under each ranking's curve", table3_csv,
                                    "ranking", "Click a row to colour the head grid by that ranking's scores."))
    if table4_csv is not None:
        tables.append(table_payload("Table 4: stability of each ranking", table4_csv, "ranking",
                                    "Click a row to colour the head grid by that ranking's scores."))
    if stability_csv is not None:
        tables.append(table_payload("Stability: how far each measure moves under perturbations that carry no "
                                    "information (docs/method.md §14)", stability_csv, "none",
                                    "spread: |replicate - reference| / |reference|, median and max over heads, "
                                    "samples and replicates; agreement: Jaccard of the head sets, or the fraction "
                                    "of replicates that kept a tree."))
    if page_plan is not None:
        pp = read_page_plan(page_plan)
        if (pp["heads_2d"] != heads_2d or pp["questionnaire2d_iters"] != questionnaire2d_iters
                or pp["n_samples"] != shown_samples(pp.get("n_samples_total", pp["n_samples"]), max_samples)):
            raise ValueError(f"{page_plan}: planned for heads_2d={pp['heads_2d']}, questionnaire2d_iters="
                             f"{pp['questionnaire2d_iters']}, {pp['n_samples']} samples shown; the page is asked for "
                             f"{heads_2d}, {questionnaire2d_iters}, max_samples={max_samples}: the plan is stale, "
                             "delete it")
        payload = assemble_payload(model, kind, pp, [r for f in page_samples or [] for r in read_page_samples(f)], entropy_store,
                                   tables, rankings_csv, quantity=quantity, crop=crop,
                                   stability_store=stability_store)
    else:
        payload = model_payload(model, kind, attention_stores, organized_stores, decomposed_stores, entropy_store,
                                tables, rankings_csv, quantity=quantity, crop=crop, figure_heads=figure_heads,
                                heads_2d=heads_2d, questionnaire2d_iters=questionnaire2d_iters, max_side=max_side,
                                data_bytes=int(data_mb * 1e6), stability_store=stability_store,
                                organized2d_stores=organized2d_stores, max_samples=max_samples)
    payload["meta"]["masked"] = masked
    store.atomic_write_text(out, render_page(payload))
    size = os.path.getsize(out) / 1e6
    log.info("explorer %s: %s, %.2f MB (%s)", model, out, size,
             "full resolution" if payload["meta"]["plan"]["full_mode"]
             else f"level of detail {payload['meta']['plan']['side']}")


def explorer_index(pages: dict, out, note=None) -> None:
    """Write `out`, a page linking every model's explorer page (`pages`: {model: path}), and `note`
    (reST the report's caption includes): each page as measured, its size and resolution."""
    models = [{"model": name, "path": path, "meta": read_meta(path)} for name, path in pages.items()]
    store.atomic_write_text(out, render_index(models, out))
    if note is not None:
        lines = []
        for m in models:
            meta, plan = m["meta"], m["meta"]["plan"]
            res = (f"every head at full resolution ({meta['n_query']} x {meta['n_key']} tokens)" if plan["full_mode"]
                   else f"level of detail {plan['side']} x {plan['side']} of {meta['n_query']} x {meta['n_key']} tokens")
            lines.append(f"- {m['model']}: {os.path.getsize(m['path']) / 1e6:.1f} MB, {res}, "
                         f"{shown_note(meta)}, {len(meta['units_2d'])} of "
                         f"{meta['n_layer'] * meta['n_head']} heads organized in 2-D; built in "
                         f"{meta['build_seconds']['total']:.1f} s")
        store.atomic_write_text(note, "*Measured:*\n\n" + "\n".join(lines).replace("_", "\\_") + "\n")
