"""The protocol every kind of model implements (`ModelKind`) and what its methods return
(`Sample`, `Extraction`, `Ablation` and the `HeldOut` examples it loads), and `Unsupported`.
The package's docstring describes the protocol; `oattn_lib.models.kinds` holds the registry."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the registry is read at the workflow's start-up, without torch
    import torch

__all__ = ["ModelKind", "Unsupported", "Sample", "Extraction", "Ablation", "HeldOut", "forward_layers"]


class Unsupported(ValueError):
    """A model was asked for what its kind cannot do; the message names the model (or the kind)."""


@dataclass(frozen=True)
class Sample:
    """One extraction input, ready to run through the model.

    tokens: (n_tokens,) the store's `token` coordinate; token_text: their text (None: none);
    attrs: attributes the kind adds to the store (vit: `label`); n_layers, n_heads: the
    model's, as known before `run` (0: unknown); run(on_layer) runs the model and calls
    on_layer(layer, scores, probs, allowed, n_kv_heads) for every attention layer in
    increasing order, scores and probs (head, query, key), allowed (query, key) bool or None,
    n_kv_heads None without grouped-query attention; it returns the model's number of layers.
    """

    tokens: Any
    token_text: list | None
    attrs: dict
    n_tokens: int
    n_layers: int
    n_heads: int
    run: Callable[[Callable], int] = field(repr=False)


def forward_layers(scores, probs, allowed=None) -> Callable[[Callable], int]:
    """`Sample.run` of a model that computed every layer in one forward pass: scores and probs
    (layer, head, query, key), allowed (query, key) bool or None, handed on one layer at a time."""
    def run(on_layer) -> int:
        for layer in range(probs.shape[0]):
            on_layer(layer, scores[layer], probs[layer], allowed, None)
        return probs.shape[0]

    return run


class Extraction(ABC):
    """A model loaded for extraction: `n_available` candidate inputs (described by `available`,
    for errors), its weights' hash `source_hash` (provenance) and `sample(i)`, candidate i."""

    n_available: int
    available: str
    source_hash: str

    @abstractmethod
    def sample(self, index: int) -> Sample:
        """Candidate `index` (0..n_available - 1) as a `Sample`."""


