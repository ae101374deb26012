"""Stage `prepare_data`: a model's dataset (token-id splits and vocabulary, images, or held-out texts)."""
from __future__ import annotations

import logging

from ..config import canonical
from ..models import adapter_for
from ..store import save_json, save_npz

log = logging.getLogger("oattn")

__all__ = ["prepare_data"]


def prepare_data(kind: str, data: dict, out_npz, out_meta, data_root="resources", *, model: dict | None = None,
                 n_samples: int | None = None, where: str | None = None) -> None:
    """Build a model's dataset: token-id splits and vocabulary, images, or held-out texts, as
    the adapter of `kind` (`models.kinds`) makes it from the `data` config slice.

    With the `model` config entry, the candidate samples only the data can tell (a corpus'
    texts long enough for the model's tokenizer: `ModelKind.count_candidates`) are counted
    once and recorded in the meta as `candidates`; `n_samples` more than them is a ValueError
    naming the key (`where`: the model's place in the config, "models[i] (name)"), before anything
    is written and before any extract job runs."""
    adapter = adapter_for(kind)
    arrays, meta = adapter.prepare_data(data, data_root)
    if model is not None:
        counted = adapter.count_candidates(model, meta)
        if counted is not None:
            # for the start-up check of later runs (config.counted_candidates): the data it counts in
            meta["candidates"] = {**counted, "data": canonical(data)}
            log.info("%d candidate samples: %s", counted["count"], counted["what"])
            if n_samples is not None and n_samples > counted["count"]:
                raise ValueError(f"{where or 'models (' + model['name'] + ')'}.extract.n_samples: {n_samples} samples "
                                 "requested but only "
                                 f"{counted['count']} {counted['what']}; allowed: 1..{counted['count']}, or a "
                                 "shorter extract.max_length")
    save_npz(out_npz, **arrays)
    save_json(out_meta, meta)
