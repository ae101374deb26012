"""Stage `stability`: replicate analyses of a model's samples under perturbations that carry no
information, a bootstrap over its samples, and a table of how far each measure moves
(docs/method.md §14)."""
from __future__ import annotations

import logging

import numpy as np
import torch
import xarray as xr

from .. import store
from ..entropy import clamped_top_k, coarse_l1, l1_over_l2
from ..haar import bihaar, haar_basis, trihaar
from ..diffusion import diffusion_map
from ..questionnaire import questionnaire3d, questionnaire2d
from ..runtime import resolve_device
from ..smoothness import theorem1_measures
from ..stability import (FIG_MEASURES, PERTURBATIONS, REFERENCE, head_tree_agreement, perturb, rename_tree, replicate_plan,
                         replicate_rng, same_folders, unit_permutation_back)
from ..network import head_array, load_organization, model_mask, on_device, read_network
from .common import each_sample
from .stability_tables import check_samples, tables_from_replicates

log = logging.getLogger("oattn")

__all__ = ["stability", "stability_sample", "stability_sample_stores", "sample_replicates"]


def _measures(x: np.ndarray, trees, k2: int, k3: int, device, overwrite: bool = False) -> dict:
    """The per-head and network measures of tensor x in trees (tree_q, tree_k, tree_h), as the
    decompose and entropy stages compute them (docs/method.md §6). `overwrite`: x is not needed
    after, and its tri-Haar coefficients are written over it (one copy of x less at the peak)."""
    xv = torch.from_numpy(np.ascontiguousarray(x)).to(resolve_device(device))
    (_, sq, lq), (_, sk, lk), (_, sh, lh) = (haar_basis(t) for t in trees)
    c2 = bihaar(xv, trees[0], trees[1])
    out = {"head_entropy": np.asarray(coarse_l1(c2, [sq, sk], [lq, lk], k2)),
           "head_sparsity": np.asarray(l1_over_l2(c2, (0, 1)).cpu().numpy())}
    del c2
    c3 = trihaar(xv, *trees, overwrite=overwrite)
    del xv
    out["network_entropy"] = float(coarse_l1(c3, [sq, sk, sh], [lq, lk, lh], k3))
    out["network_sparsity"] = float(l1_over_l2(c3.reshape(-1), 0))
    return out


def _figure_measures(g, allowed, row_order, col_order) -> np.ndarray:
    """FIG_MEASURES of one head's scores g in the given orders, as the theorem1 stage measures them
    (`smoothness.theorem1_measures`, in the order of its THEOREM1_MEASURES; residuals beyond float64
    +inf)."""
    vals, why = theorem1_measures(g, row_order, col_order, allowed)
    if why:
        log.info("figure head: %s", why)
    return vals


def _perturbed_figure_measures(heads: list, pert_name: str, rng_of, device="cpu") -> np.ndarray:
    """FIG_MEASURES (fig_head, measure) of each figure head (scores g, allowed mask) after the
    perturbation, with its own 2-D organization of the perturbed scores (docs/method.md §7); NaN
    for sibling (the paraproduct has no Haar basis, so no sibling ranks)."""
    out = []
    for i, (g, allowed, iters) in enumerate(heads):
        if pert_name == "sibling":
            out.append(np.full(len(FIG_MEASURES), np.nan))
            continue
        p = perturb(g[:, :, None], pert_name, rng_of(i))
        gp = p.array[:, :, 0].astype(np.float64)
        ap = allowed
        if p.perms is not None and allowed is not None:
            ap = allowed[np.ix_(p.perms[0], p.perms[1])]
        tr, tc = questionnaire2d(on_device(gp, device), n_iters=iters)
        out.append(_figure_measures(gp, ap, tr.order, tc.order))
    return np.stack(out) if out else np.empty((0, len(FIG_MEASURES)))


def _diffusion_coords(affinity_h, perm) -> np.ndarray:
    """The heads' diffusion coordinates (docs/method.md §8) from a head affinity, in the reference
    unit order (perm: the units' renaming of the replicate, None if none), float32 as decompose
    stores them."""
    dm = diffusion_map(affinity_h, n_components=3)
    return unit_permutation_back(np.asarray(dm.coords, dtype=np.float32), perm)


