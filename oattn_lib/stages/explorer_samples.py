"""Stages `explorer_plan` and `explorer_samples`: a model's explorer page planned, then its
samples encoded by a few jobs (`jobs.explorer_jobs`, consecutive samples each: `plan.explorer_parts`), beside the rest of
the run (an LLM's prune); the page's job (`stages.explorer`) assembles them. For a model of one
job per sample; a small model's page job does all of it in one process
(`explorer.build.model_payload`, the same code).

The plan (JSON) and each part's encoded samples (gzipped JSON) are what the page embeds; neither
reads the page's script or style sheet, so editing those reruns the pages only.
"""
from __future__ import annotations

import gzip
import json
import logging

from .. import store
from ..explorer.build import encode_page_sample, page_plan

log = logging.getLogger("oattn")

__all__ = ["explorer_plan", "explorer_samples", "read_page_plan", "read_page_samples"]


def explorer_plan(model: str, attention_stores: list, organized_store, decomposed_store, entropy_store,
                  organized2d_store, out, *, quantity: str, crop=None, figure_heads, questionnaire2d_iters: int,
                  heads_2d: int, max_side: int, data_mb: float, max_samples: int | None = None) -> dict:
    """Write `out`, the plan of a model's page (`explorer.build.page_plan`): the heads shown in 2-D,
    the shown samples' lengths (the first `max_samples`, one attention store each) and the
    resolution, measured on sample 0."""
    pp = page_plan(attention_stores, organized_store, decomposed_store, entropy_store, quantity=quantity, crop=crop,
                   figure_heads=figure_heads, heads_2d=heads_2d, questionnaire2d_iters=questionnaire2d_iters,
                   max_side=max_side, data_bytes=int(data_mb * 1e6), organized2d_store=organized2d_store,
                   max_samples=max_samples)
    store.atomic_write_text(out, json.dumps(pp, indent=1))
    p = pp["plan"]
    log.info("explorer %s: planned %d of %d samples at %s, %d heads in 2-D, %.1f s", model, pp["n_samples"],
             pp["n_samples_total"], "full resolution" if p["full_mode"] else f"level of detail {p['side']}", len(pp["units_2d"]),
             pp["seconds"]["plan"])
    return pp


def read_page_plan(path) -> dict:
    """A plan `explorer_plan` wrote; ValueError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            pp = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not an explorer plan ({exc})") from None
    missing = {"n_samples", "layers", "heads", "lengths", "units_2d", "plan"} - set(pp if isinstance(pp, dict) else ())
    if missing:
        raise ValueError(f"{path}: not an explorer plan (no {sorted(missing)})")
    return pp


def explorer_samples(model: str, indices: list[int], plan_json, attention_stores: list, organized_stores: list,
                     decomposed_stores: list, organized2d_stores: list, out, *, quantity: str, crop=None) -> None:
    """Write `out`, the samples `indices` of a model's page (their stores in the same order) encoded at
    its plan's resolution, one after another (gzipped JSON: {"samples": [...]})."""
    pp = read_page_plan(plan_json)
    if not (len(indices) == len(attention_stores) == len(organized_stores) == len(decomposed_stores)
            == len(organized2d_stores) > 0):
        raise ValueError(f"{out}: samples {list(indices)} need one store of each kind each, got "
                         f"{len(attention_stores)}, {len(organized_stores)}, {len(decomposed_stores)}, "
                         f"{len(organized2d_stores)}")
    bad = [i for i in indices if not 0 <= i < pp["n_samples"]]
    if bad:
        raise ValueError(f"{plan_json}: plans {pp['n_samples']} samples, asked for samples {bad}")
    records = []
    for k, i in enumerate(indices):
        records.append(encode_page_sample(i, attention_stores[k], organized_stores[k], decomposed_stores[k], pp,
                                          quantity=quantity, crop=crop, organized2d_store=organized2d_stores[k]))
        log.info("explorer %s: sample %d encoded (%d of %d in this job), %.1f s", model, i, k + 1, len(indices),
                 records[-1]["seconds"]["total"])
    data = gzip.compress(json.dumps({"samples": records}, separators=(",", ":"), allow_nan=False).encode(),
                         mtime=0)
    with store.atomic_output(out) as tmp:
        tmp.write_bytes(data)
    log.info("explorer %s: %d samples, %.1f MB", model, len(records), len(data) / 1e6)


def read_page_samples(path) -> list[dict]:
    """The encoded samples `explorer_samples` wrote; ValueError naming the file when it is not one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rec = json.load(fh)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a part of an explorer page ({exc})") from None
    samples = rec.get("samples") if isinstance(rec, dict) else None
    if not isinstance(samples, list) or not all(isinstance(r, dict) and {"encoded", "info", "seconds"} <= set(r)
                                                for r in samples):
        raise ValueError(f"{path}: not a part of an explorer page (no list of encoded samples)")
    return samples
