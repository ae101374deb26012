"""Softmax vs Tensor Attention: what is lost, what is gained, how the heads change (issue 7).

The paper argues that once organized, attention is nearly invariant to its softmax; Tensor
Attention (Zhang, "Deep Tensor Network"; `oattn_lib.tensor_attention`) has no softmax at
all. The experiment trains the same networks (a Transformer-XL and a ViT of the config)
with softmax and with every listed tensor variant, several seeds each and the same number
of steps, then:

- Table 5: validation perplexity (TXL) or test accuracy (ViT), mean, spread, min and max
  over seeds, the difference from softmax, and training seconds per step;
- Figure 8: per-head l1 entropy and l1/l2 sparsity (SPEC 4) of every run's organized heads
  (SPEC 3.2, on the heads' probs: the matrices the values are multiplied by, softmax or
  normalised T), variant beside variant;
- the paraproduct residual (SPEC 5) of the softmax heads: every head of the softmax runs,
  organized by the 2-D questionnaire (SPEC 3.3) and unorganized, on its pre-softmax scores.

TXL variants run in their causal prefix form (`tensor_attention`); ViT variants in the
non-causal linear form. Each run reuses the workflow's own stages: `stages.extract`,
`organize`, `decompose` and `entropy` run unchanged on tensor-attention models.

Stage functions: `train_run` (one model, attention, seed), `analyse_run` (its attention
maps, organization, entropies, paraproduct), `table5` (Table 5 and Figure 8).
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from . import plots, store
from .data.images import vit_images
from .models.checkpoint import build_model, load_checkpoint, save_checkpoint
from .runtime import resolve_device
from .stages.decompose import decompose
from .stages.entropy import entropy
from .stages.extract import extract
from .stages.organize import organize
from .store import load_npz
from .tensor_attention import parse_attention

log = logging.getLogger("oattn")

__all__ = ["DEFAULT_VARIANTS", "train_run", "analyse_run", "table5", "fig8_softmax_free", "run_metric"]

DEFAULT_VARIANTS = ("tensor_q", "tensor_k", "tensor_q_relu", "tensor_q_diag", "tensor_q_row")
"""The paper's named variants: T_Q, T_K, ReLU, diagonal and row renormalisation."""


# -- training ---------------------------------------------------------------------------
def train_run(kind: str, arch: dict, train: dict, data: dict, data_npz, data_meta, attention: str,
              seed: int, steps: int, checkpoint_out, metrics_out, device="auto") -> None:
    """Train one run: the model of `arch` with `attention`, initialised and shuffled by `seed`.

    steps > 0 trains every run for that many optimizer steps (TXL and ViT alike); 0 keeps
    the model's own length (TXL train.steps, ViT train.epochs). Same checkpoint format as
    `stages.train.train_model`, so `stages.extract` reads it. metrics: valid_ppl and
    unigram_ppl (TXL) or test_accuracy (ViT), seconds_per_step (training loop only),
    steps, diverged (a non-finite loss or metric) and the loss history.
    """
    from . import train as trainlib

    parse_attention(attention)  # a ValueError naming `attention` before any work
    if kind not in ("txl", "vit"):
        raise ValueError(f"kind: {kind!r} is not trained by the experiment (allowed: txl, vit)")
    if kind == "vit" and arch.get("variant", "custom") != "custom":
        raise ValueError(f"arch.variant: {arch['variant']!r}; the experiment trains the custom ViT only")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps: expected an integer >= 0, got {steps!r}")
    dev = resolve_device(device)
    arch = {**arch, "attention": attention}
    arrays, meta = load_npz(data_npz), json.loads(Path(data_meta).read_text())
    torch.manual_seed(seed)
    if kind == "txl":
        model = build_model(kind, arch, n_token=len(meta["vocab"]))
        n_steps = steps or train["steps"]
        res = trainlib.train_txl(model, torch.from_numpy(arrays["train"]), torch.from_numpy(arrays["valid"]),
                                 steps=n_steps, batch_size=train["batch_size"], lr=train["lr"],
                                 warmup=train.get("warmup", 0), seed=seed, device=dev, log=log,
                                 progress=False)
        metrics = {"valid_ppl": res["valid_ppl"], "unigram_ppl": res["unigram_ppl"]}
        value = res["valid_ppl"]
    else:
        size = data.get("image_size", 32)
        model = build_model(kind, arch, image_size=size)
        length = {"steps": steps} if steps else {"epochs": train["epochs"]}
        res = trainlib.train_vit(model, vit_images(arrays, meta, "train", size),
                                 torch.from_numpy(arrays["train_labels"]),
                                 vit_images(arrays, meta, "test", size), torch.from_numpy(arrays["test_labels"]),
                                 batch_size=train["batch_size"], lr=train["lr"], seed=seed, device=dev,
                                 log=log, progress=False, **length)
        metrics = {"test_accuracy": res["test_accuracy"]}
        value = res["test_accuracy"]
        n_steps = steps or train["epochs"] * math.ceil(arrays["train_labels"].shape[0] / train["batch_size"])
    hist = res["history"]
    metrics.update(attention=attention, seed=seed, steps=n_steps,
                   seconds_per_step=hist[-1]["elapsed"] / n_steps if hist else float("nan"),
                   diverged=not (math.isfinite(value) and all(math.isfinite(h["loss"]) for h in hist)),
                   history=hist)
    log.info("%s %s seed %d: %s; %.4f s/step%s", kind, attention, seed,
             ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k in ("valid_ppl", "test_accuracy")),
             metrics["seconds_per_step"], " (DIVERGED)" if metrics["diverged"] else "")
    save_checkpoint(model, kind, arch, data, metrics, checkpoint_out, metrics_out)


