"""Stage `masked_other`: a model's 3-D organization, Haar expansions and entropies under the other
rule for the scores' masked entries (docs/method.md §9.5), beside its main analysis, so that every
claim measured on the expansions gives its verdict under both rules.

It runs the organize, decompose and entropy stages themselves, sample after sample, with only
the rule changed: the stores it writes are theirs, read by the same readers."""
from __future__ import annotations

import logging

from .. import store
from ..network import MASKED, allowed_mask
from .decompose import decompose_samples
from .entropy import entropy
from .organize import organize_samples

log = logging.getLogger("oattn")

__all__ = ["masked_other", "masked_entries"]


def masked_entries(attention_store, crop=None) -> int:
    """The entries of a sample's network tensor (query x key x stored heads, cropped like it) that
    the model masks (`network.allowed_mask`: the store's `allowed`, or its probabilities' exact
    zeros); 0 for a store that holds neither (scores alone)."""
    att = store.read_store(attention_store, lazy=True)
    if "allowed" not in att.variables and "probs" not in att.variables:
        return 0
    masked = ~allowed_mask(att, None, crop)
    # a mask per layer (layer, query, key), or one for every layer (query, key)
    per_mask = att.sizes["head"] * (att.sizes["layer"] if masked.ndim == 2 else 1)
    return int(masked.sum()) * per_mask


def masked_other(attention_stores: list, organized_stores: list, decomposed_stores: list, entropy_store, *,
                 analysis: dict, organize_params: dict, decompose_params: dict, entropy_params: dict,
                 code: str | None = None, device="cpu") -> None:
    """Organize, decompose and take the entropies of every sample of a model under the rule for
    masked entries `analysis["masked"]` (docs/method.md §9.5): the stages `organize`, `decompose`
    and `entropy` with that rule, into stores of their own.

    Parameters
    ----------
    attention_stores : list of paths
        The model's attention stores, one per sample.
    organized_stores, decomposed_stores : list of paths
        The organized and decomposed stores written, one per sample (docs/method.md §12.1).
    entropy_store : path
        The entropy store written: the main one's variables (`stages.entropy.entropy`).
    analysis : dict
        `quantity` (must be "scores": probabilities are 0 at masked entries whatever the rule),
        `crop` (None or (start, stop)) and `masked`, the rule (`network.MASKED`).
    organize_params : dict
        The config's `organize` section (`questionnaire.questionnaire3d`'s keyword arguments).
    decompose_params : dict
        The config's `decompose` section (`stages.decompose.decompose`'s keyword arguments).
    entropy_params : dict
        `head_top_k` and `network_top_k` (the config's `entropy` section's).
    code : str, optional
        The rule's code fingerprint, recorded in every store (docs/method.md §12.3).
    device : str
        Where the engine runs (`runtime.resolve_device`).

    Raises
    ------
    ValueError
        `analysis["quantity"]` other than "scores", `analysis["masked"]` not a rule of
        `network.MASKED`, or lists of stores of unequal lengths (naming every count).

    Notes
    -----
    A model whose stores hold no masked entry (an encoder's scores) gets stores equal to its main
    analysis's, which the log says: the rule has nothing to change.
    """
    quantity, crop, masked = analysis["quantity"], analysis.get("crop"), analysis["masked"]
    if quantity != "scores":
        raise ValueError(f"extract.quantity: {quantity!r}; the rule for masked entries changes the analysis of "
                         "'scores' only (probabilities are 0 there whatever it says)")
    if masked not in MASKED:
        raise ValueError(f"extract.masked: {masked!r}; allowed: {', '.join(MASKED)}")
    counts = {len(attention_stores), len(organized_stores), len(decomposed_stores)}
    if len(counts) != 1:
        raise ValueError(f"masked_other: {len(attention_stores)} attention stores, {len(organized_stores)} organized "
                         f"and {len(decomposed_stores)} decomposed stores; expected one of each per sample")
    entries = [masked_entries(path, crop) for path in attention_stores]
    if not any(entries):
        log.info("masked_other: no sample has a masked entry: the rule %r changes nothing, and the stores equal "
                 "the main analysis's", masked)
    else:
        log.info("masked_other: masked entries per sample %s, analysed under the rule %r", entries, masked)
    organize_samples(attention_stores, organized_stores, quantity, crop, params=organize_params,
                     config_slice={**analysis, "organize": organize_params}, code=code, device=device, masked=masked)
    decompose_samples(attention_stores, organized_stores, decomposed_stores, quantity, crop,
                      config_slice={**analysis, "decompose": decompose_params}, code=code, device=device,
                      masked=masked, **decompose_params)
    entropy(decomposed_stores, entropy_store, entropy_params["head_top_k"], entropy_params["network_top_k"],
            config_slice=dict(entropy_params), code=code)