def sample_replicates(attention_store, organized_store, decomposed_store, *, sample: int, quantity: str, crop=None,
                      organize: dict, head_top_k: int, network_top_k: int, settings: dict,
                      questionnaire2d_iters: int = 10, device="cpu", masked: str = "row_mean") -> xr.Dataset:
    """Every replicate of one sample (`stability.replicate_plan`): its measures and whether its
    trees are the reference's, as a Dataset over (replicate[, unit][, fig_head]). Replicate 0 is
    the reference: the organized store's trees on the unperturbed tensor."""
    net = read_network(attention_store, quantity, crop, masked)
    x = net.array
    org, _ = load_organization(organized_store)
    ref_trees = (org.tree_q, org.tree_k, org.tree_h)
    dec = store.read_store(decomposed_store, require=("network_sparsity_random",), lazy=True)
    random_sparsity = float(dec["network_sparsity_random"].values)
    k2 = clamped_top_k(head_top_k, x.shape[:2], "entropy.head_top_k", str(attention_store))
    k3 = clamped_top_k(network_top_k, x.shape, "entropy.network_top_k", str(attention_store))
    unit_layer = net.unit_layer
    kv = net.coords.get("unit_kv_group")
    unit_kv = kv[1] if kv is not None else None
    figs = []
    if settings["paraproduct"] and "fig_layer" in dec.coords and "paraproduct_not_run" not in dec.attrs:
        att = store.read_store(attention_store, require=("scores",), lazy=True)
        for layer, head in zip(dec["fig_layer"].values, dec["fig_head_index"].values):
            g = head_array(att, "scores", int(layer), int(head), crop, where=attention_store).astype(np.float64)
            figs.append((g, model_mask(att, int(layer), int(head), g, crop), questionnaire2d_iters))
        # the reference: each figure head in decompose's own 2-D organization of it
        ref_fig = np.stack([_figure_measures(g, allowed, ro, co) for (g, allowed, _), ro, co in
                            zip(figs, dec["fig_row_order"].values, dec["fig_col_order"].values)])
    ref_coords = dec["diffusion_coords"].transpose("unit", "component").values if "diffusion_coords" in dec else None
    plan = replicate_plan(settings["perturbations"], settings["replicates"])
    rows = []
    for r, (name, index) in enumerate(plan):
        if name == REFERENCE:
            measured, trees, perms = _measures(x, ref_trees, k2, k3, device), ref_trees, None
            coords = ref_coords
        else:
            rng = replicate_rng(settings["seed"], sample, name, index)
            p = perturb(x, name, rng, settings["ulp_fraction"])
            perms = p.perms
            coords = ref_coords  # sibling: the reference's trees and affinities
            if p.organize:
                o = questionnaire3d(on_device(p.array, device), **organize)
                trees = (o.tree_q, o.tree_k, o.tree_h)
                if ref_coords is not None:
                    coords = _diffusion_coords(o.affinity_h, perms[2] if perms is not None else None)
                if perms is not None:  # relabel: the trees in the reference naming, on the reference tensor
                    trees = tuple(rename_tree(t, np.argsort(pm)) for t, pm in zip(trees, perms))
                    measured, perms = _measures(x, trees, k2, k3, device), None
                else:
                    measured = _measures(p.array, trees, k2, k3, device, overwrite=True)
            else:  # sibling: the reference trees, items renamed
                measured = _measures(p.array, tuple(rename_tree(t, pm) for t, pm in zip(ref_trees, perms)),
                                     k2, k3, device, overwrite=True)
                trees = ref_trees
            del p  # the perturbed tensor (its tri-Haar coefficients, where measured over it)
        pu = perms[2] if perms is not None else None
        row = {"head_entropy": unit_permutation_back(measured["head_entropy"], pu),
               "head_sparsity": unit_permutation_back(measured["head_sparsity"], pu),
               "network_entropy": measured["network_entropy"], "network_sparsity": measured["network_sparsity"],
               "sparsity_ratio": measured["network_sparsity"] / random_sparsity}
        row["ari_layer"], row["ari_kv_group"] = head_tree_agreement(trees[2], unit_layer, net.unit_head, unit_kv)
        for axis, t, t0 in zip("qkh", trees, ref_trees):
            row[f"same_tree_{axis}"] = same_folders(t, t0)
        if coords is not None:
            row["diffusion_coords"] = coords
        if figs:
            # each figure head's own random state, apart from the tensor's (replicate_rng)
            row["fig"] = (ref_fig if name == REFERENCE else _perturbed_figure_measures(
                figs, name, lambda i, n=name, j=index: np.random.default_rng(
                    [int(settings["seed"]), int(sample), PERTURBATIONS.index(n), int(j), 1 + i]), device))
        rows.append(row)
        log.info("sample %d, replicate %d/%d (%s #%d): network entropy %.6g, trees %s", sample, r + 1, len(plan),
                 name, index, row["network_entropy"],
                 "".join(a if row[f"same_tree_{a}"] else "-" for a in "qkh") if name != REFERENCE else "reference")
    data = {k: (("replicate", "unit"), np.stack([rw[k] for rw in rows])) for k in ("head_entropy", "head_sparsity")}
    data |= {k: ("replicate", np.asarray([rw[k] for rw in rows])) for k in
             ("network_entropy", "network_sparsity", "sparsity_ratio", "ari_layer", "ari_kv_group",
              "same_tree_q", "same_tree_k", "same_tree_h")}
    if figs:
        fig = np.stack([rw["fig"] for rw in rows])  # (replicate, fig_head, measure)
        data |= {m: (("replicate", "fig_head"), fig[:, :, i]) for i, m in enumerate(FIG_MEASURES)}
    if ref_coords is not None:
        data["diffusion_coords"] = (("replicate", "unit", "component"), np.stack([rw["diffusion_coords"] for rw in rows]))
    coords = {"perturbation": ("replicate", np.array([p for p, _ in plan], dtype=object)),  # vlen strings in zarr
              "replicate_index": ("replicate", np.asarray([i for _, i in plan], dtype=np.int64)),
              "unit_layer": net.coords["unit_layer"], "unit_head": net.coords["unit_head"]}
    if figs:
        coords |= {"fig_layer": ("fig_head", dec["fig_layer"].values),
                   "fig_head_index": ("fig_head", dec["fig_head_index"].values)}
    ds = xr.Dataset(data, coords=coords)
    ds["head_top_k"], ds["network_top_k"] = k2, k3
    return ds


