"""Seeded training and evaluation of the analysed models (docs/method.md §9).

Both loops are deterministic under their seed on CPU (same seed and same initial
weights -> bitwise identical state_dict): they run with
`torch.use_deterministic_algorithms(True)` and a forked global RNG seeded with `seed`,
so the caller's random state and determinism setting are left as they were. On CUDA the
same switches are set (plus CUBLAS_WORKSPACE_CONFIG when unset); bitwise identity across
machines is not promised there.

`state_hash` gives the sha256 of a state_dict for provenance (docs/method.md §12.3).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

__all__ = ["train_txl", "evaluate_txl", "unigram_ppl", "batchify",
           "train_vit", "evaluate_vit", "state_hash"]


# --------------------------------------------------------------------------- helpers
def state_hash(state_dict) -> str:
    """sha256 hex digest over (name, dtype, shape, raw bytes) of every tensor, by sorted name."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        v = state_dict[name]
        h.update(name.encode())
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def _logger(log) -> Callable[[str], None]:
    if log is None:
        return lambda msg: None
    if isinstance(log, logging.Logger) or hasattr(log, "info"):
        return log.info
    if callable(log):
        return log
    raise ValueError(f"log: expected a callable, a logger or None, got {type(log).__name__}")


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
    """Deterministic algorithms and a global RNG seeded with `seed`, restored on exit."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)


def _record(history: list, window: list, step: int, steps: int, opt, t0: float, bar, say) -> dict:
    """Append the mean loss of the steps since the last record to `history`, and report it."""
    rec = dict(step=step + 1, loss=sum(window) / len(window), lr=opt.param_groups[0]["lr"],
               elapsed=time.perf_counter() - t0)
    history.append(rec)
    window.clear()
    bar.set_postfix(loss=f"{rec['loss']:.3f}")
    say(f"step {rec['step']}/{steps} loss {rec['loss']:.4f}")
    return rec


def _check_int(name, v, minimum=1):
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {v!r}")


def _warmup_cosine(warmup: int, steps: int):
    def factor(step: int) -> float:  # step = number of optimizer steps already taken
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


# --------------------------------------------------------------------------- TXL
def _check_tokens(name, tokens) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 1 or tokens.dtype != torch.long:
        raise ValueError(f"{name}: expected a 1-D LongTensor, got "
                         f"{getattr(tokens, 'dtype', type(tokens).__name__)} shape {tuple(getattr(tokens, 'shape', ()))}")
    return tokens


def batchify(tokens: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a token stream into `batch_size` contiguous streams: (batch_size, n // batch_size).

    Stream b holds tokens [b*L, (b+1)*L); the tail that does not fill a row is dropped.
    """
    _check_tokens("tokens", tokens)
    _check_int("batch_size", batch_size)
    L = tokens.numel() // batch_size
    if L < 2:
        raise ValueError(f"tokens: {tokens.numel()} tokens are too few for batch_size {batch_size}")
    return tokens[: L * batch_size].reshape(batch_size, L)


def _segments(streams: torch.Tensor, tgt_len: int):
    """(input, target) pairs of consecutive segments of the streams, targets shifted by one."""
    L = streams.shape[1]
    for i in range(0, L - 1, tgt_len):
        n = min(tgt_len, L - 1 - i)
        yield streams[:, i: i + n], streams[:, i + 1: i + 1 + n]


def unigram_ppl(train_tokens: torch.Tensor, eval_targets: torch.Tensor, n_token: int) -> float:
    """Perplexity on `eval_targets` of the add-one smoothed unigram model of `train_tokens`."""
    counts = torch.bincount(_check_tokens("train_tokens", train_tokens).cpu(), minlength=n_token).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(torch.exp(-logp[eval_targets.reshape(-1).cpu()].mean()))