# -- analysis ---------------------------------------------------------------------------
def analyse_run(kind: str, model: dict, data_npz, data_meta, checkpoint, metrics, out, *, n_samples: int,
                quantity: str = "probs", organize_params: dict | None = None, questionnaire2d_iters: int = 10,
                head_top_k: int = 400, network_top_k: int = 100, paraproduct_samples: int = 1,
                device="auto") -> None:
    """Attention maps, organization and entropies of one run, and for a softmax run the
    paraproduct residual of its heads; written to the directory `out`.

    `out` holds attention/, organized/, decomposed/ (one store per sample, as the workflow
    writes them), entropy.zarr (head_entropy, head_sparsity: (sample, layer, head)) and,
    for a softmax run, paraproduct.zarr: relative residual of every head of the first
    `paraproduct_samples` samples, organized by the 2-D questionnaire (rel_residual) and
    unorganized (rel_residual_unorganized), (sample, layer, head),
    computed on the pre-softmax scores (SPEC 5). A diverged run (metrics "diverged")
    gets an entropy.zarr of NaN and no maps. `model` needs name, data and extract.seed.
    """

    m = json.loads(Path(metrics).read_text())
    slice_ = {"model": model["name"], "attention": m["attention"], "seed": m["seed"], "quantity": quantity}
    with store.atomic_output(out) as tmp:
        tmp.mkdir(parents=True)
        if m.get("diverged"):
            log.warning("%s %s seed %d diverged: no attention maps to analyse", model["name"],
                        m["attention"], m["seed"])
            _diverged_entropy(checkpoint, kind, tmp / "entropy.zarr", n_samples, slice_)
            return
        mcfg = {"name": model["name"], "kind": kind, "data": model.get("data", {}),
                "extract": {"n_samples": n_samples, "seed": model.get("extract", {}).get("seed", 0)}}
        decs = []
        for s in range(n_samples):
            att, org, dec = (tmp / d / f"sample{s}.zarr" for d in ("attention", "organized", "decomposed"))
            for p in (att, org, dec):
                p.parent.mkdir(exist_ok=True)
            extract(kind, mcfg, data_npz, data_meta, checkpoint, att, s, device=device, config_slice=slice_)
            organize(att, org, quantity, params=organize_params or {}, config_slice=slice_)
            # one figure head: decompose's paraproduct is not what is analysed here
            decompose(att, org, dec, quantity, figure_heads=[[0, 0]],
                      questionnaire2d_iters=questionnaire2d_iters, random_tree_seeds=1, config_slice=slice_)
            decs.append(dec)
        entropy(decs, tmp / "entropy.zarr", head_top_k, network_top_k, config_slice=slice_)
        if m["attention"] == "softmax" and paraproduct_samples > 0:
            _paraproduct_residuals([tmp / "attention" / f"sample{s}.zarr"
                                    for s in range(min(paraproduct_samples, n_samples))],
                                   tmp / "paraproduct.zarr", questionnaire2d_iters, slice_)


def _diverged_entropy(checkpoint, kind, path, n_samples, slice_):
    ck = load_checkpoint(checkpoint)
    arch = ck["arch"]
    n_layer, n_head = ((arch.get("n_layer", 4), arch.get("n_head", 4)) if kind == "txl"
                       else (arch.get("num_layers", 4), arch.get("num_heads", 4)))
    nan = np.full((n_samples, n_layer, n_head), np.nan)
    ds = xr.Dataset({"head_entropy": (("sample", "layer", "head"), nan),
                     "head_sparsity": (("sample", "layer", "head"), nan.copy())},
                    coords={"sample": np.arange(n_samples), "layer": np.arange(n_layer), "head": np.arange(n_head)},
                    attrs={"diverged": 1, **store.provenance_attrs(slice_)})
    store.write_store(ds, path)