@dataclass(frozen=True)
class HeldOut:
    """Examples a metric is measured on (or a ranking's samples), as `Ablation` loads them.

    inputs: txl (n, tgt_len + 1) token windows (input = [:, :-1], targets = [:, 1:]); vit
    (n, channel, height, width) images; hf (n, tokens) input ids, right-padded where `mask`
    is given.
    targets: vit labels (n,); hf reference embeddings (n, hidden) of the unmasked model
    (evaluation) or projection vectors (gradients); None for txl.
    mask: hf (n, tokens) bool, True at the real tokens of examples of different lengths (the
    user's texts, docs/method.md §11.3); None: every token is real.
    """

    inputs: torch.Tensor
    targets: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    def rows(self, index, device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(inputs, mask) of the rows `index` on `device`."""
        return self.inputs[index].to(device), None if self.mask is None else self.mask[index].to(device)

    def __len__(self) -> int:
        return int(self.inputs.shape[0])


class Ablation(ABC):
    """A model loaded for the head-ablation study: `net` in eval mode and its `layout`
    (`models.gating.HeadLayout`)."""

    net: Any
    layout: Any

    @abstractmethod
    def ranking_samples(self, attention: list) -> tuple[HeldOut, Sequence[int]]:
        """(`HeldOut` of the extracted samples the rankings are computed on, their
        source ids), from the samples' attention stores (datasets without the attention)."""

    @abstractmethod
    def held_out(self, samples, used: Sequence[int], settings: dict, rng,
                 batch_size: int) -> tuple[HeldOut, Sequence[int]]:
        """(`HeldOut` the masked networks are measured on, its source ids): disjoint
        from `samples`, whose source ids are `used`. settings: the config's `prune.held_out`."""


class ModelKind(ABC):
    """What the workflow does with a model of one kind (see the module's docstring)."""

    name: ClassVar[str]
    trains: ClassVar[bool] = False
    extracts_with_weights: ClassVar[bool] = True
    prunes: ClassVar[bool] = False
    image_patches: ClassVar[bool] = False
    typical_quantity: ClassVar[str] = "probs"
    compute_dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    device_maps: ClassVar[bool] = False
    loads_gguf: ClassVar[bool] = False
    stacks: ClassVar[tuple[str, ...]] = ()
    origin: ClassVar[str] = "Pretrained, not trained here."

    def unsupported(self, what: str, model: str | None = None) -> Unsupported:
        """The error for a request this kind cannot serve: `what` it cannot do, for `model`."""
        who = f"model {model!r} (kind {self.name})" if model else f"kind {self.name!r}"
        return Unsupported(f"{who}: a {self.name} model cannot {what}")

    # -- the config and the rules (no torch) --------------------------------------------------
    @abstractmethod
    def n_tokens(self, model: dict) -> int | None:
        """Tokens per sample (query = key axis length, before `extract.crop`) when known
        before running the model and the same for every sample; None otherwise (samples of
        their own lengths: the user's prompts, attention files)."""

    @abstractmethod
    def n_units(self, model: dict) -> tuple[int, int] | None:
        """(layers, heads) of the model when known before running it."""

    def max_tokens(self, model: dict) -> int | None:
        """The most tokens a sample can have when known before running (the longest of samples of
        their own lengths; `extract.max_length` for the user's texts), for planning; None: unknown."""
        return self.n_tokens(model)

    def n_candidates(self, model: dict) -> int | None:
        """How many candidate samples the model's data holds, when known before running anything
        (the user's own texts, attention files); None when only the extract job can count them.
        `extract.n_samples: all` takes this number."""
        return None

    def candidates_params(self, model: dict) -> dict:
        """What of `model`, besides its `data` section, decides the candidates `count_candidates`
        counts (prepare_data's params: changing it prepares the data again); {} for most kinds."""
        return {}

    def count_candidates(self, model: dict, meta: dict) -> dict | None:
        """The candidate samples counted by prepare_data once its dataset is built, where only
        the data tells ({"count", "what", "source", ...}, recorded in its meta as `candidates`);
        None where `n_candidates` knows them before the run, or nothing is counted."""
        return None

    def extract_defaults(self, model: dict) -> dict | None:
        """The `extract` values that the inputs of an entry without an `extract` section decide
        (read from headers, never the arrays), which the schema cannot default; the schema fills in
        the rest. None where the kind needs the section given (the schema requires it); {} where the
        inputs cannot be read (`config_problem` then names the key at fault)."""
        return None

    def ordered_samples(self, model: dict) -> bool:
        """Whether sample i is candidate i (the first n_samples of the user's own inputs, in their
        order) rather than a seeded draw without replacement from the candidates."""
        return False

    def input_files(self, model: dict) -> list[str]:
        """The user's files the model's data (`prepare_data`) is read from (prompts): inputs of that
        rule, so that editing one reruns what depends on it."""
        return []

    def sample_files(self, model: dict, samples) -> list[str]:
        """The user's files the extraction of `samples` (sample indices) reads itself (attention
        files): inputs of their extract job, so that editing one file reruns the analysis of its
        own samples only."""
        return []

    def config_problem(self, model: dict, index: int) -> str | None:
        """What is wrong with the entry `model` (config `models[index]`) for this kind, as a
        message naming the key, or None. The base checks the capability flags: `compute_dtypes`
        (`extract.compute_dtype`), `device_maps` (`device_map`), `loads_gguf` (`gguf_file`) and
        `stacks` (`extract.stack`)."""
        where, ex = f"models[{index}]", model.get("extract") or {}
        if model.get("gguf_file") and not self.loads_gguf:
            return f"{where}.gguf_file: only hf models load GGUF files, {where} ({model['name']}) is {self.name}"
        dtype = ex.get("compute_dtype", "float32")
        if dtype not in self.compute_dtypes:
            return (f"{where}.extract.compute_dtype: {dtype!r}, but a {self.name} model computes in "
                    f"{', '.join(self.compute_dtypes)} only; allowed: {', '.join(self.compute_dtypes)}")
        if model.get("device_map") is not None and not self.device_maps:
            return f"{where}.device_map: only hf models are spread over devices; remove it ({self.name} model)"
        if ex.get("stack") is not None and ex["stack"] not in self.stacks:
            return (f"{where}.extract.stack: {ex['stack']!r} applies only to encoder-decoder hf models; "
                    f"remove it ({self.name} model)")
        return None

    def prune_problem(self, model: dict, index: int) -> str | None:
        """Why the head-ablation study cannot run for the entry `model` (config `models[index]`) of
        a kind that `prunes`, as a message naming the key; None when it can."""
        return None

    def datasets(self, model: dict) -> list[str]:
        """The downloaded datasets (`wikitext103`, `cifar10`) the model's data is built from."""
        return []

    def pretrained_weights(self, model: dict) -> str | None:
        """The weights file the model's training starts from (None: none)."""
        return None

    def prune_params(self, model: dict, prepared: str | None) -> dict:
        """What the prune stage reads of the entry: how to load the model and read its data.
        prepared: the directory prepare_model writes for the model (None: not prepared)."""
        return {"name": model["name"], "kind": model["kind"]}

    def retrain_problem(self, arch: dict) -> str | None:
        """Why the softmax-free experiment cannot retrain a model of `arch`, naming the key;
        None when it can."""
        return f"kind: {self.name!r} is not trained by the experiment (allowed: txl, vit)"

    def validation_metric(self) -> tuple[str, str]:
        """(metrics key, label) of the quality measure its training reports."""
        raise self.unsupported("be trained here, so it has no validation metric")

    # -- the stages ---------------------------------------------------------------------------
    @abstractmethod
    def prepare_data(self, data: dict, data_root) -> tuple[dict, dict]:
        """(arrays, meta) of the model's dataset from its `data` config slice: the arrays the
        stage saves as npz and the JSON-able meta."""

    def build(self, arch: dict, data: dict, meta: dict, pretrained: bool = False):
        """An untrained network of `arch` (torch's global generator initialises it)."""
        raise self.unsupported("be built or trained by the workflow")

    def train(self, net, arrays: dict, meta: dict, data: dict, train: dict, device) -> tuple[dict, list]:
        """Train `net` as the workflow's `train` stage does: (metrics, loss history)."""
        raise self.unsupported("be trained by the workflow")

    def retrain(self, net, arrays: dict, meta: dict, data: dict, train: dict, *, seed: int, steps: int,
                device) -> tuple[dict, float, int, list]:
        """Train `net` as one softmax-free run: (metrics, the validation metric's value, optimizer
        steps, loss history)."""
        raise self.unsupported("be trained by the softmax-free experiment")

    @abstractmethod
    def extraction(self, model: dict, *, data_npz, meta: dict, checkpoint, device, prepared=None) -> Extraction:
        """The model of entry `model` loaded on `device` for extraction. checkpoint: its trained
        weights (kinds that train); prepared: the directory prepare_model wrote (GGUF)."""

    def ablation(self, model: dict, *, data_npz, meta: dict, checkpoint, device) -> Ablation:
        """The model of entry `model` loaded on `device` for the head-ablation study."""
        raise self.unsupported("have its heads masked (prune)", model.get("name"))