@torch.no_grad()
def evaluate_txl(model, tokens: torch.Tensor, batch_size: int, tgt_len: int, mem_len: int,
                 device=None) -> float:
    """Perplexity of `model` on a token stream, batchified into `batch_size` streams and read
    segment by segment of `tgt_len` with `mem_len` tokens of memory carried over."""
    _check_int("tgt_len", tgt_len)
    _check_int("mem_len", mem_len, 0)
    device = next(model.parameters()).device if device is None else torch.device(device)
    streams = batchify(tokens, batch_size).to(device)
    was_training = model.training
    model.eval()
    total, count, mems = 0.0, 0, None
    try:
        for x, y in _segments(streams, tgt_len):
            out = model(x, y, mems=mems, mem_len=mem_len)
            mems = out.new_mems
            total += float(out.loss) * y.numel()
            count += y.numel()
    finally:
        model.train(was_training)
    return math.exp(total / count)


def train_txl(model, train_tokens: torch.Tensor, valid_tokens: torch.Tensor, *, steps: int,
              batch_size: int, lr: float, warmup: int = 0, seed: int = 0, device="cpu",
              tgt_len: int | None = None, mem_len: int | None = None, clip: float = 0.25,
              eval_batch_size: int | None = None, log_every: int = 50, log=None,
              progress: bool = True) -> dict:
    """Train a TransformerXL language model and report its validation perplexity.

    The training stream is batchified into `batch_size` contiguous streams and read in
    consecutive segments of `tgt_len` (default config.tgt_len), with the memory carried
    from each segment to the next and reset when the streams wrap around. Adam, linear
    warmup over `warmup` steps then cosine decay to 0 at `steps`, gradient-norm clipping
    at `clip`. Returns dict(history (list of dicts: step, loss, lr, elapsed), valid_ppl,
    unigram_ppl (add-one smoothed unigram of the training counts, on the same validation
    targets), train_tokens_seen, state_hash).
    """
    _check_int("steps", steps)
    _check_int("warmup", warmup, 0)
    _check_int("log_every", log_every)
    if not lr > 0:
        raise ValueError(f"lr: expected a positive learning rate, got {lr!r}")
    cfg = model.config
    tgt_len = cfg.tgt_len if tgt_len is None else tgt_len
    mem_len = cfg.mem_len if mem_len is None else mem_len
    eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
    _check_tokens("train_tokens", train_tokens)
    _check_tokens("valid_tokens", valid_tokens)
    for name, t in (("train_tokens", train_tokens), ("valid_tokens", valid_tokens)):
        if int(t.min()) < 0 or int(t.max()) >= cfg.n_token:
            raise ValueError(f"{name}: token ids must lie in [0, {cfg.n_token}), got [{int(t.min())}, {int(t.max())}]")
    say = _logger(log)
    device = torch.device(device)
    model.to(device)
    streams = batchify(train_tokens, batch_size).to(device)
    segments = list(_segments(streams, tgt_len))

    history: list[dict] = []
    with _seeded(seed, device):
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(warmup, steps))
        model.train()
        mems, window, seen, t0 = None, [], 0, time.perf_counter()
        bar = tqdm(total=steps, disable=not progress, desc="train_txl", leave=False)
        for step in range(steps):
            k = step % len(segments)
            if k == 0:
                mems = None
            x, y = segments[k]
            out = model(x, y, mems=mems, mem_len=mem_len)
            mems = out.new_mems
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            seen += y.numel()
            window.append(float(out.loss.detach()))
            bar.update(1)
            if (step + 1) % log_every == 0 or step + 1 == steps:
                rec = _record(history, window, step, steps, opt, t0, bar, say)
                say(f"  ppl {math.exp(min(rec['loss'], 50)):.2f} lr {rec['lr']:.3g}")
        bar.close()
        valid_ppl = evaluate_txl(model, valid_tokens, eval_batch_size, tgt_len, mem_len, device=device)
    targets = batchify(valid_tokens, eval_batch_size)[:, 1:]
    uni = unigram_ppl(train_tokens, targets, cfg.n_token)
    say(f"valid ppl {valid_ppl:.3f} (unigram {uni:.3f})")
    return dict(history=history, valid_ppl=valid_ppl, unigram_ppl=uni, train_tokens_seen=seen,
                state_hash=state_hash(model.state_dict()))


