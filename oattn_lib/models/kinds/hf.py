"""Kind `hf`: any pretrained transformers model (`models.hf`), loaded, never trained here.

Its samples are held-out texts of at least `extract.max_length` tokens, cut to that length
by its own tokenizer; its attention is recorded layer by layer from inside the forward pass.
The ablation measures a decoder by next-token perplexity through its language-model head
(objective `lm`) and an encoder by its sentence embeddings' similarity to its unmasked self,
on windows of held-out texts that were not extracted.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from .base import Ablation, Extraction, ModelKind, Sample

log = logging.getLogger("oattn")

__all__ = ["HF", "hf_hash", "extracted_texts", "held_out_windows"]


class HF(ModelKind):
    name = "hf"
    prunes = True

    def n_tokens(self, model: dict) -> int:
        return model["extract"]["max_length"]

    def n_units(self, model: dict) -> tuple[int, int] | None:
        """From the model's files (config.json or the GGUF header, `models.files.hf_layout`);
        None when they cannot be read here (a hub id)."""
        from ..files import hf_layout

        layout = hf_layout(str(model.get("path", "")), model.get("gguf_file"))
        return None if layout is None else (layout.n_layers, layout.n_heads)

    def config_problem(self, model: dict, index: int) -> str | None:
        from ..files import hf_path_problem

        problem = hf_path_problem(str(model.get("path", "")), model.get("gguf_file"))
        if not problem:
            return None
        key = "gguf_file" if model.get("gguf_file") and "gguf" in problem.lower() else "path"
        return (f"models[{index}].{key}: {problem}; allowed: a directory with a config.json, the alias "
                "'minilm' or 'smollm2', a directory holding gguf_file, or (online) a Hugging Face hub id")

    def datasets(self, model: dict) -> list[str]:
        return ["wikitext103"] if model.get("data", {}).get("corpus") == "wikitext103" else []

    def prune_params(self, model: dict, prepared: str | None) -> dict:
        # a GGUF model is loaded from the directory prepare_model wrote
        return {**super().prune_params(model, prepared), "path": prepared or model["path"]}

    def prepare_data(self, data: dict, data_root) -> tuple[dict, dict]:
        from ...data.text import text_dataset

        ids, vocab, docs = text_dataset(data, data_root)
        meta = {"kind": self.name, "vocab": list(vocab.itos), "sizes": {k: int(v.size) for k, v in ids.items()}}
        # not trained here: every document can be drawn as a sample or held out for the ablation
        # (enough of them are 1024 tokens long for an LLM's samples), read as raw text by the
        # model's own tokenizer
        meta["test_texts"] = docs if docs is not None else []
        log.info("text splits (tokens): %s; vocabulary %d", meta["sizes"], len(vocab))
        return ids, meta

    def extraction(self, model: dict, *, data_npz, meta: dict, checkpoint, device, prepared=None) -> Extraction:
        return _HFExtraction(model, meta, device, prepared)

    def ablation(self, model: dict, *, data_npz, meta: dict, checkpoint, device) -> Ablation:
        return _HFAblation(model, meta, device)


class _HFExtraction(Extraction):
    """Held-out texts with at least max_length tokens, the first max_length of each."""

    def __init__(self, model: dict, meta: dict, device, prepared):
        from ..hf import load_hf

        if prepared:
            prepared = Path(prepared).parent if Path(prepared).is_file() else Path(prepared)
        self.source = (str(prepared), None) if prepared else (model["path"], model.get("gguf_file"))
        self.net, self.tok = load_hf(self.source[0], device=device, gguf_file=self.source[1])
        self.max_len = max_len = model["extract"]["max_length"]
        # long enough texts only, so that every sample has exactly max_length tokens
        texts = [t for t in meta["test_texts"] if len(t) >= 4 * max_len]
        self.texts = [t for t in texts if len(self.tok(t, add_special_tokens=True)["input_ids"]) >= max_len]
        self.n_available = len(self.texts)
        self.available = f"held-out texts with >= {max_len} tokens"

    @property
    def source_hash(self) -> str:
        return hf_hash(*self.source)

    def sample(self, index: int) -> Sample:
        from ..hf import hf_attention_stream, hf_encode

        net, tok = self.net, self.tok
        inputs = hf_encode(net, tok, [self.texts[index]], max_length=self.max_len)
        ids = inputs["input_ids"][0].cpu().numpy()

        def run(on_layer) -> int:
            def each(call):
                on_layer(call.index, call.scores[0], call.probs[0], None if call.allowed is None else call.allowed[0],
                         call.n_kv_heads)

            return hf_attention_stream(net, inputs, each)

        return Sample(ids, tok.convert_ids_to_tokens(ids.tolist()), {}, ids.size,
                      int(getattr(net.config, "num_hidden_layers", 0) or 0),
                      int(getattr(net.config, "num_attention_heads", 0) or 0), run)


class _HFAblation(Ablation):
    def __init__(self, model: dict, meta: dict, device):
        """An hf model whose attention is causal is loaded again with its language-model head:
        a decoder is measured by what it is for, next-token perplexity (objective `lm`), not by
        its hidden states."""
        from ..gating import head_layout, register_gated_attention
        from ..hf import load_hf

        net, tok = load_hf(model["path"], device=device)
        net.set_attn_implementation(register_gated_attention())  # = the recording attention until gated
        layout = head_layout(net, "hf")
        if layout.causal:
            del net
            net, tok = load_hf(model["path"], device=device, causal_lm=True)
            net.set_attn_implementation(register_gated_attention())
            layout = head_layout(net, "hf")
            if layout.objective != "lm":
                raise ValueError(f"model {model['path']!r}: its attention is causal but it loads with no "
                                 "language-model head; its heads cannot be scored by perplexity")
        log.info("%s: %d layers x %d heads, measured as %s", model["name"], *layout.shape, layout.objective)
        self.net, self.tok, self.layout, self.texts = net, tok, layout, meta["test_texts"]

    def ranking_samples(self, attention: list):
        import torch

        from ...ablation import HeldOut

        ids = np.stack([a["token"].values for a in attention]).astype(np.int64)
        return HeldOut(torch.from_numpy(ids)), extracted_texts(self.tok, self.texts, ids, ids.shape[1])

    def held_out(self, samples, used, settings: dict, rng, batch_size: int):
        from ...ablation import HeldOut, reference_embeddings

        max_len = samples.inputs.shape[1]
        ids, sources = held_out_windows(self.tok, self.texts, used, max_len, settings["hf_windows"], rng)
        # a causal LM predicts its windows' next tokens; an encoder is compared with its unmasked self
        reference = None if self.layout.objective == "lm" else reference_embeddings(self.net, self.layout, ids,
                                                                                     batch_size)
        data = HeldOut(ids, reference)
        log.info("held out: %d windows of %d tokens from texts %s; the extracted samples are texts %s",
                 len(data), max_len, sources, used)
        return data, sources


def _special_tokens(tokenizer) -> tuple[list, list]:
    """The ids the tokenizer puts before and after a single text ([CLS] / [SEP] for BERT)."""
    plain = list(tokenizer("a b", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a b")["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i:i + len(plain)] == plain:
            return full[:i], full[i + len(plain):]
    raise ValueError(f"tokenizer: cannot locate the text between its special tokens ({full} vs {plain})")


def extracted_texts(tokenizer, texts: list, sample_ids: np.ndarray, max_length: int) -> list[int]:
    """Indices of the held-out `texts` the extracted samples (sample, token) ids were cut from:
    those whose first max_length tokens are a sample's. ValueError when a sample is none of them."""
    first = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    extracted = {tuple(int(x) for x in s) for s in sample_ids}
    used = [i for i, ids in enumerate(first) if tuple(ids) in extracted]
    if len({tuple(first[i]) for i in used}) != len(extracted):
        raise ValueError("the extracted samples are not among the dataset's held-out texts; the dataset "
                         "changed since extraction")
    return used