def stability_sample(attention_store, organized_store, decomposed_store, out, *, sample: int,
                     config_slice: dict | None = None, code: str | None = None, **kwargs) -> None:
    """Stage `stability_sample`: every replicate of one sample (`sample_replicates`, whose keyword
    arguments `kwargs` are), written to the store `out` with its sample index. The samples' jobs
    are independent: they run beside each other and beside the other samples' analyses."""
    ds = sample_replicates(attention_store, organized_store, decomposed_store, sample=sample, **kwargs)
    ds.attrs = {"sample": int(sample), **store.provenance_attrs(config_slice or {}, code=code)}
    store.write_store(ds, out)


def stability_sample_stores(attention_stores: list, organized_stores: list, decomposed_stores: list, outs: list,
                            *, samples: list, **kwargs) -> None:
    """`stability_sample` on each sample in turn: samples[i]'s stores to outs[i] (one job for a
    batch of a small model's samples). Keyword arguments are `stability_sample`'s."""
    each_sample("stability_sample", {"attention stores": attention_stores, "organized stores": organized_stores,
                                     "decomposed stores": decomposed_stores, "sample indices": samples}, outs,
                lambda att, org, dec, s, out: stability_sample(att, org, dec, out, sample=int(s), **kwargs))


def stability(attention_stores: list, organized_stores: list, decomposed_stores: list, entropy_store, out,
              out_csv, out_md, *, samples: list, quantity: str, crop=None, organize: dict, head_top_k: int,
              network_top_k: int, settings: dict, fraction: float = 0.1, questionnaire2d_iters: int = 10,
              model_name: str = "", config_slice: dict | None = None, code: str | None = None,
              device="cpu", masked: str = "row_mean") -> None:
    """`stability_sample` of each of the samples `samples` (attention_stores[i], organized_stores[i]
    and decomposed_stores[i] are sample samples[i]'s) and `stability_tables.stability_tables` in one
    call, the replicates kept in memory: the workflow's two stages as a library user runs them."""
    n = len(samples)
    if not len(attention_stores) == len(organized_stores) == len(decomposed_stores) == n:
        raise ValueError(f"stability: {len(attention_stores)} attention, {len(organized_stores)} organized and "
                         f"{len(decomposed_stores)} decomposed stores for {n} samples; expected one of each per sample")
    ent = check_samples(entropy_store, samples)
    per = []
    for i, s in enumerate(samples):
        log.info("sample %d (%d of %d)", s, i + 1, n)
        per.append(sample_replicates(attention_stores[i], organized_stores[i], decomposed_stores[i], sample=s,
                                     quantity=quantity, crop=crop, organize=organize, head_top_k=head_top_k,
                                     network_top_k=network_top_k, settings=settings,
                                     questionnaire2d_iters=questionnaire2d_iters, device=device, masked=masked))
    tables_from_replicates(per, ent, out, out_csv, out_md, samples=samples, settings=settings, fraction=fraction,
                           model_name=model_name, config_slice=config_slice, code=code)
