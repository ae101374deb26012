"""Stage `stability`: the replicate analyses of a model's samples (each written by its
`stability_sample` job, `stages.stability`) as one store, the bootstrap over all its samples,
and the table of how far each measure moves (docs/method.md §14). Reads small stores only: no
torch, no tensor of the network."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import xarray as xr

from .. import store
from ..stability import REFERENCE, bootstrap_samples, recurrence_interval, stability_summary

log = logging.getLogger("oattn")

__all__ = ["stability_tables", "tables_from_replicates", "read_replicates", "concat_samples", "check_samples"]


def concat_samples(per: list, samples) -> xr.Dataset:
    """`sample_replicates` of several samples as one Dataset over (sample, replicate, ...)."""
    ds = xr.concat(per, dim="sample", data_vars="all", coords="minimal", compat="override")
    return ds.assign_coords(sample=np.asarray(samples, dtype=np.int64))


def read_replicates(paths: list, samples) -> list:
    """The `stability_sample` stores `paths` (paths[i] of sample samples[i]), loaded; an error
    names a store written for another sample."""
    per = []
    for path, s in zip(paths, samples):
        ds = store.read_store(path, require=("network_entropy", "head_entropy"))
        if ds.attrs.get("sample") != int(s):
            raise ValueError(f"{store.store_path(path)}: replicates of sample {ds.attrs.get('sample')}, "
                             f"expected sample {s}")
        ds.attrs = {}
        per.append(ds)
    return per


def stability_tables(replicate_stores: list, entropy_store, out, out_csv, out_md, *, samples: list, settings: dict,
                     fraction: float = 0.1, model_name: str = "", config_slice: dict | None = None,
                     code: str | None = None) -> None:
    """Stage `stability`: the replicates of the model's samples `samples` (replicate_stores[i]:
    sample samples[i]'s `stability_sample` store), the bootstrap over all its samples (from the
    entropy store), written to the store `out`, and the summary table
    (`stability.stability_summary`) to `out_csv` / `out_md` (docs/method.md §14)."""
    if len(replicate_stores) != len(samples):
        raise ValueError(f"stability: {len(replicate_stores)} replicate stores for {len(samples)} samples; "
                         "expected one per sample")
    ent = check_samples(entropy_store, samples)  # before reading the replicates
    tables_from_replicates(read_replicates(replicate_stores, samples), ent, out, out_csv, out_md, samples=samples,
            settings=settings, fraction=fraction, model_name=model_name, config_slice=config_slice, code=code)


def check_samples(entropy_store, samples) -> xr.Dataset:
    """The entropy store, loaded; an error names a sample index the model does not have."""
    ent = store.read_store(entropy_store, require=("head_entropy",), finite=("head_entropy",))
    n_model = ent.sizes["sample"]
    bad = [s for s in samples if not 0 <= s < n_model]
    if bad:
        raise ValueError(f"stability.samples: samples {bad} of a model with {n_model} samples ({entropy_store})")
    return ent


def tables_from_replicates(per: list, ent: xr.Dataset, out, out_csv, out_md, *, samples, settings, fraction,
                           model_name, config_slice, code) -> None:
    """The samples' replicates `per` as one store with the bootstrap over every sample of the
    model (`ent`: its entropy store, as `check_samples` returns it), and the summary table."""
    n_model = ent.sizes["sample"]
    ds = concat_samples(per, samples)
    e_all = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(ent.sizes["sample"], -1)
    # the entropy store's (layer, head) grid flattened is the units' layer-major order
    boot = bootstrap_samples(e_all, fraction, settings["bootstrap"], settings["seed"])
    ds["bootstrap_recurrence"] = ("draw", boot["recurrence"])
    ds["bootstrap_bottom_count"] = (("draw", "unit"), boot["bottom_count"])
    ds["bootstrap_top_count"] = (("draw", "unit"), boot["top_count"])
    ds.attrs = {"model": model_name, **store.provenance_attrs(config_slice or {}, code=code, fraction=fraction,
                                                              n_model_samples=n_model)}
    store.write_store(ds, out)
    table = stability_summary(ds, fraction).assign(model=model_name)
    store.atomic_write_text(out_csv, table.to_csv(index=False))
    store.atomic_write_text(out_md, _summary_markdown(table, ds, settings))
    log.info("stability: %d samples x %d replicates; trees identical to the reference: %s", len(samples),
             ds.sizes["replicate"] - 1, ", ".join(f"{r.perturbation} {r.measure[-1]} {r.agreement:.0%}" for r in
                                                  table[table["measure"].str.startswith("same_tree")].itertuples()))


def _summary_markdown(table: pd.DataFrame, ds: xr.Dataset, settings: dict) -> str:
    show = table.drop(columns=["model"])
    lo, hi = recurrence_interval(ds)
    return (show.to_markdown(index=False, floatfmt=".3g")
            + f"\n\nReplicates per sample of samples {ds['sample'].values.tolist()}: "
            f"{', '.join(f'{p} {int((ds.perturbation.values == p).sum())}' for p in dict.fromkeys(ds.perturbation.values) if p != REFERENCE)}"
            f" (ulp: {settings['ulp_fraction']:g} of the nonzero entries moved by one float32 step). spread: "
            "|replicate - reference| / |reference| over samples, replicates (and heads); agreement: mean Jaccard "
            "index of the replicate's bottom / top set with the reference's, or the fraction of replicates whose "
            "tree has the reference's folders. Bootstrap over samples "
            f"({settings['bootstrap']} draws): bottom-set recurrence 95% interval {lo:.3g}–{hi:.3g}.\n")