def held_out_windows(tokenizer, texts: list, used: list, max_length: int, n: int, rng):
    """(up to n windows of exactly max_length tokens, special tokens included, as a (n, max_length)
    long tensor; the sorted indices of the texts they come from): cut from the held-out texts
    not in `used` (the extracted samples' texts, `extracted_texts`), drawn with `rng`."""
    import torch

    prefix, suffix = _special_tokens(tokenizer)
    body = max_length - len(prefix) - len(suffix)
    if body < 1:
        raise ValueError(f"extract.max_length: {max_length} leaves no room for text between special tokens")
    windows, source = [], []
    for i, t in enumerate(texts):
        if i in used:
            continue
        ids = tokenizer(t, add_special_tokens=False, verbose=False)["input_ids"]
        for s in range(0, len(ids) - body + 1, body):
            windows.append(prefix + list(ids[s:s + body]) + suffix)
            source.append(i)
    if not windows:
        raise ValueError(f"prune.held_out.hf_windows: no held-out text has {max_length} tokens")
    pick = np.sort(rng.choice(len(windows), size=min(n, len(windows)), replace=False))
    return torch.tensor([windows[i] for i in pick], dtype=torch.long), sorted({source[i] for i in pick})


def hf_hash(path: str, gguf_file: str | None = None) -> str:
    """Hash of a local Hugging Face model's weight files, or of its GGUF file (provenance of
    `hf` models)."""
    from ... import store
    from ..files import resolve_hf

    directory, gguf_file = resolve_hf(path, gguf_file)
    root = Path(directory)
    if not root.is_dir():
        return f"hub:{path}" + (f"/{gguf_file}" if gguf_file else "")
    if gguf_file:
        return store.file_sha256(root / gguf_file)
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix in (".safetensors", ".bin", ".json"):
            h.update(f.name.encode())
            h.update(store.file_sha256(f).encode())
    return h.hexdigest()
