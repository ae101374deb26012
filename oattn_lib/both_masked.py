"""The two rules for the scores' masked entries, each with the other (docs/method.md §9.5).

Which models are analysed under both is planned by `plan.both_masked_models`; the analysis under
the second rule is the stage `stages.masked_other`'s."""
from __future__ import annotations

__all__ = ["OTHER_RULE", "other_rule"]

OTHER_RULE = {"row_mean": "keep", "keep": "row_mean"}
"""Each rule of `extract.masked` (`network.MASKED`) and the other one."""


def other_rule(rule: str) -> str:
    """The rule for masked entries that is not `rule` (`OTHER_RULE`); ValueError naming
    extract.masked and the allowed rules otherwise."""
    try:
        return OTHER_RULE[rule]
    except (KeyError, TypeError):
        raise ValueError(f"extract.masked: {rule!r}; allowed: {', '.join(OTHER_RULE)}") from None
