"""Stage `softmax_free_paraproduct`: the paraproduct residual of every head of a softmax run of
the softmax-free experiment (`oattn_lib.softmax_free`; docs/method.md §7, §10.5)."""
from __future__ import annotations

import logging
import numpy as np
import xarray as xr

from .. import store
from ..paraproduct import paraproduct
from ..questionnaire import questionnaire2d
from ..network import model_mask

log = logging.getLogger("oattn")

__all__ = ["paraproduct_residuals"]


def paraproduct_residuals(attention_stores: list, out, questionnaire2d_iters: int,
                          config_slice: dict | None = None, code: str | None = None) -> None:
    """Relative residual of the paraproduct approximation (docs/method.md §7) of every head of every
    given sample, on its pre-softmax scores: organized by the 2-D questionnaire (docs/method.md §5.3;
    rel_residual) and unorganized (rel_residual_unorganized), dims (sample, layer, head).
    A causal head (TXL) is compared with the model's own masked softmax (`network.model_mask`),
    never a softmax over future positions."""
    rel, first = [], None
    for path in attention_stores:
        ds = store.read_store(path, require=("scores", "probs"), finite=("scores",))
        first = first or ds
        scores = ds["scores"]
        layers, heads = scores["layer"].values, scores["head"].values  # the model's indices of the stored
        r = np.empty((layers.size, heads.size, 2))
        for i, layer in enumerate(layers):
            for j, head in enumerate(heads):
                f = np.ascontiguousarray(scores.sel(layer=layer, head=head).values, dtype=np.float64)
                tr, tc = questionnaire2d(f.astype(np.float32), n_iters=questionnaire2d_iters)
                # a causal head is compared with the model's own masked softmax (docs/method.md §7.5)
                allowed = model_mask(ds, layer, head, f, None)
                r[i, j, 0] = paraproduct(f, row_order=tr.order, col_order=tc.order,
                                         allowed=allowed).relative_residual
                r[i, j, 1] = paraproduct(f, allowed=allowed).relative_residual
        rel.append(r)
        log.info("paraproduct residual, %s: organized median %.4f, unorganized median %.4f",
                 store.store_path(path).name, np.median(r[..., 0]), np.median(r[..., 1]))
    if not rel:
        raise ValueError("attention_stores: no samples to decompose")
    rel = np.stack(rel)
    dims = ("sample", "layer", "head")
    out_ds = xr.Dataset({"rel_residual": (dims, rel[..., 0]), "rel_residual_unorganized": (dims, rel[..., 1])},
                        coords={"sample": np.arange(rel.shape[0]), "layer": first["layer"].values,
                                "head": first["head"].values},
                        attrs={"model": first.attrs.get("model", ""),
                               **store.provenance_attrs(config_slice or {}, first.attrs.get("checkpoint_sha256"),
                                                        code=code, quantity="scores",
                                                        questionnaire2d_iters=questionnaire2d_iters)})
    store.write_store(out_ds, out)
