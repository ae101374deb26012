"""Kind `hf`: any pretrained transformers model (`models.hf_recording`), loaded, never trained here.

Its samples are either held-out texts of a corpus (`data.corpus`) of at least
`extract.max_length` tokens, cut to that length by its own tokenizer, or the user's own texts
(`data.texts`, docs/method.md §9.4.1), one sample per text at its own length (truncated to
`extract.max_length` only where longer, which the log says), optionally wrapped in the
tokenizer's chat template (`data.chat`). Its attention is recorded layer by layer from inside
the forward pass, which runs in `extract.compute_dtype` (float32, bfloat16, float16 on a GPU;
the recorded scores and probabilities are float32 whatever it is, `models.hf_recording`), on `device`
or spread over several devices by the entry's `device_map`.

Encoder-decoder models (T5, BART; docs/method.md §9.4) store one of their three kinds of
attention per model entry, `extract.stack`: encoder self-attention, decoder (causal)
self-attention or cross-attention (query = decoder positions, key = encoder positions). The
encoder reads the sample's text (the corpus window or the user's text); the decoder reads, with
teacher forcing, the same text, or with the user's texts the field `data.target_field` of
each record, shifted right after the model's decoder start token (`models.hf_recording.hf_seq2seq_encode`):
decoder position i has seen the target's tokens before i. A cross store's `token` coordinate and
`token_text` are the decoder's tokens (its queries), its attribute `key_token_text` the
encoder's (its keys). The ablation does not run for these models.

The ablation measures a decoder by next-token perplexity through its
language-model head (objective `lm`) and an encoder by its sentence embeddings' similarity
to its unmasked self, on windows of held-out corpus texts that were not extracted, or on
the user's texts that were not extracted (or those of `prune.held_out.texts`), each at its
own length, padded in a batch and masked.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from .base import Ablation, Extraction, HeldOut, ModelKind, Sample, Unsupported

log = logging.getLogger("oattn")

__all__ = ["HF", "hf_hash", "extracted_texts", "held_out_windows", "user_texts", "encode_text", "padded"]


def user_texts(model: dict) -> tuple[str, str | None] | None:
    """(path, field) of the user's own texts of an hf model entry (`data.texts`), or None."""
    data = model.get("data") or {}
    return (str(data["texts"]), data.get("field")) if data.get("texts") else None


_TEXTS_CACHE: dict = {}


def _read_user_texts(path: str, field: str | None, key: str) -> list[str]:
    """`data.prompts.read_texts`, remembered per (path, field, size, mtime) for the process: the
    config checks and the rules ask for the same file several times at start-up."""
    from ...data.prompts import read_texts

    p = Path(path)
    try:
        st = p.stat()
        tag = (str(p.resolve()), field, st.st_size, st.st_mtime_ns)
    except OSError:
        tag = None
    if tag is not None and tag in _TEXTS_CACHE:
        return _TEXTS_CACHE[tag]
    texts = read_texts(p, field, key=key)
    if tag is not None:
        _TEXTS_CACHE[tag] = texts
    return texts


def encode_text(tokenizer, text: str, *, chat: bool, max_length: int) -> tuple[list[int], int]:
    """(token ids of one text as the model reads it, its length before truncation): wrapped in the
    tokenizer's chat template as one user turn with the generation prompt (`chat`), or with
    the tokenizer's special tokens; truncated to `max_length` tokens where longer (a plain
    text keeps its closing special tokens)."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("data.chat: the model's tokenizer has no chat template; set data.chat: false")
        wrapped = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=False)
        ids = list(tokenizer(wrapped, add_special_tokens=False, verbose=False)["input_ids"])
        return ids[:max_length], len(ids)
    full = len(tokenizer(text, verbose=False)["input_ids"])
    return list(tokenizer(text, truncation=True, max_length=max_length)["input_ids"]), full


def padded(ids: list, pad_id: int):
    """(n, longest) long tensor of the id lists `ids`, right-padded with `pad_id`, and the (n,
    longest) bool mask of the real tokens."""
    import torch

    longest = max(len(x) for x in ids)
    out = torch.full((len(ids), longest), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(ids), longest), dtype=torch.bool)
    for i, x in enumerate(ids):
        out[i, :len(x)] = torch.as_tensor(x, dtype=torch.long)
        mask[i, :len(x)] = True
    return out, mask


def _seq2seq(model: dict) -> bool | None:
    """Whether the entry's model is an encoder-decoder model (None: cannot be told before loading)."""
    from ..files import is_encoder_decoder

    return is_encoder_decoder(str(model.get("path", "")), model.get("gguf_file"))


