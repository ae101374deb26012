"""Stage `theorem1`: Theorem 1 and Corollary 1 measured on every head (docs/method.md §7.7).

The temperature figure follows the figure heads; the claims need more than two heads. For each
of the first `samples` samples (by default every one), every stored head (or a random `max_heads` of them, drawn per
sample with `seed`, where a model has more) is organized by its own 2-D questionnaire (§5.3)
and its pre-softmax scores measured at the model's temperature in three kinds of order: the
2-D organized one, the original (the tokens' own order) and `random_orders` random ones. Each
row gives `smoothness.THEOREM1_MEASURES`: the relative residuals of the paraproduct (§7.3), of
uniform attention (the baseline a residual must beat), of the paper's Corollary 1 and of its Taylor
variant, each with and without the cross terms and divided by the exact row sums or by its own
(§7.5), and the Hölder-type exponents of the scores, of the softmax and of the paraproduct's
residual from their Haar coefficient decay (§7.7), all from one call per head and order. Causal
heads are compared with the model's own masked softmax (§7.5).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from .. import store
from ..questionnaire import questionnaire2d
from ..smoothness import THEOREM1_MEASURES, theorem1_measures
from ..temperature import residual_curve, temperature_grid
from ..network import head_array, model_mask, on_device

log = logging.getLogger("oattn")

__all__ = ["COLUMNS", "CURVE_COLUMNS", "chosen_heads", "theorem1"]

COLUMNS = ["sample", "layer", "head", "order", "seed", *THEOREM1_MEASURES]
"""The table's columns: `order` is "2-D organized", "original" or "random" (`seed` its index; -1 for
the other two), then the measures of `smoothness.THEOREM1_MEASURES`."""
CURVE_COLUMNS = ["sample", "layer", "head", "order", "seed", "tau", "residual"]
"""The curves' columns: each head's relative residual at every temperature of the grid, in every order
(the temperature figure's measure, docs/method.md §7.6, for every head)."""


def chosen_heads(layers, heads, max_heads: int, seed: int, sample: int) -> list[tuple[int, int]]:
    """The (layer, head) pairs measured in `sample`: all of them, or `max_heads` drawn without
    replacement by a generator seeded with (seed, sample), in (layer, head) order."""
    units = [(int(la), int(h)) for la in layers for h in heads]
    if len(units) <= max_heads:
        return units
    pick = np.random.default_rng([seed, sample]).choice(len(units), size=max_heads, replace=False)
    return [units[i] for i in sorted(pick)]


def theorem1(model_name: str, attention_stores: list, out_csv, *, samples: int | str = "all", max_heads: int,
             random_orders: int, seed: int, questionnaire2d_iters: int, crop=None, out_curves=None,
             temperature_taus: int = 17, device="cpu") -> None:
    """The Theorem 1 table of one model (module docstring) from its first `samples` attention
    stores (or all of them: "all"), written to `out_csv`, and with `out_curves` every measured head's residual against the
    logit temperature (`temperature.residual_curve` on `temperature.temperature_grid(temperature_taus)`,
    tau = 1 the model) in every order; a store without pre-softmax scores gives tables with no row
    (its reason in the log: the temperature figure records it for the claims). The questionnaires
    run on the device `device` resolves to (`runtime.resolve_device`)."""
    rows, curves = [], []
    taus = temperature_grid(temperature_taus)
    start = time.perf_counter()
    chosen = list(attention_stores) if samples == "all" else list(attention_stores)[: int(samples)]
    for s, path in enumerate(chosen):
        att = store.read_store(path, lazy=True)
        if "scores" not in att.variables:
            log.info("theorem1: %s holds no pre-softmax scores: nothing to measure", store.store_path(path))
            break
        units = chosen_heads(att["layer"].values, att["head"].values, max_heads, seed, s)
        for layer, head in units:
            g = head_array(att, "scores", layer, head, crop, where=path).astype(np.float64)
            allowed = model_mask(att, layer, head, g, crop)
            tr, tc = questionnaire2d(on_device(g, device), n_iters=questionnaire2d_iters)
            rng = np.random.default_rng([seed, s, layer, head])
            orders = [("2-D organized", -1, tr.order, tc.order), ("original", -1, None, None)]
            orders += [("random", k, rng.permutation(g.shape[0]), rng.permutation(g.shape[1]))
                       for k in range(random_orders)]
            for name, k, r, c in orders:
                vals, why = theorem1_measures(g, r, c, allowed)
                if why:  # beyond float64 (docs/method.md §7.4): those residuals recorded as +inf
                    log.info("theorem1: sample %d head %d.%d, %s order: %s", s, layer, head, name, why)
                rows.append(dict(zip(COLUMNS, (s, layer, head, name, k, *(float(v) for v in vals)))))
                if out_curves is not None:
                    curve = residual_curve(g, taus, r, c, allowed)
                    curves += [dict(zip(CURVE_COLUMNS, (s, layer, head, name, k, float(t), float(v))))
                               for t, v in zip(taus, curve)]
        log.info("theorem1: sample %d of %d, %d heads at %d x %d tokens, %.1f s in all", s + 1, len(chosen),
                 len(units), g.shape[0], g.shape[1], time.perf_counter() - start)
    df = pd.DataFrame(rows, columns=COLUMNS)
    store.atomic_write_text(out_csv, df.to_csv(index=False))
    if out_curves is not None:
        store.atomic_write_text(out_curves, pd.DataFrame(curves, columns=CURVE_COLUMNS).to_csv(index=False))
    if len(df):
        med = df.groupby("order")[["residual", "uniform_residual", "corollary1_residual", "taylor_residual",
                                   "alpha_scores", "alpha_softmax", "alpha_residual"]].median()
        log.info("theorem1 %s: medians by order\n%s", model_name, med.to_string())
