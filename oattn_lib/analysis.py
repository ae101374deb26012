"""`analyze`: the workflow's analysis of one model on a user's prompts, from a notebook in one call.

The analysis of docs/method.md §5-§8, §13 and §14.

`analyze(model, prompts)` extracts every head's attention on each prompt, organizes each sample's
network tensor, expands it in Haar bases and measures it, with the workflow's own stage functions
on stores in a working directory (`stages.organize`, `stages.decompose`, `stages.entropy`,
`stages.tables`, `stages.stability`, `heads`, and the claims of `stages.summary`), so every number
it shows is the number the workflow stores for the same model, prompts and settings. Settings are
the sections of the workflow's config, validated against its schema, defaults included.

The `Analysis` it returns holds the per-head table (`heads`, and `head_summary` across prompts),
Tables 1 and 2, the claims the prompts decide (`claims`), one head drawn inline (`show`), the
explorer page (`page`) and an HTML summary for a notebook.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .kernel_notice import announces_kernels

log = logging.getLogger("oattn")

__all__ = ["Analysis", "analyze"]


def _compile_kernels() -> None:
    from .stages.kernels import compile_kernels

    compile_kernels()


def _progress_enabled(progress) -> bool:
    """`progress` as given, or None: on in a terminal and in a notebook's kernel, off otherwise
    (a log file, a test, a pipe)."""
    if progress is not None:
        return bool(progress)
    if "ipykernel" in sys.modules:
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _bar(items, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not enabled, leave=False)


@dataclass(eq=False)
class Analysis:
    """The analysis of one model on a set of samples (`analyze`'s result).

    Attributes
    ----------
    model : str
        The model's name.
    kind : str
        The kind of model the samples came from (the `kind` attribute of the first: "hf" for
        `api.extract`'s), as the workflow's claims read it.
    attention : list of xarray.Dataset
        Each sample's attention, as `api.extract` returns it.
    heads : pandas.DataFrame
        One row per (sample, layer, head): every per-head measure the workflow stores
        (`heads.SAMPLE_COLUMNS`), as `results/<model>/heads.parquet` holds it.
    head_summary : pandas.DataFrame
        One row per head over the samples, with each number's interval (`heads.head_summary`),
        as `results/<model>/heads_summary.parquet` holds it.
    table1, table2 : pandas.DataFrame
        Tables 1 and 2 (docs/method.md §6.4).
    entropy : xarray.Dataset
        The entropy store.
    stability : xarray.Dataset or None
        The stability store, where replicates ran.
    settings : dict
        Every setting used, by config section.
    directory : pathlib.Path
        Where the stores are (a temporary directory removed with the object, unless `workdir`
        was given).
    quantity : {"scores", "probs"}
        What was organized and measured.
    """

    model: str
    kind: str
    attention: list
    heads: pd.DataFrame
    head_summary: pd.DataFrame
    table1: pd.DataFrame
    table2: pd.DataFrame
    entropy: xr.Dataset
    stability: xr.Dataset | None
    settings: dict
    directory: Path
    quantity: str
    _claims: pd.DataFrame | None = field(default=None, repr=False)
    _keep: object = field(default=None, repr=False)

    # -- the stores ------------------------------------------------------------------------------
    def _paths(self, what: str) -> list[Path]:
        return [self.directory / f"{what}{i}.zarr" / "zarr.json" for i in range(len(self.attention))]

    def organization(self, prompt: int = 0) -> xr.Dataset:
        """The organized store of one sample (`api.organize`'s Dataset).

        Parameters
        ----------
        prompt : int, default 0
            The sample's index (negative from the end).

        Returns
        -------
        xarray.Dataset
            The trees' int64 labels `tree_q` (level_q, query), `tree_k` (level_k, key), `tree_h`
            (level_h, unit) and the float32 affinities `affinity_q` (query, query_), `affinity_k`
            (key, key_), `affinity_h` (unit, unit_).

        Raises
        ------
        ValueError
            If `prompt` is not the index of a sample.
        """
        from . import store

        return store.read_store(self._paths("organized")[self._prompt(prompt)])

    def _prompt(self, prompt) -> int:
        n = len(self.attention)
        if isinstance(prompt, bool) or not isinstance(prompt, (int, np.integer)) or not -n <= prompt < n:
            raise ValueError(f"prompt: expected a sample index in 0..{n - 1}, got {prompt!r}")
        return int(prompt) % n

    # -- claims ------------------------------------------------------------------------------------
    @property
    def claims(self) -> pd.DataFrame:
        """The claims these samples decide on this model alone (docs/method.md §13).

        `stages.summary.PROMPT_KEYS`: sparsity against two baselines, bottom and top recurrence,
        Table 2's numbers, the heads' diffusion map, tested as the workflow's claims table tests
        them, Holm-corrected among themselves. Computed on first use.

        Returns
        -------
        pandas.DataFrame
            One row per claim, as the workflow's claims table holds it.
        """
        if self._claims is None:
            from .stages.summary import prompt_claims

            d = self.directory
            self._claims = prompt_claims(
                self.model, self.kind, d / "entropy.zarr" / "zarr.json", d / "table1.csv", self._paths("decomposed"),
                fraction=self.settings["entropy"]["fraction"], claims=self.settings["claims"],
                stability_store=(d / "stability.zarr" / "zarr.json") if self.stability is not None else None)
        return self._claims

    # -- one head ------------------------------------------------------------------------------------
    def show(self, layer: int, head: int, prompt: int = 0, *, max_labels: int = 48):
        """One head of one sample, drawn with its trees and its paraproduct residual (docs/method.md §5, §7).

        As the model computed it, in the network's organized order with the query and key
        trees' coarse folders drawn, and its paraproduct residual in its own 2-D organization,
        tokens as labels.

        Parameters
        ----------
        layer, head : int
            The model's indices of the head.
        prompt : int, default 0
            The sample.
        max_labels : int, default 48
            Up to this many tokens are written on the axes; longer samples get thinned ticks.

        Returns
        -------
        matplotlib.figure.Figure
            The head's views.

        Raises
        ------
        ValueError
            If `layer` or `head` is not one of those analysed, or `prompt` not a sample's index.
        """
        from .api import paraproduct_residual
        from .explorer.collect import shown_tokens
        from .plots.intrinsic import head_view

        i = self._prompt(prompt)
        sample = self.attention[i]
        for name, value in (("layer", layer), ("head", head)):
            have = sample[name].values.tolist()
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) not in have:
                raise ValueError(f"{name}: {value!r} is not one of the analysed {name}s {have}")
        org = self.organization(i)
        raw = sample[self.quantity].sel(layer=layer, head=head).transpose("query", "key").values
        tokens = (shown_tokens([str(t) for t in sample["token_text"].values]) if "token_text" in sample.coords
                  else [str(q) for q in sample["query"].values])
        residual, note = None, "no pre-softmax scores: no paraproduct (docs/method.md §7)"
        if "scores" in sample.data_vars:
            pp = paraproduct_residual(sample, int(layer), int(head),
                                      n_iters=self.settings["decompose"]["questionnaire2d_iters"])
            residual = (pp["residual"].values, pp["query"].values, pp["key"].values,
                        float(pp["relative_residual"]), float(pp["relative_residual_original"]))
            note = ""
        row = self.heads[(self.heads["sample"] == sample.attrs.get("sample", i)) & (self.heads["layer"] == layer)
                         & (self.heads["head"] == head)]
        entropy = float(row["head_entropy"].iloc[0]) if len(row) else float("nan")
        title = (f"{self.model}: layer {layer}, head {head}, prompt {i} ({self.quantity}); Haar entropy "
                 f"{entropy:.4g}")
        return head_view(raw, org["tree_q"].values, org["tree_k"].values, tokens, residual=residual, note=note,
                         title=title, value_label=self.quantity, max_labels=max_labels)

    # -- the page ------------------------------------------------------------------------------------
    def page(self, path, *, heads_2d: int | None = None, max_side: int | None = None,
             data_mb: float | None = None) -> Path:
        """Write the explorer page of these samples, whatever their lengths.

        One self-contained HTML file: the workflow's explorer stage on the stores already
        computed.

        Parameters
        ----------
        path : str or os.PathLike
            The HTML file written.
        heads_2d : int, optional
            The workflow's `explorer.heads_2d`; default this analysis's.
        max_side : int, optional
            The workflow's `explorer.max_side`; default this analysis's.
        data_mb : float, optional
            The workflow's `explorer.data_mb`; default this analysis's.

        Returns
        -------
        pathlib.Path
            `path`.
        """
        from .config import section_settings
        from .stages.explorer import explorer

        given = {k: v for k, v in (("heads_2d", heads_2d), ("max_side", max_side), ("data_mb", data_mb))
                 if v is not None}
        settings = section_settings("explorer", {**self.settings["explorer"], **given})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        d = self.directory
        explorer(self.model, self.kind, self._paths("attention"), self._paths("organized"), self._paths("decomposed"),
                 d / "entropy.zarr" / "zarr.json", d / "table1.csv", d / "table2.csv", path, quantity=self.quantity,
                 figure_heads=self.settings["decompose"]["figure_heads"],
                 questionnaire2d_iters=self.settings["decompose"]["questionnaire2d_iters"], **settings)
        return path

    # -- display -------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        n_l, n_h = self.entropy.sizes["layer"], self.entropy.sizes["head"]
        lengths = sorted({s.sizes["query"] for s in self.attention})
        return (f"Analysis({self.model!r}: {len(self.attention)} samples of {lengths[0]}"
                + (f"-{lengths[-1]}" if len(lengths) > 1 else "") + f" tokens, {n_l} x {n_h} heads, {self.quantity})")

    def _repr_html_(self) -> str:
        from html import escape

        from .heads import SUMMARY_INTERVAL

        s = self.head_summary
        cols = ["layer", "head", "entropy_mean", "entropy_low", "entropy_high", "rank_mean", "bottom_count",
                "top_count"]
        low = s.head(5)[cols].to_html(index=False, float_format=lambda x: f"{x:.4g}")
        high = s.tail(5)[cols].to_html(index=False, float_format=lambda x: f"{x:.4g}")
        t2 = self.table2[["sample", "network_entropy", "network_sparsity", "network_sparsity_random_trees",
                          "network_sparsity_natural_trees"]].to_html(index=False, float_format=lambda x: f"{x:.4g}")
        return (f"<div><p><b>{escape(repr(self))}</b></p>"
                f"<p>Lowest mean Haar entropy (intervals: {SUMMARY_INTERVAL:.0%} bootstrap over the samples)</p>{low}"
                f"<p>Highest</p>{high}<p>Network sparsity (Table 2)</p>{t2}"
                "<p><code>.heads</code>, <code>.head_summary</code>, <code>.claims</code>, "
                "<code>.show(layer, head)</code>, <code>.page(path)</code></p></div>")


@announces_kernels(ahead=_compile_kernels)
def analyze(model, prompts=None, *, max_length: int | None = None, chat: bool = False, layers=None, heads=None,
            quantity: str | None = None, masked: str | None = None, organize: dict | None = None,
            decompose: dict | None = None, entropy: dict | None = None, stability: dict | bool | None = None,
            claims: dict | None = None, explorer: dict | None = None, device: str | None = None,
            name: str | None = None, progress: bool | None = None, workdir=None) -> Analysis:
    """Analyse one model on a set of prompts, or attention already extracted, as the workflow does.

    Parameters
    ----------
    model : str, os.PathLike, (model, tokenizer), xarray.Dataset or list of them
        A Hugging Face model directory, hub name (in the local cache) or alias, as
        `api.extract` takes it; a (model, tokenizer) pair of any loaded Hugging Face model; or
        attention already extracted: Datasets laid out as `api.extract` returns them (from
        `oattn_lib.adapters` for TransformerLens and nnsight), with `prompts` None.
    prompts : list of str
        The texts, one sample each, of any lengths.
    max_length : int, optional
        As in `api.extract`.
    chat : bool, default False
        As in `api.extract`.
    layers, heads : list of int, optional
        As in `api.extract`.
    quantity : {"scores", "probs"}, optional
        What is organized and measured; default the workflow's `extract.quantity`.
    masked : {"row_mean", "keep"}, optional
        The rule for the scores' masked entries (docs/method.md §9.5); default the workflow's
        `extract.masked`.
    organize, decompose, entropy : dict, optional
        The keys of the workflow's config sections of those names; unset keys take the schema's
        defaults, and a bad key is a `ConfigError` naming it.
    stability : dict or bool, optional
        A model's `stability` section (True: its defaults): replicate analyses under
        perturbations that carry no information (docs/method.md §14), which give every number of
        `head_summary` and Table 1 its range over replicates and the claims their numerical
        replication. They cost an organize and a decompose per replicate.
    claims, explorer : dict, optional
        As `organize`: the keys of the workflow's `claims` and `explorer` sections.
    device : str, optional
        "auto", "cpu" or "cuda"; default the workflow's `device`.
    name : str, optional
        The model's name in tables and the page; default the model's own.
    progress : bool, optional
        Progress bars over the samples; default on in a terminal or notebook, off otherwise.
    workdir : str or os.PathLike, optional
        Where the stores are written (kept); default a temporary directory removed with the
        result.

    Returns
    -------
    Analysis
        The tables, the stores and what draws them.

    Raises
    ------
    ValueError
        Naming the argument at fault, before any model runs where it can be known then.
    """
    from .config import section_settings

    settings = {"extract": section_settings("$defs/extract", {k: v for k, v in (("quantity", quantity),
                                                                                ("masked", masked)) if v is not None}),
                "organize": section_settings("organize", organize),
                "decompose": section_settings("decompose", decompose),
                "entropy": section_settings("entropy", entropy), "claims": section_settings("claims", claims),
                "explorer": section_settings("explorer", explorer),
                "stability": (None if stability in (None, False) else
                              section_settings("$defs/stability", {} if stability is True else stability))}
    quantity = settings["extract"]["quantity"]
    masked = settings["extract"]["masked"] if quantity == "scores" else "keep"
    device = _resolved_device(device)
    show = _progress_enabled(progress)
    samples = _attention(model, prompts, max_length=max_length, chat=chat, layers=layers, heads=heads,
                         device=device, show=show)
    if quantity not in samples[0].data_vars:
        raise ValueError(f"quantity: the samples hold no {quantity!r} (they hold {sorted(samples[0].data_vars)})")
    name = name or str(samples[0].attrs.get("model", "model"))
    kind = str(samples[0].attrs.get("kind", "attention"))
    keep = None
    if workdir is None:
        keep = tempfile.TemporaryDirectory(prefix="oattn-analysis-")
        directory = Path(keep.name)
    else:
        directory = Path(workdir)
        directory.mkdir(parents=True, exist_ok=True)
    stab = _run_stages(samples, directory, settings, quantity=quantity, masked=masked, name=name, device=device,
                       show=show)
    from . import store
    from .heads import heads_files

    d = directory
    rows, summary = heads_files(d / "entropy.zarr" / "zarr.json", [d / f"decomposed{i}.zarr" / "zarr.json"
                                                                    for i in range(len(samples))],
                                d / "heads.parquet", d / "heads_summary.parquet", model=name,
                                fraction=settings["entropy"]["fraction"], stability_store=stab,
                                bootstrap=settings["claims"]["bootstrap"], seed=settings["claims"]["seed"])
    result = Analysis(model=name, kind=kind, attention=samples, heads=rows, head_summary=summary,
                      table1=pd.read_csv(d / "table1.csv"), table2=pd.read_csv(d / "table2.csv"),
                      entropy=store.read_store(d / "entropy.zarr" / "zarr.json"),
                      stability=store.read_store(stab) if stab is not None else None, settings=settings,
                      directory=directory, quantity=quantity, _keep=keep)
    if keep is not None:
        weakref.finalize(result, keep.cleanup)
    return result


def _resolved_device(device):
    """The torch device `device` names; None: the workflow's `device`."""
    from .config import SCHEMA, load_schema
    from .runtime import resolve_device

    device = device or load_schema(SCHEMA)["properties"]["device"]["default"]
    try:
        return resolve_device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device: {exc}") from None


def _attention(model, prompts, *, max_length, chat, layers, heads, device, show) -> list[xr.Dataset]:
    """Each sample's attention: extracted from the model on the prompts, or given."""
    from . import api

    given = [model] if isinstance(model, xr.Dataset) else model
    if isinstance(given, (list, tuple)) and given and all(isinstance(s, xr.Dataset) for s in given):
        if prompts is not None:
            raise ValueError("prompts: attention was given already extracted; pass prompts=None")
        for i, s in enumerate(given):
            if "query" not in s.dims or not ({"scores", "probs"} & set(s.data_vars)):
                raise ValueError(f"model: sample {i} is not laid out as api.extract returns it (variables scores or "
                                 f"probs over (layer, head, query, key)); it has {sorted(s.data_vars)}")
        return [s.assign_attrs(sample=i) for i, s in enumerate(given)]
    if prompts is None or isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: expected a non-empty list of strings"
                         + (" (wrap a single prompt in a list)" if isinstance(prompts, str) else ""))
    if isinstance(model, (str, os.PathLike)):
        from .models.hf_recording import load_hf

        net, tok = load_hf(str(model), device=device)
        pair, label = (net, tok), str(model)
    else:
        pair, label = model, None
    out = []
    for i, prompt in enumerate(_bar(prompts, show, "extract")):
        s = api.extract(pair, [prompt], max_length=max_length, chat=chat, layers=layers, heads=heads)[0]
        out.append(s.assign_attrs(sample=i, **({"model": label} if label else {})))
    return out


def _run_stages(samples, d: Path, settings: dict, *, quantity, masked, name, device, show):
    """The workflow's stages on the samples, in `d`: attention, organized and decomposed stores,
    the entropy store, Tables 1 and 2, and the stability store where it runs (its path, or None)."""
    from .api import DECOMPOSE_KEYS, as_attention_store
    from .stages.decompose import decompose
    from .stages.entropy import entropy
    from .stages.organize import organize
    from .stages.tables import tables
    from .store import write_store

    n = len(samples)
    att = [write_store(as_attention_store(s, i), d / f"attention{i}.zarr") / "zarr.json" for i, s in enumerate(samples)]
    org = [d / f"organized{i}.zarr" / "zarr.json" for i in range(n)]
    dec = [d / f"decomposed{i}.zarr" / "zarr.json" for i in range(n)]
    analysis = {"quantity": quantity, "crop": None, "masked": masked}
    dset, eset = settings["decompose"], settings["entropy"]
    for i in _bar(range(n), show, "organize"):
        organize(att[i], org[i], quantity, None, params=settings["organize"],
                 config_slice={**analysis, "organize": settings["organize"]}, device=device, masked=masked)
    kept = {k: dset[k] for k in DECOMPOSE_KEYS}
    # the decomposed stores keep at least the coarsest coefficients the entropies read
    kept["coarse_coefficients"] = max(kept["coarse_coefficients"], eset["head_top_k"], eset["network_top_k"])
    for i in _bar(range(n), show, "decompose"):
        decompose(att[i], org[i], dec[i], quantity, None, figure_heads=dset["figure_heads"],
                  config_slice={**analysis, "decompose": dset}, device=device, masked=masked, **kept)
    ent = d / "entropy.zarr" / "zarr.json"
    entropy(dec, ent, eset["head_top_k"], eset["network_top_k"], config_slice={"entropy": eset})
    stab = None
    if settings["stability"] is not None:
        from .stages.stability import stability

        s = settings["stability"]
        chosen = list(range(n)) if s["samples"] == "all" else list(range(min(int(s["samples"]), n)))
        stab = d / "stability.zarr" / "zarr.json"
        stability([att[i] for i in chosen], [org[i] for i in chosen], [dec[i] for i in chosen], ent, stab,
                  d / "stability.csv", d / "stability.md", samples=chosen, quantity=quantity, crop=None,
                  organize=settings["organize"], head_top_k=eset["head_top_k"], network_top_k=eset["network_top_k"],
                  settings=s, fraction=eset["fraction"], questionnaire2d_iters=dset["questionnaire2d_iters"],
                  model_name=name, device=device, masked=masked)
    tables(ent, d / "table1.csv", d / "table1.md", d / "table2.csv", d / "table2.md", fraction=eset["fraction"],
           model_name=name, organized_stores=org, out_head_tree_csv=d / "head_tree.csv", stability_store=stab)
    return stab
