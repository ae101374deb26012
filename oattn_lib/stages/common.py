"""What the stages share besides the library: running a stage's function on each sample of a
batched job. The network tensor and the model's mask the stages read are `oattn_lib.network`'s."""
from __future__ import annotations

import logging

log = logging.getLogger("oattn")

__all__ = ["each_sample"]


def each_sample(stage: str, inputs: dict[str, list], outs: list, run) -> None:
    """`run(*the sample's inputs, its output)` on each sample in turn (one job for all samples of a
    small model: the job's start-up is paid once); `inputs`: {what: one path per sample}. A
    count that differs is an error naming the stage and every count."""
    if any(len(v) != len(outs) for v in inputs.values()):
        counts = ", ".join(f"{len(v)} {what}" for what, v in inputs.items())
        raise ValueError(f"{stage}: {counts} and {len(outs)} outputs; expected one of each per sample")
    for i, paths in enumerate(zip(*inputs.values(), outs)):
        if len(outs) > 1:
            log.info("sample %d of %d: %s", i + 1, len(outs), paths[0])
        run(*paths)
