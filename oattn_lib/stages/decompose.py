"""Stage `decompose`: bi-/tri-Haar expansions, random-tree baselines, the figure heads' 2-D
organization and paraproduct, and the diffusion map of heads (docs/method.md §3, §6, §7, §8)."""
from __future__ import annotations

import logging
import time

import numpy as np
import torch
import xarray as xr

from .. import store
from ..diffusion import diffusion_map
from ..entropy import coarse_coefficients, l1_norm, l1_over_l2, level_sums
from ..haar import bihaar, haar_basis, trihaar, trihaar_of_bihaar
from ..paraproduct import paraproduct
from ..questionnaire import questionnaire2d
from ..runtime import resolve_device
from ..sweep import empty
from ..trees import balanced_tree, padded_labels, random_tree
from ..units import resolve_unit
from ..network import head_array, load_organization, model_mask, on_device, read_network
from .common import each_sample

log = logging.getLogger("oattn")

__all__ = ["decompose", "decompose_samples"]


def _figure_units(figure_heads, layers, heads) -> list[tuple[int, int]]:
    """The model's (layer, head) of each figure head: positions among the stored ones."""
    try:
        return [resolve_unit(layer, head, layers, heads) for layer, head in figure_heads]
    except ValueError as exc:
        raise ValueError(f"decompose.figure_heads: {exc}") from None