class HF(ModelKind):
    name = "hf"
    prunes = True
    compute_dtypes = ("float32", "bfloat16", "float16")
    device_maps = True
    loads_gguf = True
    stacks = ("encoder", "decoder", "cross")

    def n_tokens(self, model: dict) -> int | None:
        # the user's texts: each its own length
        return None if user_texts(model) else model["extract"]["max_length"]

    def max_tokens(self, model: dict) -> int:
        return model["extract"]["max_length"]

    def n_candidates(self, model: dict) -> int | None:
        source = user_texts(model)
        return None if source is None else len(_read_user_texts(*source, key="data.texts"))

    def ordered_samples(self, model: dict) -> bool:
        return user_texts(model) is not None

    def input_files(self, model: dict) -> list[str]:
        source = user_texts(model)
        return [source[0]] if source else []

    def n_units(self, model: dict) -> tuple[int, int] | None:
        """From the model's files (config.json or the GGUF header, `models.files.hf_layout`);
        None when they cannot be read here (a hub id)."""
        from ..files import hf_layout

        layout = hf_layout(str(model.get("path", "")), model.get("gguf_file"), (model.get("extract") or {}).get("stack"))
        return None if layout is None else (layout.n_layers, layout.n_heads)

    def config_problem(self, model: dict, index: int) -> str | None:
        from ..files import hf_path_problem

        problem = super().config_problem(model, index)
        if problem:
            return problem
        problem = hf_path_problem(str(model.get("path", "")), model.get("gguf_file"))
        if not problem:
            return (self._stack_problem(model, index) or self._length_problem(model, index)
                    or self._texts_problem(model, index))
        key = "gguf_file" if model.get("gguf_file") and "gguf" in problem.lower() else "path"
        return (f"models[{index}].{key}: {problem}; allowed: a directory with a config.json, the alias "
                "'minilm' or 'smollm2', a directory holding gguf_file, or (online) a Hugging Face hub id")

    def _stack_problem(self, model: dict, index: int) -> str | None:
        """extract.stack: required for an encoder-decoder model, refused for the others; the
        decoder's own text (data.target_field) and the chat template likewise."""
        where, path = f"models[{index}]", model.get("path")
        stack, data, seq2seq = model["extract"].get("stack"), model.get("data") or {}, _seq2seq(model)
        if seq2seq and stack is None:
            return (f"{where}.extract.stack: {path!r} is an encoder-decoder model; choose the attention stored "
                    f"(one model entry per stack), allowed: {', '.join(self.stacks)}")
        if seq2seq is False and stack is not None:
            return f"{where}.extract.stack: {path!r} is not an encoder-decoder model; remove extract.stack"
        if data.get("target_field") and stack is None:
            return (f"{where}.data.target_field: only applies to encoder-decoder models (extract.stack); remove "
                    "it")
        if data.get("chat") and stack is not None:
            return (f"{where}.data.chat: an encoder-decoder model reads the text as its encoder's input, without "
                    f"a chat template; set {where}.data.chat: false")
        return None

    def _length_problem(self, model: dict, index: int) -> str | None:
        """extract.max_length within the positions the model declares (config.json or the GGUF
        header, read without loading it): beyond them a model of learned positions fails inside
        its forward pass, naming no key."""
        from ..files import hf_max_positions

        max_length = model["extract"].get("max_length")
        try:
            limit = hf_max_positions(str(model.get("path", "")), model.get("gguf_file"))
        except (OSError, ValueError) as exc:
            return f"models[{index}].{'gguf_file' if model.get('gguf_file') else 'path'}: {exc}"
        if limit is None or max_length is None or max_length <= limit[0]:
            return None
        return (f"models[{index}].extract.max_length: {max_length} tokens, but {model.get('path')!r} takes at most "
                f"{limit[0]} ({limit[1]}); allowed: 1..{limit[0]}")

    def prune_problem(self, model: dict, index: int) -> str | None:
        if model["extract"].get("stack") is None and not _seq2seq(model):
            return None
        return (f"models[{index}].prune: the ablation of an encoder-decoder model ({model['name']}) is not "
                f"supported; set models[{index}].prune: {{enabled: false}}")

    def _texts_problem(self, model: dict, index: int) -> str | None:
        data, where = model.get("data") or {}, f"models[{index}].data"
        if not data.get("texts"):
            for key in ("field", "target_field", "chat"):
                if data.get(key):
                    return f"{where}.{key}: only applies to the user's own texts; set {where}.texts to a file"
            return None
        try:
            texts = _read_user_texts(str(data["texts"]), data.get("field"), key=f"{where}.texts")
            if data.get("target_field"):
                targets = _read_user_texts(str(data["texts"]), data["target_field"], key=f"{where}.target_field")
                if len(targets) != len(texts):
                    return (f"{where}.target_field: {len(targets)} texts in {data['texts']} for "
                            f"{len(texts)} of data.field")
        except ValueError as exc:
            return str(exc)
        if data.get("chat"):
            from ..files import has_chat_template

            if has_chat_template(str(model.get("path", "")), model.get("gguf_file")) is False:
                return (f"{where}.chat: the tokenizer of {model.get('path')!r} has no chat template; set "
                        f"{where}.chat: false")
        return None

    def candidates_params(self, model: dict) -> dict:
        return {} if user_texts(model) else candidates_source(model)

    def count_candidates(self, model: dict, meta: dict) -> dict | None:
        """The corpus' texts of at least `extract.max_length` tokens of the model's tokenizer
        (loaded without its weights), counted once here for every extract job and for the
        start-up check of `extract.n_samples` on later runs."""
        if user_texts(model) or not meta.get("test_texts"):
            return None
        from ..hf_recording import load_tokenizer

        source = candidates_source(model)
        tok = load_tokenizer(source["path"], source["gguf_file"])
        indices = long_texts(tok, meta["test_texts"], source["max_length"])
        return {"source": source, "indices": indices, "count": len(indices),
                "what": f"texts of the {model.get('data', {}).get('corpus')} corpus with >= {source['max_length']} "
                        f"tokens of {source['path']!r}'s tokenizer"}

    def datasets(self, model: dict) -> list[str]:
        if user_texts(model):
            return []
        return ["wikitext103"] if model.get("data", {}).get("corpus") == "wikitext103" else []

    def prune_params(self, model: dict, prepared: str | None) -> dict:
        # a GGUF model is loaded from the directory prepare_model wrote; the user's texts are
        # encoded for the ablation as they were for extraction
        out = {**super().prune_params(model, prepared), "path": prepared or model["path"]}
        if user_texts(model):
            out.update(max_length=model["extract"]["max_length"], chat=bool(model["data"].get("chat")))
        return out

    def prepare_data(self, data: dict, data_root) -> tuple[dict, dict]:
        if data.get("texts"):
            texts = _read_user_texts(str(data["texts"]), data.get("field"), key="data.texts")
            log.info("%d texts from %s (%d to %d characters)", len(texts), data["texts"],
                     min(map(len, texts)), max(map(len, texts)))
            # the texts are the samples, in their order, and (those not extracted) the held-out data
            meta = {"kind": self.name, "source": "texts", "texts": texts, "chat": bool(data.get("chat")),
                    "test_texts": texts}
            if data.get("target_field"):  # an encoder-decoder model's decoder texts, one per text
                meta["target_texts"] = _read_user_texts(str(data["texts"]), data["target_field"],
                                                        key="data.target_field")
            return {"n_texts": np.asarray(len(texts))}, meta
        from ...data.text import text_dataset

        ids, vocab, docs = text_dataset(data, data_root)
        meta = {"kind": self.name, "vocab": list(vocab.itos), "sizes": {k: int(v.size) for k, v in ids.items()}}
        # not trained here: every document can be drawn as a sample or held out for the ablation
        # (enough of them are 1024 tokens long for an LLM's samples), read as raw text by the
        # model's own tokenizer
        meta["test_texts"] = docs
        log.info("text splits (tokens): %s; vocabulary %d", meta["sizes"], len(vocab))
        return ids, meta

    def extraction(self, model: dict, *, data_npz, meta: dict, checkpoint, device, prepared=None) -> Extraction:
        if meta.get("source") == "texts":
            return _TextsExtraction(model, meta, device, prepared)
        return _HFExtraction(model, meta, device, prepared)

    def ablation(self, model: dict, *, data_npz, meta: dict, checkpoint, device) -> Ablation:
        return _HFAblation(model, meta, device)


