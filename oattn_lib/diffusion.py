"""Diffusion map of the heads (docs/method.md §8, Figure 3 of the paper).

From a head affinity G (for example the questionnaire's G_H), the symmetric
normalisation M = D^-1/2 G D^-1/2 has the same spectrum as the Markov matrix D^-1 G;
its eigenvectors phi_k, by eigenvalue descending, give the diffusion coordinates
psi_k = phi_k / phi_0 * lambda_k^t. Figure 3 plots psi_1..psi_3 (the eigenvectors of
the largest nontrivial eigenvalues, not of the smallest).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._arrays import back, check_affinity

__all__ = ["DiffusionMap", "diffusion_map"]


@dataclass(frozen=True, eq=False)
class DiffusionMap:
    """Diffusion coordinates of n items (docs/method.md §8).

    The result of `diffusion_map`: numpy arrays for numpy input, torch tensors (float64, on the
    input's device) for torch input.

    Attributes
    ----------
    coords : ndarray or torch.Tensor of shape (n, n_components)
        Column k - 1 is psi_k = phi_k / phi_0 * lambda_k^t.
    eigenvalues : ndarray or torch.Tensor of shape (n_components + 1,)
        lambda_0 (= 1) first, then descending.
    phi0 : ndarray or torch.Tensor of shape (n,)
        The stationary eigenvector sqrt(d) / ||sqrt(d)|| of M (unit norm, > 0).
    t : float
        The diffusion time used.
    """

    coords: np.ndarray | torch.Tensor
    eigenvalues: np.ndarray | torch.Tensor
    phi0: np.ndarray | torch.Tensor
    t: float


def _complement_basis(v: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (n, n - 1) of the complement of the unit vector v (Householder)."""
    n = v.shape[0]
    e1 = torch.zeros_like(v)
    e1[0] = 1.0
    # reflect v onto -sign(v_0) e1; the reflection's other columns span v's complement
    s = 1.0 if float(v[0]) >= 0 else -1.0
    w = v + s * e1
    h = torch.eye(n, dtype=v.dtype, device=v.device) - 2.0 * torch.outer(w, w) / (w @ w)
    return h[:, 1:]


def diffusion_map(affinity, n_components: int = 3, t: float = 1) -> DiffusionMap:
    """Diffusion map of a symmetric nonnegative affinity matrix (docs/method.md §8).

    M = D^-1/2 G D^-1/2 with D the row sums of G (plus 1e-12 times the largest row sum,
    so that items with no affinity to anything do not divide by zero; such an item is
    mapped to 0). lambda_0 = 1 with phi_0 = sqrt(d) / ||sqrt(d)||, which is exactly
    the stationary vector of the Markov matrix D^-1 G; phi_1, phi_2, ... are the
    eigenvectors of M restricted to the complement of phi_0, by eigenvalue descending.
    For a connected graph these are simply M's eigenvectors after phi_0; for a
    disconnected one, the eigenvalue 1 is repeated and this choice makes psi_1 constant
    on each component, which separates them.

    psi_k = phi_k / phi_0 * lambda_k^t (for a non-integer t, sign(lambda) |lambda|^t,
    since a negative eigenvalue has no real non-integer power). Signs are fixed so
    that the first entry of each psi_k that is not zero (|x| > 1e-12 max |psi_k|) is
    positive; eigenvectors are defined up to sign only, so relabelling the items can
    flip a column.

    With n <= n_components items there are only n - 1 nontrivial coordinates: the
    missing columns of `coords` and the missing eigenvalues are returned as zeros, so
    the shapes are always (n, n_components) and (n_components + 1,).

    Parameters
    ----------
    affinity : ndarray or torch.Tensor of shape (n, n)
        The affinity G between the n items: float, symmetric and nonnegative.
    n_components : int, default 3
        Number of nontrivial diffusion coordinates psi_1, ..., psi_n_components to return.
    t : float, default 1
        The diffusion time, nonnegative.

    Returns
    -------
    DiffusionMap
        Coordinates (n, n_components), eigenvalues (n_components + 1,), phi0 (n,) and t; see
        `DiffusionMap`. Numpy arrays for numpy input and torch tensors (float64, on the input's
        device) for torch input.

    Raises
    ------
    ValueError
        If `n_components` is not a positive integer, `t` is not a finite nonnegative number, or
        `affinity` is not a square, symmetric, nonnegative, finite matrix with at least one item.
    """
    was_numpy = not isinstance(affinity, torch.Tensor)
    device = affinity.device if not was_numpy else torch.device("cpu")
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) \
            or n_components < 1:
        raise ValueError(f"n_components: expected a positive integer, got {n_components!r}")
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) \
            or not np.isfinite(t) or t < 0:
        raise ValueError(f"t: expected a nonnegative number, got {t!r}")
    g = torch.as_tensor(check_affinity(affinity, "affinity"), dtype=torch.float64, device=device)
    n = g.shape[0]

    d = g.sum(1)
    dmax = float(d.max())
    d = d + (1e-12 * dmax if dmax > 0 else 1.0)
    inv_sqrt = d.rsqrt()
    m = inv_sqrt[:, None] * g * inv_sqrt[None, :]
    phi0 = d.sqrt() / d.sqrt().norm()
    lam0 = phi0 @ m @ phi0  # = 1 up to the degree regularisation

    k = min(n_components, n - 1)
    coords = torch.zeros((n, n_components), dtype=torch.float64, device=device)
    eigenvalues = torch.zeros(n_components + 1, dtype=torch.float64, device=device)
    eigenvalues[0] = lam0
    if k > 0:
        basis = _complement_basis(phi0)
        w, v = torch.linalg.eigh(basis.T @ m @ basis)
        w, v = w.flip(0)[:k], v.flip(1)[:, :k]
        phi = basis @ v
        if float(t) == int(t):
            scale = w ** int(t)
        else:
            scale = torch.sign(w) * w.abs() ** float(t)
        psi = phi / phi0[:, None] * scale[None, :]
        # deterministic signs: first clearly nonzero entry of each column positive
        tol = 1e-12 * psi.abs().amax(0, keepdim=True)
        nonzero = psi.abs() > tol
        first = torch.argmax(nonzero.to(torch.int8), dim=0)
        sign = torch.sign(psi[first, torch.arange(k, device=device)])
        sign[sign == 0] = 1.0
        coords[:, :k] = psi * sign[None, :] + 0.0  # no negative zeros
        eigenvalues[1:k + 1] = w
    return DiffusionMap(coords=back(coords, was_numpy), eigenvalues=back(eigenvalues, was_numpy),
                        phi0=back(phi0, was_numpy), t=float(t))