def decompose(attention_store, organized_store, out, quantity: str, crop=None,
              *, figure_heads, questionnaire2d_iters: int, random_tree_seeds: int,
              coarse_coefficients: int = 4096, keep_coefficients: bool = False,
              config_slice: dict | None = None, code: str | None = None, device="cpu",
              masked: str = "row_mean") -> None:
    """bi-Haar per head, tri-Haar of the network, random-tree baselines, the figure heads'
    2-D organization and paraproduct, and the diffusion map of heads (docs/method.md §3, §6, §7, §8). The Haar
    expansions and the figure heads' 2-D questionnaires run on the device `device` resolves to
    (`runtime.resolve_device`). A store without pre-softmax scores gets the figure heads' 2-D
    organization of `quantity` and no paraproduct (NaN, the reason in the attribute
    `paraproduct_not_run`).

    Stored of the expansions (docs/method.md §6.6): the `coarse_coefficients` coarsest bi-Haar
    coefficients of each head and tri-Haar coefficients of the network (coarsest first, with
    their flat indices), the sums of |c| and c^2 per combination of levels (the sparsities
    follow from them exactly), and the figure heads' bi-Haar coefficients; every coefficient
    too (`bihaar`, `trihaar`) with `keep_coefficients`. `masked`: the rule for the scores' masked
    entries in the expansions (`network.read_network`, docs/method.md §9.5); the paraproduct always
    compares with the model's masked softmax (§7.5)."""
    if isinstance(coarse_coefficients, bool) or not isinstance(coarse_coefficients, (int, np.integer)) \
            or coarse_coefficients < 1:
        raise ValueError(f"decompose.coarse_coefficients: expected a positive integer, got {coarse_coefficients!r}")
    net = read_network(attention_store, quantity, crop, masked)
    attrs, coords, a = net.attrs, net.coords, net.array
    del net
    # the figure heads are read one at a time from the store (one chunk per head): the whole
    # store is 2 x 1.1 GB for 270 heads at 1024 tokens
    ds = store.read_store(attention_store, require=(quantity,), lazy=True)
    # Theorem 1 is about the softmax of the pre-softmax scores: without them (attention files of
    # probabilities) the figure heads get their 2-D organization and no paraproduct
    no_scores = None if "scores" in ds.variables else (f"{store.store_path(attention_store)} holds no pre-softmax "
                                                       "scores (attention files of probabilities only)")
    org, ods = load_organization(organized_store)
    shape = a.shape
    units = _figure_units(figure_heads, ds["layer"].values, ds["head"].values)
    position = {(int(la), int(h)): i for i, (la, h) in enumerate(zip(coords["unit_layer"][1], coords["unit_head"][1]))}
    figure_positions = [position[(int(la), int(h))] for la, h in units]
    # the figure heads' attention, copied out: the tri-Haar coefficients overwrite the tensor
    originals = [a[:, :, u].copy() for u in figure_positions]
    xv = torch.from_numpy(a).to(resolve_device(device))
    del a
    # the random-tree baselines first, then the natural order's, one after another in one buffer
    # (fresh memory for each would page-fault a tensor's size every time), freed before the coefficients
    # that are kept: at 1024 tokens x 270 heads every expansion is 1.1 GB, and computing the
    # baselines beside the kept bi- and tri-Haar coefficients made the peak one expansion higher
    rng = np.random.default_rng(0)
    rand_l1, rand_ratio = [], []
    t = time.perf_counter()
    buf = empty(xv.shape, xv)
    for _ in range(random_tree_seeds):
        trihaar(xv, *(random_tree(n, rng) for n in xv.shape), out=buf)
        rand_l1.append(l1_norm(buf))
        rand_ratio.append(float(l1_over_l2(buf.reshape(-1), 0)))
    # the natural-order baseline: the same balanced trees over the tokens and heads in their own
    # order, which keeps locality and changes only the trees' shape (docs/method.md §6.3)
    trihaar(xv, *(balanced_tree(np.arange(n)) for n in xv.shape), out=buf)
    natural_l1, natural_ratio = l1_norm(buf), float(l1_over_l2(buf.reshape(-1), 0))
    del buf
    log.info("decompose %s: random-tree baselines (%d seeds) and the natural order's, %.0f s", shape,
             random_tree_seeds, time.perf_counter() - t)
    t = time.perf_counter()
    (_, sq, lq), (_, sk, lk), (_, sh, lh) = (haar_basis(t) for t in (org.tree_q, org.tree_k, org.tree_h))
    # the tensor is not needed any more: the bi-Haar coefficients are written over it, what is
    # kept of them taken, and the head axis's sweep turns them into the tri-Haar coefficients in
    # place (the tri-Haar expansion is the bi-Haar one swept along the heads, bit for bit: two
    # sweeps of the tensor fewer, and never a second copy of it)
    c2 = bihaar(xv, org.tree_q, org.tree_k, overwrite=True)
    del xv
    bi, (vq, vk) = _bihaar_kept(c2, (sq, sk), (lq, lk), coarse_coefficients, figure_positions)
    if keep_coefficients:  # a copy: the tri-Haar coefficients overwrite these
        bi["bihaar"] = (("qbasis", "kbasis", "unit"), c2.numpy().copy() if c2.device.type == "cpu" else c2.cpu().numpy())
    c3 = trihaar_of_bihaar(c2, org.tree_h, overwrite=True)
    del c2
    tri, vh = _trihaar_kept(c3, (sq, sk, sh), (lq, lk, lh), coarse_coefficients)
    if keep_coefficients:
        tri["trihaar"] = (("qbasis", "kbasis", "hbasis"), c3.cpu().numpy())
    network_l1 = l1_norm(c3)
    del c3
    expansions = {k: (bi | tri)[k] for k in (*_KEPT, *(("bihaar", "trihaar") if keep_coefficients else ()))}
    level_coords = {"qlevel": vq, "klevel": vk, "hlevel": vh}
    log.info("decompose %s: bi- and tri-Haar expansions, their coarsest coefficients and level sums, %.0f s",
             shape, time.perf_counter() - t)
    fig = {k: [] for k in ("original", "organized3d", "organized2d", "exact", "approx", "residual")}
    rel, rel_unorg, orders, trees2d = [], [], [], []
    # Theorem 1 is about softmax of the pre-softmax head, whatever quantity is analysed
    for (layer, head), f in zip(units, originals):
        t = time.perf_counter()
        fig["original"].append(f)
        fig["organized3d"].append(f[np.ix_(org.tree_q.order, org.tree_k.order)])
        if no_scores:
            tr, tc = questionnaire2d(on_device(f.astype(np.float64), device), n_iters=questionnaire2d_iters)
            orders.append((tr.order, tc.order))
            trees2d.append((tr, tc))
            fig["organized2d"].append(f[np.ix_(tr.order, tc.order)])
            for k in ("exact", "approx", "residual"):
                fig[k].append(np.full(f.shape, np.nan))
            rel.append(np.nan)
            rel_unorg.append(np.nan)
            continue
        g = head_array(ds, "scores", layer, head, crop, where=attention_store).astype(np.float64)
        tr, tc = questionnaire2d(on_device(g, device), n_iters=questionnaire2d_iters)
        # a causal head is compared with the model's own masked softmax (docs/method.md §7.5)
        allowed = model_mask(ds, layer, head, g, crop)
        pp = paraproduct(g, row_order=tr.order, col_order=tc.order, allowed=allowed)
        pu = paraproduct(g, allowed=allowed)
        orders.append((tr.order, tc.order))
        trees2d.append((tr, tc))
        fig["organized2d"].append(np.asarray(pp.organized))
        fig["exact"].append(np.asarray(pp.exact))
        fig["approx"].append(np.asarray(pp.approximation))
        fig["residual"].append(np.asarray(pp.residual))
        rel.append(float(pp.relative_residual))
        rel_unorg.append(float(pu.relative_residual))
        log.info("decompose: figure head layer %d, head %d: 2-D questionnaire (%d iterations) and paraproducts, %.0f s",
                 layer, head, questionnaire2d_iters, time.perf_counter() - t)
    dm = diffusion_map(org.affinity_h, n_components=3)
    fh = ("fig_head", "row", "col")
    out_ds = xr.Dataset(
        {**expansions,
         "support_q": ("qbasis", sq), "level_q": ("qbasis", lq),
         "support_k": ("kbasis", sk), "level_k": ("kbasis", lk),
         "support_h": ("hbasis", sh), "level_h": ("hbasis", lh),
         "network_l1": ((), network_l1),
         "network_l1_random": ((), float(np.mean(rand_l1))),
         "network_sparsity_random": ((), float(np.mean(rand_ratio))),
         "network_l1_natural": ((), natural_l1),
         "network_sparsity_natural": ((), natural_ratio),
         "diffusion_coords": (("unit", "component"), np.asarray(dm.coords, dtype=np.float32)),
         "diffusion_eigenvalues": ("eig", np.asarray(dm.eigenvalues, dtype=np.float64)),
         **{f"fig_{k}": (fh, np.stack(v).astype(np.float32)) for k, v in fig.items()},
         "fig_row_order": (("fig_head", "row"), np.array([o[0] for o in orders], dtype=np.int64)),
         "fig_col_order": (("fig_head", "col"), np.array([o[1] for o in orders], dtype=np.int64)),
         # the trees themselves, which the explorer draws (stages.organize2d reads them)
         "fig_row_tree": (("fig_head", "fig_level_r", "row"), padded_labels([t[0] for t in trees2d], shape[0])),
         "fig_col_tree": (("fig_head", "fig_level_c", "col"), padded_labels([t[1] for t in trees2d], shape[1])),
         "fig_rel_residual": ("fig_head", np.array(rel)),
         "fig_rel_residual_unorganized": ("fig_head", np.array(rel_unorg))},
        coords={k: v for k, v in coords.items() if k not in ("query", "key")} | {
                "fig_layer": ("fig_head", [u[0] for u in units]), **level_coords,
                "fig_head_index": ("fig_head", [u[1] for u in units])},
        attrs={**{k: v for k, v in attrs.items() if k in ("model", "sample", "kind", "masked", "masked_filled")},
               **store.provenance_attrs(config_slice or {}, attrs.get("checkpoint_sha256"), code=code,
                                        quantity=quantity, coefficients="all" if keep_coefficients else "coarsest")})
    if no_scores:
        out_ds.attrs["paraproduct_not_run"] = no_scores
    store.write_store(out_ds, out)
    log.info("decomposed: network l1 %.4g (random trees %.4g, natural order %.4g); paraproduct residual %s "
             "(unorganized %s)", out_ds["network_l1"].item(), out_ds["network_l1_random"].item(), natural_l1,
             np.round(rel, 4).tolist(), np.round(rel_unorg, 4).tolist())