def long_texts(tokenizer, texts: list[str], max_len: int) -> list[int]:
    """The indices of the candidate texts: at least `max_len` tokens of `tokenizer` (special
    tokens included), so that every sample has exactly max_length tokens, and at least 4
    characters a token (4 x max_len characters; shorter texts are not tokenized). That second
    rule is the candidates' definition since the first release, kept so that the same seed
    draws the same samples; it leaves out the few dense texts (source code of short tokens)
    that reach max_len tokens in fewer characters."""
    return [i for i, t in enumerate(texts)
            if len(t) >= 4 * max_len and len(tokenizer(t, add_special_tokens=True)["input_ids"]) >= max_len]


def candidates_source(model: dict) -> dict:
    """What decides the candidate texts of a corpus model besides the corpus: its tokenizer's
    files and `extract.max_length` (the `candidates` record of prepare_data's meta)."""
    return {"path": str(model.get("path", "")), "gguf_file": model.get("gguf_file"),
            "max_length": int(model["extract"]["max_length"])}


class _HFExtraction(Extraction):
    """Held-out texts with at least max_length tokens, the first max_length of each."""

    def __init__(self, model: dict, meta: dict, device, prepared):
        self._load(model, device, prepared)
        self.max_len = max_len = model["extract"]["max_length"]
        # counted once by prepare_data for this tokenizer and length (HF.count_candidates), else here
        known = meta.get("candidates") or {}
        if known.get("source") == candidates_source(model):
            picked = known["indices"]
        else:
            picked = long_texts(self.tok, meta["test_texts"], max_len)
        self.texts = [meta["test_texts"][i] for i in picked]
        self.n_available = len(self.texts)
        self.available = f"held-out texts with >= {max_len} tokens"

    def _load(self, model: dict, device, prepared) -> None:
        """The model in `extract.compute_dtype`, on `device` or spread by the entry's `device_map`;
        an encoder-decoder model's `extract.stack` checked against what it loaded as."""
        from ..files import hf_layout
        from ..hf_recording import load_hf

        if prepared:
            prepared = Path(prepared).parent if Path(prepared).is_file() else Path(prepared)
        self.source = (str(prepared), None) if prepared else (model["path"], model.get("gguf_file"))
        ex, device_map = model["extract"], model.get("device_map")
        self.compute_dtype = ex.get("compute_dtype", "float32")
        self.net, self.tok = load_hf(self.source[0], device=None if device_map is not None else device,
                                     dtype=self.compute_dtype, gguf_file=self.source[1], device_map=device_map)
        self.stack = ex.get("stack")
        seq2seq = bool(getattr(self.net.config, "is_encoder_decoder", False))
        if seq2seq != (self.stack is not None):
            raise ValueError(f"extract.stack: {model['path']!r} is an encoder-decoder model; allowed: "
                             f"{', '.join(HF.stacks)}" if seq2seq else
                             f"extract.stack: {model['path']!r} is not an encoder-decoder model; remove it")
        layout = hf_layout(*self.source, self.stack) if seq2seq else None
        self.units = (layout.n_layers, layout.n_heads) if layout else (
            int(getattr(self.net.config, "num_hidden_layers", 0) or 0),
            int(getattr(self.net.config, "num_attention_heads", 0) or 0))

    @property
    def source_hash(self) -> str:
        return hf_hash(*self.source)

    def _seq2seq_sample(self, source: str, target: str, attrs: dict) -> Sample:
        """One (encoder text, decoder text) pair as a sample of the stack `self.stack`: the
        decoder reads the target shifted right (teacher forcing); each side cut to max_length."""
        from ..hf_recording import hf_attention_stream, hf_seq2seq_encode

        net, tok, stack = self.net, self.tok, self.stack
        inputs = hf_seq2seq_encode(net, tok, [source], [target], max_length=self.max_len)
        enc = inputs["input_ids"][0].cpu().numpy()
        dec = inputs["decoder_input_ids"][0].cpu().numpy()
        ids = enc if stack == "encoder" else dec  # the queries
        attrs = {**attrs, "stack": stack, "compute_dtype": self.compute_dtype}
        if stack == "cross":  # the keys are the encoder's tokens
            attrs["key_token_text"] = json.dumps(tok.convert_ids_to_tokens(enc.tolist()))

        def run(on_layer) -> int:
            n = 0

            def each(call):
                nonlocal n
                if call.stack == stack:
                    on_layer(call.layer, call.scores[0], call.probs[0],
                             None if call.allowed is None else call.allowed[0], call.n_kv_heads)
                    n += 1

            hf_attention_stream(net, inputs, each)
            return n

        return Sample(ids, tok.convert_ids_to_tokens(ids.tolist()), attrs, ids.size, *self.units, run)

    def _one_text_sample(self, inputs: dict, attrs: dict) -> Sample:
        """The sample of model inputs holding one text (a batch of one, no padding)."""
        from ..hf_recording import hf_attention_stream

        net, ids = self.net, inputs["input_ids"][0].cpu().numpy()

        def run(on_layer) -> int:
            def each(call):
                on_layer(call.index, call.scores[0], call.probs[0], None if call.allowed is None else call.allowed[0],
                         call.n_kv_heads)

            return hf_attention_stream(net, inputs, each)

        return Sample(ids, self.tok.convert_ids_to_tokens(ids.tolist()), {**attrs, "compute_dtype": self.compute_dtype},
                      ids.size, *self.units, run)

    def sample(self, index: int) -> Sample:
        from ..hf_recording import hf_encode

        if self.stack is not None:  # teacher forcing on the text itself
            return self._seq2seq_sample(self.texts[index], self.texts[index], {})
        return self._one_text_sample(hf_encode(self.net, self.tok, [self.texts[index]], max_length=self.max_len), {})


