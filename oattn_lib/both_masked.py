"""Which models are analysed under both rules for the scores' masked entries (docs/method.md §9.5).

Planning: read from the completed config when the workflow starts (no torch, nothing loaded). The
analysis under the second rule is the stage `stages.masked_other`'s."""
from __future__ import annotations

from .config import batch_jobs

__all__ = ["OTHER_RULE", "other_rule", "both_masked_models", "masked_other_jobs"]

OTHER_RULE = {"row_mean": "keep", "keep": "row_mean"}
"""Each rule of `extract.masked` (`stages.common.MASKED`) and the other one."""


def other_rule(rule: str) -> str:
    """The rule for masked entries that is not `rule` (`OTHER_RULE`); ValueError naming
    extract.masked and the allowed rules otherwise."""
    try:
        return OTHER_RULE[rule]
    except (KeyError, TypeError):
        raise ValueError(f"extract.masked: {rule!r}; allowed: {', '.join(OTHER_RULE)}") from None


def both_masked_models(config: dict) -> dict[str, str]:
    """The config's models analysed under the other rule for masked entries too, as {model name:
    that rule}, where `claims.both_masked` is true ({} where it is false).

    Every model whose analysed quantity is `scores`: the rule is what decides how its masked
    entries enter the organization, the Haar expansions and the entropies (docs/method.md
    §9.5). Whether a model's attention has masked entries at all is known only from its
    attention stores (the project's Transformer-XL always has them, a decoder loaded through
    transformers has them, an encoder or a ViT has none), so such a model is planned too, and the
    stage finds no masked entry, says so in its log and writes stores equal to the main
    analysis's. A model analysing `probs` never: its masked entries are exactly 0 whatever the
    rule. The softmax-free runs are not the claims' models and are never planned.

    Parameters
    ----------
    config : dict
        The completed config (`config.validate_config`: schema defaults filled in).

    Returns
    -------
    dict of str to str
        Model name -> the rule of `OTHER_RULE` it is not analysed under by its main analysis, in
        the config's order.
    """
    if not config["claims"]["both_masked"]:
        return {}
    return {m["name"]: other_rule(m["extract"]["masked"]) for m in config["models"]
            if m["extract"]["quantity"] == "scores"}


def masked_other_jobs(samples_by_model: dict) -> list[tuple[str, str, list[int]]]:
    """The jobs of the analysis under the other rule: one per model, all its samples
    (`config.batch_jobs` with no cut), as `(suffix, model, samples)` for {model: sample indices}."""
    return batch_jobs(samples_by_model, max([len(list(v)) for v in samples_by_model.values()] or [1]))
