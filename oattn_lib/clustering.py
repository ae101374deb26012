"""How clustered a cloud of points is, without labels, against a continuous cloud (docs/method.md §13.6).

Figure 3 of the paper reads the heads' diffusion map as "continuous" (TXL) or "more clustered"
(ViT). No labelling of the heads is part of that sentence, so the statistic is label-free: the
best mean silhouette (Rousseeuw 1987) of a k-means partition of the points over k = 2..`max_k`.
Any cloud has some partition with a positive silhouette, so the number means something only
against a null: a Gaussian cloud with the same number of points, mean and covariance (continuous,
one mode, the same spread along each diffusion coordinate), through the same statistic.
Everything is batched over clouds: the null's draws run through the k-means and the silhouette
together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ClusterTest", "against_null", "best_silhouette", "cluster_test", "gaussian_like", "silhouettes"]

MAX_K = 5
"""The largest number of clusters tried (k = 2..MAX_K, fewer for fewer points)."""
RESTARTS = 3
"""k-means starts per k (k-means++ seeding); the partition of least within-cluster sum of squares is kept."""
ITERATIONS = 50
"""Lloyd iterations at most (they stop earlier once no centre moves)."""


def silhouettes(distances: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Mean silhouette of each of a batch of labelled clouds (docs/method.md §13.6).

    With a(i) the mean distance of i to the other members of its cluster and b(i) the smallest
    mean distance to another cluster, s(i) = (b - a) / max(a, b), 0 for a cluster of one (and
    where a = b = 0).

    Parameters
    ----------
    distances : ndarray of shape (B, n, n)
        The distances between the n points of each cloud: symmetric, zero diagonal.
    labels : ndarray of shape (B, n)
        int in 0..k-1, the cluster of each point.

    Returns
    -------
    ndarray of shape (B,)
        float, the mean of s(i) over each cloud's points; NaN where a labelling has fewer than
        2 clusters.

    Raises
    ------
    ValueError
        If the shapes are not (B, n, n) and (B, n).
    """
    d = np.asarray(distances, dtype=float)
    lab = np.asarray(labels)
    if d.ndim != 3 or d.shape[1] != d.shape[2] or lab.shape != d.shape[:2]:
        raise ValueError(f"distances, labels: expected (B, n, n) and (B, n), got {d.shape} and {lab.shape}")
    k = int(lab.max()) + 1 if lab.size else 0
    onehot = (lab[..., None] == np.arange(k)).astype(float)                  # (B, n, k)
    sums = d @ onehot                                                          # (B, n, k)
    size = onehot.sum(1)                                                       # (B, k)
    own_size = np.take_along_axis(size, lab, 1)
    own_sum = np.take_along_axis(sums, lab[..., None], 2)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = own_sum / (own_size - 1)
        other = np.where(onehot.astype(bool) | (size[:, None, :] == 0), np.inf, sums / size[:, None, :])
        b = other.min(-1)
        s = np.where((own_size > 1) & (np.maximum(a, b) > 0), (b - a) / np.maximum(a, b), 0.0)
    return np.where((size > 0).sum(1) >= 2, s.mean(1), np.nan)