# --------------------------------------------------------------------------- ViT
def _check_images(name, images, labels=None, transform=None):
    # with a per-batch transform the stored images may be in any layout (e.g. uint8 NHWC)
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or not (
            transform is not None or images.is_floating_point()):
        raise ValueError(f"{name}: expected a float (n, channel, height, width) tensor, got "
                         f"shape {tuple(getattr(images, 'shape', ()))}")
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(f"labels for {name}: expected a 1-D tensor of length {images.shape[0]}, "
                             f"got shape {tuple(getattr(labels, 'shape', ()))}")


@torch.no_grad()
def evaluate_vit(model, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 256,
                 device=None, transform=None) -> float:
    """Top-1 accuracy of `model` (eval mode) on images (n, c, h, w) with labels (n,).

    `transform`, if given, turns each stored batch into model input (resizing, say), so a
    large dataset never exists in memory at model resolution.
    """
    _check_images("images", images, labels, transform)
    _check_int("batch_size", batch_size)
    device = next(model.parameters()).device if device is None else torch.device(device)
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for i in range(0, images.shape[0], batch_size):
            x = images[i: i + batch_size]
            logits = model((transform(x) if transform else x).to(device))
            correct += int((logits.argmax(-1).cpu() == labels[i: i + batch_size].cpu()).sum())
    finally:
        model.train(was_training)
    return correct / images.shape[0]


def train_vit(model, train_images: torch.Tensor, train_labels: torch.Tensor,
              test_images: torch.Tensor, test_labels: torch.Tensor, *, batch_size: int, lr: float,
              epochs: int | None = None, steps: int | None = None, seed: int = 0, device="cpu",
              weight_decay: float = 0.0, clip: float | None = None, eval_batch_size: int = 256,
              log_every: int = 50, log=None, progress: bool = True, transform=None) -> dict:
    """Train (or fine-tune) an image classifier with cross-entropy and report test accuracy.

    Give exactly one of `epochs` (full passes over a seeded random permutation) or
    `steps` (mini-batches, reshuffling at each pass). Adam at constant `lr`. `transform`
    maps each stored batch to model input (see `evaluate_vit`). Returns
    dict(history (step, loss, lr, elapsed), test_accuracy, state_hash).
    """
    if (epochs is None) == (steps is None):
        raise ValueError(f"epochs, steps: give exactly one, got epochs={epochs!r}, steps={steps!r}")
    _check_images("train_images", train_images, train_labels, transform)
    _check_images("test_images", test_images, test_labels, transform)
    _check_int("batch_size", batch_size)
    _check_int("log_every", log_every)
    if not lr > 0:
        raise ValueError(f"lr: expected a positive learning rate, got {lr!r}")
    n = train_images.shape[0]
    per_epoch = math.ceil(n / batch_size)
    if epochs is not None:
        _check_int("epochs", epochs)
        steps = epochs * per_epoch
    else:
        _check_int("steps", steps)
    say = _logger(log)
    device = torch.device(device)
    model.to(device)
    history: list[dict] = []
    with _seeded(seed, device):
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
        model.train()
        window, t0, order = [], time.perf_counter(), None
        bar = tqdm(total=steps, disable=not progress, desc="train_vit", leave=False)
        for step in range(steps):
            k = step % per_epoch
            if k == 0:
                order = torch.randperm(n, generator=gen)
            idx = order[k * batch_size: (k + 1) * batch_size]
            x = train_images[idx]
            x = (transform(x) if transform else x).to(device)
            y = train_labels[idx].to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            window.append(float(loss.detach()))
            bar.update(1)
            if (step + 1) % log_every == 0 or step + 1 == steps:
                _record(history, window, step, steps, opt, t0, bar, say)
        bar.close()
        acc = evaluate_vit(model, test_images, test_labels, eval_batch_size, device=device,
                           transform=transform)
    say(f"test accuracy {acc:.4f}")
    return dict(history=history, test_accuracy=acc, state_hash=state_hash(model.state_dict()))