class _TextsExtraction(_HFExtraction):
    """The user's texts, one sample each at its own length (chat-wrapped with `data.chat`)."""

    def __init__(self, model: dict, meta: dict, device, prepared):
        self._load(model, device, prepared)
        self.max_len = model["extract"]["max_length"]
        self.texts, self.chat = meta["texts"], bool(meta.get("chat"))
        self.targets = meta.get("target_texts") or self.texts
        self.name = model["name"]
        self.n_available = len(self.texts)
        self.available = f"texts in {model['data']['texts']}"

    def sample(self, index: int) -> Sample:
        import torch

        net = self.net
        ids, full = encode_text(self.tok, self.texts[index], chat=self.chat, max_length=self.max_len)
        if full > len(ids):
            log.warning("%s text %d: %d tokens truncated to extract.max_length = %d", self.name, index, full,
                        len(ids))
        if len(ids) < 2:
            raise ValueError(f"data.texts: text {index} of {self.available} is {len(ids)} token long; a sample "
                             "needs at least 2")
        attrs = {"text_index": int(index), "n_tokens_full": int(full), "chat": int(self.chat)}
        if self.stack is not None:
            return self._seq2seq_sample(self.texts[index], self.targets[index], attrs)
        inputs = {"input_ids": torch.tensor([ids], device=net.device),
                  "attention_mask": torch.ones((1, len(ids)), dtype=torch.long, device=net.device)}
        return self._one_text_sample(inputs, attrs)