def _kmeans(x: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """k-means (Lloyd, k-means++ seeding) of each cloud of x (B, n, d): labels (B, n) and the
    within-cluster sums of squares (B,)."""
    b, n, _ = x.shape
    rows = np.arange(b)
    centres = np.empty((b, k, x.shape[2]))
    centres[:, 0] = x[rows, rng.integers(0, n, b)]
    d2 = ((x - centres[:, :1]) ** 2).sum(-1)
    for j in range(1, k):
        total = d2.sum(1, keepdims=True)
        prob = np.where(total > 0, d2 / np.where(total > 0, total, 1.0), 1.0 / n)
        pick = (prob.cumsum(1) < rng.random((b, 1))).sum(1).clip(max=n - 1)
        centres[:, j] = x[rows, pick]
        d2 = np.minimum(d2, ((x - centres[:, j:j + 1]) ** 2).sum(-1))
    sq = (x * x).sum(-1)                                                       # (B, n)

    def distances(c):                                                          # squared, (B, n, k)
        return np.maximum(sq[..., None] - 2.0 * (x @ np.swapaxes(c, 1, 2)) + (c * c).sum(-1)[:, None, :], 0.0)

    for _ in range(ITERATIONS):
        labels = distances(centres).argmin(-1)
        onehot = (labels[..., None] == np.arange(k)).astype(float)
        count = onehot.sum(1)                                                  # (B, k)
        moved = (np.swapaxes(onehot, 1, 2) @ x) / np.maximum(count, 1.0)[..., None]
        moved = np.where(count[..., None] > 0, moved, centres)
        if np.array_equal(moved, centres):
            break
        centres = moved
    dist = distances(centres)
    labels = dist.argmin(-1)
    return labels, np.take_along_axis(dist, labels[..., None], 2)[..., 0].sum(1)


def best_silhouette(points, max_k: int = MAX_K, rng=None) -> np.ndarray:
    """The label-free clustering statistic of each cloud (docs/method.md §13.6).

    The largest mean silhouette (`silhouettes`) of a k-means partition over
    k = 2..min(max_k, n - 1), each k's partition the best of `RESTARTS` starts.

    Parameters
    ----------
    points : array_like of shape (n, d) or (B, n, d)
        One cloud of n points, or a batch of B clouds.
    max_k : int, default MAX_K
        The largest number of clusters tried.
    rng : int, sequence of int or numpy.random.Generator, optional
        The random state of the k-means seeding (`numpy.random.default_rng`'s argument).

    Returns
    -------
    float or ndarray of shape (B,)
        The statistic of the cloud (a numpy float), or of each cloud of the batch; NaN for
        fewer than 3 points.

    Raises
    ------
    ValueError
        If `points` is not of shape (n, d) or (B, n, d).
    """
    x = np.asarray(points, dtype=float)
    single = x.ndim == 2
    if single:
        x = x[None]
    if x.ndim != 3:
        raise ValueError(f"points: expected (n, d) or (B, n, d), got shape {np.asarray(points).shape}")
    rng = np.random.default_rng(rng)
    b, n, _ = x.shape
    best = np.full(b, np.nan)
    if n >= 3:
        sq = (x * x).sum(-1)
        d = np.sqrt(np.maximum(sq[:, :, None] + sq[:, None, :] - 2.0 * (x @ np.swapaxes(x, 1, 2)), 0.0))
        d[:, np.arange(n), np.arange(n)] = 0.0
        for k in range(2, min(max_k, n - 1) + 1):
            runs = [_kmeans(x, k, rng) for _ in range(RESTARTS)]
            inertia = np.stack([r[1] for r in runs])                            # (restarts, B)
            labels = np.stack([r[0] for r in runs])[inertia.argmin(0), np.arange(b)]
            best = np.fmax(best, silhouettes(d, labels))
    return best[0] if single else best


def gaussian_like(points, draws: int, rng) -> np.ndarray:
    """Gaussian clouds with the number of points, mean and covariance of `points`: the null.

    A singular covariance gives clouds in the same subspace (docs/method.md §13.6).

    Parameters
    ----------
    points : array_like of shape (n, d)
        The cloud.
    draws : int
        The number of clouds drawn.
    rng : int, sequence of int or numpy.random.Generator
        The random state (`numpy.random.default_rng`'s argument).

    Returns
    -------
    ndarray of shape (draws, n, d)
        float64, the clouds.
    """
    x = np.asarray(points, dtype=float)
    mean = x.mean(0)
    w, v = np.linalg.eigh(np.cov(x, rowvar=False).reshape(x.shape[1], x.shape[1]))
    root = v * np.sqrt(np.clip(w, 0.0, None))
    z = np.random.default_rng(rng).standard_normal((draws, x.shape[0], x.shape[1]))
    return mean + z @ root.T


@dataclass(frozen=True)
class ClusterTest:
    """A cloud's clustering statistic against its Gaussian null (docs/method.md §13.6).

    Attributes
    ----------
    statistic : float
        `best_silhouette` of the cloud.
    null : ndarray of shape (draws,)
        The same of the Gaussian clouds (`gaussian_like`), the finite ones.
    z : float
        (statistic - mean(null)) / sd(null), how many null spreads more clustered than a
        continuous cloud.
    p : float
        (1 + null draws at least as clustered) / (1 + draws), the Monte Carlo p-value.
    """

    statistic: float
    null: np.ndarray
    z: float
    p: float


def against_null(statistic: float, null) -> ClusterTest:
    """A cloud's `best_silhouette` against the same of its null clouds.

    Parameters
    ----------
    statistic : float
        `best_silhouette` of the cloud.
    null : array_like of shape (draws,)
        `best_silhouette` of each null cloud; NaN values are left out.

    Returns
    -------
    ClusterTest
        The statistic, the finite null values, z and the Monte Carlo p-value; z and p NaN with
        fewer than two null values (or a NaN statistic), z NaN where the null values do not
        spread.
    """
    null = np.asarray(null, dtype=float)
    null = null[np.isfinite(null)]
    if not np.isfinite(statistic) or null.size < 2:
        return ClusterTest(statistic, null, float("nan"), float("nan"))
    sd = float(null.std(ddof=1))
    z = (statistic - float(null.mean())) / sd if sd > 0 else float("nan")
    return ClusterTest(statistic, null, z, float((1 + np.sum(null >= statistic - 1e-12)) / (1 + null.size)))


def cluster_test(points, draws: int, rng) -> ClusterTest:
    """`best_silhouette` of `points` against `draws` clouds of `gaussian_like` (docs/method.md §13.6).

    Parameters
    ----------
    points : array_like of shape (n, d)
        The cloud (the heads' diffusion coordinates, say).
    draws : int
        The number of null clouds.
    rng : int, sequence of int or numpy.random.Generator
        The one random state of the k-means and of the null draws.

    Returns
    -------
    ClusterTest
        The cloud's statistic against its null (`against_null`).
    """
    rng = np.random.default_rng(rng)
    x = np.asarray(points, dtype=float)
    obs = float(best_silhouette(x, rng=rng))
    return against_null(obs, best_silhouette(gaussian_like(x, draws, rng), rng=rng))
