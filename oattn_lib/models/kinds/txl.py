"""Kind `txl`: the project's Transformer-XL (`models.transformer_xl`), trained here on a text corpus.

Its samples are test segments of `arch.tgt_len` tokens; it stores pre-mask scores and
post-mask probabilities with its causal (memory) mask; the ablation measures test-segment
perplexity on segments that share no token with the extracted ones.
"""
from __future__ import annotations

import logging

import numpy as np

from .base import Ablation, Extraction, HeldOut, ModelKind, Sample, forward_layers

log = logging.getLogger("oattn")

__all__ = ["TXL", "held_out_segments"]


class TXL(ModelKind):
    name = "txl"
    trains = True
    prunes = True
    typical_quantity = "scores"

    def n_tokens(self, model: dict) -> int:
        return model["arch"]["tgt_len"]

    def n_units(self, model: dict) -> tuple[int, int]:
        return model["arch"]["n_layer"], model["arch"]["n_head"]

    def datasets(self, model: dict) -> list[str]:
        return ["wikitext103"] if model.get("data", {}).get("corpus") == "wikitext103" else []

    def retrain_problem(self, arch: dict) -> str | None:
        return None

    def validation_metric(self) -> tuple[str, str]:
        return "valid_ppl", "validation perplexity"

    def prepare_data(self, data: dict, data_root) -> tuple[dict, dict]:
        from ...data.text import text_dataset

        ids, vocab, _ = text_dataset(data, data_root)
        meta = {"kind": self.name, "vocab": list(vocab.itos), "sizes": {k: int(v.size) for k, v in ids.items()}}
        log.info("text splits (tokens): %s; vocabulary %d", meta["sizes"], len(vocab))
        return ids, meta

    def build(self, arch: dict, data: dict, meta: dict, pretrained: bool = False):
        from ..checkpoint import build_model

        return build_model(self.name, arch, n_token=len(meta["vocab"]))

    def train(self, net, arrays: dict, meta: dict, data: dict, train: dict, device) -> tuple[dict, list]:
        import torch

        from ... import train as trainlib

        res = trainlib.train_txl(net, torch.from_numpy(arrays["train"]), torch.from_numpy(arrays["valid"]),
                                 steps=train["steps"], batch_size=train["batch_size"], lr=train["lr"],
                                 warmup=train["warmup"], seed=train["seed"], device=device, log=log)
        log.info("validation perplexity %.2f (unigram baseline %.2f)", res["valid_ppl"], res["unigram_ppl"])
        return {"valid_ppl": res["valid_ppl"], "unigram_ppl": res["unigram_ppl"]}, res["history"]

    def retrain(self, net, arrays: dict, meta: dict, data: dict, train: dict, *, seed: int, steps: int,
                device) -> tuple[dict, float, int, list]:
        import torch

        from ... import train as trainlib

        n_steps = steps or train["steps"]
        res = trainlib.train_txl(net, torch.from_numpy(arrays["train"]), torch.from_numpy(arrays["valid"]),
                                 steps=n_steps, batch_size=train["batch_size"], lr=train["lr"],
                                 warmup=train["warmup"], seed=seed, device=device, log=log, progress=False)
        metrics = {"valid_ppl": res["valid_ppl"], "unigram_ppl": res["unigram_ppl"]}
        return metrics, res["valid_ppl"], n_steps, res["history"]

    def extraction(self, model: dict, *, data_npz, meta: dict, checkpoint, device, prepared=None) -> Extraction:
        return _TXLExtraction(model, data_npz, meta, checkpoint, device)

    def ablation(self, model: dict, *, data_npz, meta: dict, checkpoint, device) -> Ablation:
        return _TXLAblation(data_npz, meta, checkpoint, device)


class _TXLExtraction(Extraction):
    """Test segments of tgt_len tokens, each run without memory."""

    def __init__(self, model: dict, data_npz, meta: dict, checkpoint, device):
        from ... import store
        from ..checkpoint import load_trained

        self.test = store.load_npz(data_npz)["test"]
        self.vocab = meta["vocab"]
        net, ck = load_trained(checkpoint, n_token=len(meta["vocab"]))
        self.net = net.to(device).eval()
        self.tgt = ck["arch"]["tgt_len"]
        self.n_available = self.test.size // self.tgt
        self.available = f"test segments of {self.tgt} tokens"
        self.device = device
        self.source_hash = store.file_sha256(checkpoint)

    def sample(self, index: int) -> Sample:
        import torch

        from ..transformer_xl import causal_mask

        with torch.no_grad():
            toks = self.test[index * self.tgt:(index + 1) * self.tgt]
            token_text = [self.vocab[t] for t in toks]
            res = self.net(torch.from_numpy(toks)[None].to(self.device), mems=None, return_attention=True)
            scores, probs = res.scores[0], res.probs[0]
            cfg = self.net.config
            allowed = ~causal_mask(toks.size, 0, cfg.mem_len, cfg.same_length)
        return Sample(toks, token_text, {}, probs.shape[-1], probs.shape[0], probs.shape[1],
                      forward_layers(scores, probs, allowed))


class _TXLAblation(Ablation):
    def __init__(self, data_npz, meta: dict, checkpoint, device):
        from ... import store
        from ..checkpoint import load_trained
        from ..gating import head_layout

        self.arrays = store.load_npz(data_npz)
        net, _ = load_trained(checkpoint, n_token=len(meta["vocab"]))
        self.net = net.to(device).eval()
        self.layout = head_layout(self.net, "txl")

    def ranking_samples(self, attention: list):
        import torch

        T = attention[0].sizes["query"]
        test = self.arrays["test"]
        idx = np.array([int(a.attrs["source_index"]) for a in attention])
        for a, i in zip(attention, idx):
            if not np.array_equal(test[i * T:(i + 1) * T], a["token"].values):
                raise ValueError(f"sample {a.attrs.get('sample')}: its tokens are not test segment {i}; "
                                 "the dataset changed since extraction")
        if (idx + 1).max() * T + 1 > test.size:
            raise ValueError("the last extracted test segment has no next token to predict")
        wins = np.stack([test[i * T:(i + 1) * T + 1] for i in idx])
        return HeldOut(torch.from_numpy(wins.astype(np.int64))), idx

    def held_out(self, samples, used, settings: dict, rng, batch_size: int):
        T = samples.inputs.shape[1] - 1
        data, picked = held_out_segments(self.arrays["test"], T, used, settings["txl_segments"], rng)
        log.info("held out: %d test segments of %d tokens (segments %s), none within one segment of the "
                 "extracted segments %s", len(data), T, picked.tolist(), used.tolist())
        return data, picked


def held_out_segments(test: np.ndarray, T: int, used: np.ndarray, n: int, rng):
    """(`HeldOut` of up to n test windows of T + 1 tokens (T inputs, T targets), their
    segment indices): windows sharing no token with the rankings' windows [i T, (i + 1) T] of
    the segments `used` (so neighbours of a used segment are left out too), drawn with `rng`."""
    import torch

    n_seg = (test.size - 1) // T
    banned = set()
    for i in used:
        banned.update((int(i) - 1, int(i), int(i) + 1))
    free = np.array([i for i in range(n_seg) if i not in banned])
    if free.size == 0:
        raise ValueError("prune.held_out.txl_segments: no test segment is left after the extracted ones")
    pick = np.sort(rng.choice(free, size=min(n, free.size), replace=False))
    return HeldOut(torch.from_numpy(np.stack([test[i * T:(i + 1) * T + 1] for i in pick]).astype(np.int64))), pick