class _HFAblation(Ablation):
    def __init__(self, model: dict, meta: dict, device):
        """An hf model whose attention is causal is loaded again with its language-model head:
        a decoder is measured by what it is for, next-token perplexity (objective `lm`), not by
        its hidden states."""
        from ..gating import head_layout, register_gated_attention
        from ..hf_recording import load_hf

        net, tok = load_hf(model["path"], device=device)
        if getattr(net.config, "is_encoder_decoder", False):
            raise Unsupported(f"model {model['name']!r}: the ablation of an encoder-decoder model is not supported; "
                              "set its prune: {enabled: false}")
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
        self.user_texts = meta.get("source") == "texts"
        self.max_length, self.chat = model.get("max_length"), bool(model.get("chat"))

    def ranking_samples(self, attention: list):
        import torch

        if self.user_texts:  # each sample its own length: padded, masked; the texts are recorded
            ids, mask = padded([a["token"].values.tolist() for a in attention], self.tok.pad_token_id or 0)
            return HeldOut(ids, mask=mask), [int(a.attrs["text_index"]) for a in attention]
        ids = np.stack([a["token"].values for a in attention]).astype(np.int64)
        return HeldOut(torch.from_numpy(ids)), extracted_texts(self.tok, self.texts, ids, ids.shape[1])

    def _held_out_texts(self, used, settings: dict, rng, batch_size: int):
        """The user's texts not extracted (or those of prune.held_out.texts), each at its own length."""
        from ..gating import reference_embeddings

        other = settings.get("texts")
        if other:
            texts, used, where = _read_user_texts(str(other), settings.get("field"), "prune.held_out.texts"), [], other
        else:
            texts, where = self.texts, "data.texts"
        taken = set(used)
        free = [i for i in range(len(texts)) if i not in taken]
        if not free:
            raise ValueError(f"prune.held_out: every text of {where} is an extracted sample; lower "
                             "extract.n_samples or name other texts in prune.held_out.texts")
        pick = np.sort(rng.choice(len(free), size=min(settings["hf_windows"], len(free)), replace=False))
        sources = [free[i] for i in pick]
        encoded = [encode_text(self.tok, texts[i], chat=self.chat, max_length=self.max_length)[0] for i in sources]
        ids, mask = padded(encoded, self.tok.pad_token_id or 0)
        reference = None if self.layout.objective == "lm" else reference_embeddings(self.net, self.layout, ids,
                                                                                     batch_size, mask=mask)
        lengths = mask.sum(1).tolist()
        log.info("held out: %d texts of %s (%d to %d tokens): %s; the extracted samples are texts %s",
                 len(sources), where, min(lengths), max(lengths), sources, list(used))
        return HeldOut(ids, reference, mask=mask), sources

    def held_out(self, samples, used, settings: dict, rng, batch_size: int):
        from ..gating import reference_embeddings

        if self.user_texts or settings.get("texts"):
            self.max_length = self.max_length or int(samples.inputs.shape[1])
            return self._held_out_texts(used, settings, rng, batch_size)
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