# What the consumers of the expansions read (docs/method.md §6.6), in the decomposed store's order:
# the `coarse_coefficients` coarsest coefficients of each head and of the network with their flat
# indices, the level sums of |c| and c^2, and the figure heads' bi-Haar coefficients.
_KEPT = ("bihaar_coarse", "coarse2_index", "trihaar_coarse", "coarse3_index", "bihaar_level_l1", "bihaar_level_l2sq",
         "trihaar_level_l1", "trihaar_level_l2sq", "fig_bihaar")


def _bihaar_kept(c2, supports, levels, keep: int, figure_positions: list[int]) -> tuple[dict, tuple]:
    """The decomposed store's variables of the bi-Haar coefficients c2 (`_KEPT`), and the levels
    of the query and key axes (coordinates)."""
    coarse, idx = coarse_coefficients(c2, list(supports), list(levels), keep)
    l1, l2, (vq, vk) = level_sums(c2, list(levels))
    fig = c2[:, :, torch.as_tensor(figure_positions, dtype=torch.long, device=c2.device)]
    return {"bihaar_coarse": (("coarse2", "unit"), coarse.cpu().numpy()), "coarse2_index": ("coarse2", idx),
            "bihaar_level_l1": (("qlevel", "klevel", "unit"), l1.cpu().numpy()),
            "bihaar_level_l2sq": (("qlevel", "klevel", "unit"), l2.cpu().numpy()),
            "fig_bihaar": (("fig_head", "qbasis", "kbasis"), fig.permute(2, 0, 1).cpu().numpy())}, (vq, vk)


def _trihaar_kept(c3, supports, levels, keep: int) -> tuple[dict, np.ndarray]:
    """The decomposed store's variables of the tri-Haar coefficients c3 (`_KEPT`), and the levels
    of the head axis (a coordinate)."""
    coarse, idx = coarse_coefficients(c3, list(supports), list(levels), keep)
    l1, l2, (_, _, vh) = level_sums(c3, list(levels))
    return {"trihaar_coarse": ("coarse3", coarse.cpu().numpy()), "coarse3_index": ("coarse3", idx),
            "trihaar_level_l1": (("qlevel", "klevel", "hlevel"), l1.cpu().numpy()),
            "trihaar_level_l2sq": (("qlevel", "klevel", "hlevel"), l2.cpu().numpy())}, vh


def decompose_samples(attention_stores: list, organized_stores: list, outs: list, quantity: str, crop=None,
                      **kwargs) -> None:
    """`decompose` on each sample in turn (one job for all samples of a small model: the job's
    start-up is paid once). Keyword arguments are `decompose`'s."""
    each_sample("decompose", {"attention stores": attention_stores, "organized stores": organized_stores}, outs,
                lambda att, org, out: decompose(att, org, out, quantity, crop, **kwargs))