def _paraproduct_residuals(attention_stores, out, n_iters, slice_):
    from .paraproduct import paraproduct
    from .questionnaire import questionnaire2d

    rel = []
    for path in attention_stores:
        scores = store.read_store(path, require=("scores",), finite=("scores",))["scores"]
        n_layer, n_head = scores.sizes["layer"], scores.sizes["head"]
        r = np.empty((n_layer, n_head, 2))
        for layer in range(n_layer):
            for head in range(n_head):
                f = np.ascontiguousarray(scores.values[layer, head], dtype=np.float64)
                tr, tc = questionnaire2d(f.astype(np.float32), n_iters=n_iters)
                r[layer, head, 0] = paraproduct(f, row_order=tr.order, col_order=tc.order).relative_residual
                r[layer, head, 1] = paraproduct(f).relative_residual
        rel.append(r)
        log.info("paraproduct residual, %s: organized median %.4f, unorganized median %.4f",
                 Path(path).name, np.median(r[..., 0]), np.median(r[..., 1]))
    rel = np.stack(rel)
    dims = ("sample", "layer", "head")
    ds = xr.Dataset({"rel_residual": (dims, rel[..., 0]), "rel_residual_unorganized": (dims, rel[..., 1])},
                    coords={"sample": np.arange(rel.shape[0]), "layer": np.arange(rel.shape[1]),
                            "head": np.arange(rel.shape[2])},
                    attrs=store.provenance_attrs(slice_, quantity="scores", questionnaire2d_iters=n_iters))
    store.write_store(ds, out)


# -- Table 5 and Figure 8 ----------------------------------------------------------------
def run_metric(kind: str) -> tuple[str, str]:
    """(metrics key, label) of a model kind's quality measure."""
    return ("valid_ppl", "validation perplexity") if kind == "txl" else ("test_accuracy", "test accuracy")


def _spread(x: np.ndarray) -> dict:
    ok = x[np.isfinite(x)]
    if not ok.size:
        return {"mean": np.nan, "sd": np.nan, "min": np.nan, "max": np.nan}
    return {"mean": float(ok.mean()), "sd": float(ok.std(ddof=1)) if ok.size > 1 else 0.0,
            "min": float(ok.min()), "max": float(ok.max())}


def table5(runs: list[dict], out_csv, out_md, out_fig) -> None:
    """Table 5 and Figure 8 from every run of the experiment.

    runs: dicts with model, kind, attention, seed, metrics (metrics.json path) and
    analysis (the directory `analyse_run` wrote). One table row per (model, attention),
    in the order the runs are given (softmax first).
    """
    import pandas as pd

    if not runs:
        raise ValueError("runs: the experiment has no runs (softmax_free.models and variants)")
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["attention"]), []).append(r)
    rows, dists = [], {}
    for (model, attention), rs in groups.items():
        kind = rs[0]["kind"]
        key, label = run_metric(kind)
        ms = [json.loads(Path(r["metrics"]).read_text()) for r in rs]
        values = np.array([m.get(key, np.nan) for m in ms], dtype=float)
        ent, spa, pp = [], [], []
        for r in rs:
            e = store.read_store(Path(r["analysis"]) / "entropy.zarr", require=("head_entropy", "head_sparsity"))
            ent.append(e["head_entropy"].values.ravel())
            spa.append(e["head_sparsity"].values.ravel())
            ppath = Path(r["analysis"]) / "paraproduct.zarr"
            if ppath.exists():
                p = store.read_store(ppath, require=("rel_residual", "rel_residual_unorganized"))
                pp.append(np.stack([p["rel_residual"].values.ravel(), p["rel_residual_unorganized"].values.ravel()], 1))
        ent, spa = np.concatenate(ent), np.concatenate(spa)
        dists[(model, attention)] = {"entropy": ent[np.isfinite(ent)], "sparsity": spa[np.isfinite(spa)],
                                     "paraproduct": np.concatenate(pp) if pp else None}
        s = _spread(values)
        row = {"model": model, "attention": attention, "metric": label, "seeds": len(rs),
               "steps": int(ms[0].get("steps", 0)),
               "diverged": int(sum(bool(m.get("diverged")) for m in ms)),
               **s, "s_per_step": float(np.nanmean([m.get("seconds_per_step", np.nan) for m in ms])),
               "head_entropy_median": float(np.median(ent[np.isfinite(ent)])) if np.isfinite(ent).any() else np.nan,
               "head_sparsity_median": float(np.median(spa[np.isfinite(spa)])) if np.isfinite(spa).any() else np.nan}
        if pp:
            allpp = np.concatenate(pp)
            row["paraproduct_organized"] = float(np.median(allpp[:, 0]))
            row["paraproduct_unorganized"] = float(np.median(allpp[:, 1]))
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in ("paraproduct_organized", "paraproduct_unorganized"):
        if col not in df:
            df[col] = np.nan
    soft = df[df["attention"] == "softmax"].set_index("model")["mean"]
    df.insert(df.columns.get_loc("max") + 1, "delta_vs_softmax",
              [r["mean"] - soft.get(r["model"], np.nan) for _, r in df.iterrows()])
    store.atomic_write_text(out_csv, df.to_csv(index=False))
    store.atomic_write_text(out_md, _table5_markdown(df))
    plots.save(fig8_softmax_free(dists), out_fig)
    log.info("Table 5: %d rows over %d runs", len(df), len(runs))


def _table5_markdown(df) -> str:
    show = df.copy()
    show["quality (mean ± sd)"] = [f"{m:.4g} ± {s:.2g}" if np.isfinite(m) else "n/a"
                                   for m, s in zip(show["mean"], show["sd"])]
    show["min–max"] = [f"{a:.4g}–{b:.4g}" if np.isfinite(a) else "n/a" for a, b in zip(show["min"], show["max"])]
    show["paraproduct residual (organized / unorganized)"] = [
        f"{a:.3g} / {b:.3g}" if np.isfinite(a) else "" for a, b in
        zip(show["paraproduct_organized"], show["paraproduct_unorganized"])]
    cols = ["model", "attention", "metric", "seeds", "steps", "quality (mean ± sd)", "min–max", "delta_vs_softmax",
            "diverged", "s_per_step", "head_entropy_median", "head_sparsity_median",
            "paraproduct residual (organized / unorganized)"]
    return (show[cols].to_markdown(index=False, floatfmt=".4g") +
            "\n\nquality: validation perplexity (Transformer-XL, lower is better) or test accuracy (ViT, "
            "higher is better) over the training seeds; delta_vs_softmax: difference of the means; "
            "s_per_step: training seconds per optimizer step on this machine. Head entropy (the paper's "
            "coarse l1 entropy) and sparsity (l1/l2 of all bi-Haar coefficients, lower is sparser) are "
            "medians over every head, sample and seed of the organized probs (softmax or normalised T). "
            "Paraproduct residual: median over the softmax heads of the relative residual of their "
            "paraproduct approximation (SPEC 5) on their scores, organized by the 2-D questionnaire and "
            "unorganized. s_per_step is measured on a shared machine; bench/attention.py times one layer.\n")


def fig8_softmax_free(dists: dict):
    """Figure 8: head entropy and sparsity distributions per attention variant, one row per
    model, and the paraproduct residuals of the softmax heads.

    dists: {(model, attention): {"entropy": (n,), "sparsity": (n,), "paraproduct": (n, 2) or None}}.
    """

    @plots.styled
    def build():
        models = list(dict.fromkeys(m for m, _ in dists))
        has_pp = any(v["paraproduct"] is not None for v in dists.values())
        ncol = 3 if has_pp else 2
        fig = plots.new_figure(4.2 * ncol, 3.4 * len(models))
        axes = np.atleast_2d(fig.subplots(len(models), ncol, squeeze=False))
        for i, model in enumerate(models):
            names = [a for (m, a) in dists if m == model]
            for j, (key, label) in enumerate((("entropy", "head l1 entropy (coarse Haar)"),
                                               ("sparsity", "head sparsity l1/l2 (lower = sparser)"))):
                ax = axes[i, j]
                data = [dists[(model, a)][key] for a in names]
                pos = [p for p, d in enumerate(data) if d.size]
                if pos:
                    ax.boxplot([data[p] for p in pos], positions=pos, widths=0.6, showfliers=True,
                               flierprops={"markersize": 2})
                ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
                ax.set_xlim(-0.6, len(names) - 0.4)
                ax.set_ylabel(label)
                ax.set_title(f"{model}: {key}")
                ax.grid(True, axis="y")
                pooled = np.concatenate([d for d in data if d.size] or [np.ones(1)])
                if key == "entropy" and pooled.min() > 0 and pooled.max() / pooled.min() > 30:
                    ax.set_yscale("log")
            if has_pp:
                ax = axes[i, 2]
                pp = dists.get((model, "softmax"), {}).get("paraproduct")
                if pp is not None and pp.size:
                    ax.boxplot([pp[:, 0], pp[:, 1]], positions=[0, 1], widths=0.6)
                    if pp.min() > 0 and pp.max() / pp.min() > 30:
                        ax.set_yscale("log")
                ax.set_xticks([0, 1], ["organized", "unorganized"])
                ax.set_ylabel("relative residual")
                ax.set_title(f"{model}: paraproduct of softmax heads")
                ax.grid(True, axis="y")
        fig.suptitle("Softmax vs Tensor Attention: head entropy and sparsity (all heads, samples, seeds)")
        return fig

    return build()
