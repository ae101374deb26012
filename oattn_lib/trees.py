"""Partition trees (docs/method.md §2): nested partitions from the root down to singletons.

A tree on n items is an integer array ``labels[level, item]``; level 0 is the root (one
folder), the last level holds n singletons, and every level refines the one above. The
numbering of folders at a level fixes the order of siblings: children are visited in
increasing label order, so the depth-first leaf order (the "organized" order of the
axis) is the lexicographic order of the items' label paths. Trees are stored in a
canonical numbering (folders numbered 0..F-1 at each level in depth-first order), so
two trees with the same folders and sibling order compare equal.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from ._arrays import check_affinity, is_tensor

__all__ = ["PartitionTree", "Organization", "balanced_tree", "flexible_tree", "random_tree", "level_agreement", "architecture_agreement",
           "padded_labels", "from_padded"]


@dataclass(frozen=True, eq=False)
class PartitionTree:
    """Nested partitions of n items, level 0 = root; see the module docstring.

    Attributes
    ----------
    labels : ndarray of shape (n_levels, n)
        Integer folder labels ``labels[level, item]``: level 0 a single folder (the root), the
        last level n singletons, every level nested in the one above. Stored as read-only int64
        in the canonical numbering.

    Raises
    ------
    ValueError
        If `labels` is not a 2-D (level, item) array, has an axis of length 0 or entries that
        are not integers, if level 0 is not a single folder, if the last level is not n
        singletons, or if a level is not nested in the one above.
    """

    labels: np.ndarray

    def __post_init__(self):
        lab = np.asarray(self.labels)
        if lab.ndim != 2:
            raise ValueError(f"labels: expected a 2-D (level, item) array, got shape {lab.shape}")
        if lab.shape[0] == 0 or lab.shape[1] == 0:
            raise ValueError(f"labels: has an axis of length 0 (shape {lab.shape})")
        if not np.issubdtype(lab.dtype, np.integer):
            if not np.all(np.equal(np.mod(lab, 1), 0)):
                raise ValueError("labels: must be integers")
        lab = lab.astype(np.int64)
        n_levels, n = lab.shape
        if np.unique(lab[0]).size != 1:
            raise ValueError("labels: level 0 (the root) must be a single folder")
        if np.unique(lab[-1]).size != n:
            raise ValueError("labels: the last level must hold n singletons (leaves)")
        for lev in range(1, n_levels):
            # nested: every folder at `lev` lies inside exactly one folder at `lev - 1`
            pairs = np.unique(np.stack([lab[lev], lab[lev - 1]]), axis=1)
            if np.unique(pairs[0]).size != pairs.shape[1]:
                raise ValueError(f"labels: level {lev} is not nested in level {lev - 1} "
                                 "(a folder has items in two parent folders)")
        # canonical numbering in depth-first order (sibling order = label order)
        order = np.lexsort(lab[::-1])
        canon = np.empty_like(lab)
        for lev in range(n_levels):
            seq = lab[lev, order]
            new_folder = np.r_[True, seq[1:] != seq[:-1]] if n > 1 else np.array([True])
            canon[lev, order] = np.cumsum(new_folder) - 1
        canon.setflags(write=False)
        object.__setattr__(self, "labels", canon)

    # -- basic shape ------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of items (leaves).

        Returns
        -------
        int
            The length of the axis the tree organizes.
        """
        return self.labels.shape[1]

    @property
    def n_levels(self) -> int:
        """Number of levels, the root and the leaves included.

        Returns
        -------
        int
            At least 1 (a tree on one item is its root).
        """
        return self.labels.shape[0]

    def n_folders(self, level: int) -> int:
        """Number of folders at `level`.

        Parameters
        ----------
        level : int
            The level, 0 the root.

        Returns
        -------
        int
            The number of distinct folder labels at `level`.
        """
        return int(self.labels[level].max()) + 1

    @cached_property
    def order(self) -> np.ndarray:
        """Depth-first leaf order: ``X[order]`` is the organized axis.

        Returns
        -------
        ndarray of shape (n,)
            int64, a permutation of the items.
        """
        return np.argsort(self.labels[-1], kind="stable")

    @cached_property
    def folder_sizes(self) -> list[np.ndarray]:
        """Per level, the number of items in each folder (indexed by folder label).

        Returns
        -------
        list of ndarray
            One int64 array of shape (n_folders(level),) per level.
        """
        return [np.bincount(self.labels[lev]) for lev in range(self.n_levels)]

    @cached_property
    def smallest_items(self) -> list[np.ndarray]:
        """Per level, the smallest item of each folder (indexed by folder label).

        Distinct within a level, so it orders folders by a property of the tree alone (the Haar
        basis's sibling ties, docs/method.md §3.2).

        Returns
        -------
        list of ndarray
            One read-only int64 array of shape (n_folders(level),) per level.
        """
        out = []
        for lev in range(self.n_levels):
            first = np.full(self.n_folders(lev), self.n, dtype=np.int64)
            np.minimum.at(first, self.labels[lev], np.arange(self.n))
            first.setflags(write=False)
            out.append(first)
        return out

    @cached_property
    def parents(self) -> list[np.ndarray]:
        """Per level l >= 1, the parent folder (at l - 1) of each folder at l; level 0: [-1].

        Returns
        -------
        list of ndarray
            One int array of shape (n_folders(level),) per level (shape (1,) at level 0).
        """
        out = [np.array([-1])]
        for lev in range(1, self.n_levels):
            par = np.empty(self.n_folders(lev), dtype=np.int64)
            par[self.labels[lev]] = self.labels[lev - 1]
            out.append(par)
        return out

    def membership(self, level: int) -> np.ndarray:
        """Membership matrix of the folders at `level`: folder f contains item i.

        Parameters
        ----------
        level : int
            The level, 0 the root.

        Returns
        -------
        ndarray of shape (n_folders(level), n)
            bool.
        """
        lab = self.labels[level]
        return lab[None, :] == np.arange(self.n_folders(level))[:, None]

    @cached_property
    def folders(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All distinct folders over every level, as (membership, first_level, last_level).

        A folder with a single child is the same set as that child, so it is listed once,
        with the span of levels it occupies. Folders are in order of first level, then label.

        Returns
        -------
        membership : ndarray of shape (F, n)
            bool: distinct folder f contains item i.
        first_level : ndarray of shape (F,)
            int, the first (coarsest) level each folder occupies.
        last_level : ndarray of shape (F,)
            int64, the last (finest) level each folder occupies.
        """
        mems, first, indices = [], [], []
        count = 0
        for lev in range(self.n_levels):
            index = np.empty(self.n_folders(lev), dtype=np.int64)
            if lev == 0:
                is_new = np.ones(1, dtype=bool)
            else:
                par = self.parents[lev]
                only_child = np.bincount(par, minlength=self.n_folders(lev - 1))[par] == 1
                index[only_child] = indices[-1][par[only_child]]
                is_new = ~only_child
            n_new = int(is_new.sum())
            index[is_new] = count + np.arange(n_new)
            count += n_new
            mems.append(self.membership(lev)[is_new])
            first.append(np.full(n_new, lev))
            indices.append(index)
        last = np.empty(count, dtype=np.int64)
        for lev, index in enumerate(indices):  # ascending, so the deepest level wins
            last[index] = lev
        return np.concatenate(mems), np.concatenate(first), last

    def folder_weights(self, alpha: float = 0.0, beta: float = 1.0) -> np.ndarray:
        """EMD weight of each distinct folder (docs/method.md §4.1), summed over the levels it spans.

        w(F) = (|F| / n)^beta * 2^((1 - level) * alpha) with the root at level 1; a folder
        repeated on k levels contributes k times to the L1 distance, hence the sum.

        Parameters
        ----------
        alpha : float, default 0.0
            Exponent of the level factor.
        beta : float, default 1.0
            Exponent of the size factor.

        Returns
        -------
        ndarray of shape (F,)
            float64, in the order of `folders`.
        """
        mem, first, last = self.folders
        size = mem.sum(1) / self.n
        lev = np.arange(self.n_levels)
        per_level = 2.0 ** (-lev * alpha)  # (1 - (l + 1)) * alpha with 0-based l
        cum = np.concatenate([[0.0], np.cumsum(per_level)])
        return size ** beta * (cum[last + 1] - cum[first])

    def __eq__(self, other) -> bool:
        return isinstance(other, PartitionTree) and self.labels.shape == other.labels.shape \
            and bool(np.array_equal(self.labels, other.labels))

    def __hash__(self) -> int:
        return hash(self.labels.tobytes())

    def __repr__(self) -> str:
        return f"PartitionTree(n={self.n}, n_levels={self.n_levels}, " \
               f"folders={[self.n_folders(lev) for lev in range(self.n_levels)]})"

    # -- xarray round trip --------------------------------------------------------------
    def to_dataarray(self, name: str = "tree", item_coord=None):
        """As an xarray DataArray with dims (level, item).

        Parameters
        ----------
        name : str, default "tree"
            Name of the DataArray.
        item_coord : array_like of shape (n,), optional
            Coordinate of the item dim (None: none).

        Returns
        -------
        xarray.DataArray of shape (n_levels, n)
            The labels, dims (level, item), with coordinate `level` (0..n_levels-1).
        """
        import xarray as xr
        coords = {"level": np.arange(self.n_levels)}
        if item_coord is not None:
            coords["item"] = np.asarray(item_coord)
        return xr.DataArray(np.asarray(self.labels), dims=("level", "item"), coords=coords, name=name)

    @classmethod
    def from_dataarray(cls, da) -> "PartitionTree":
        """The tree stored by `to_dataarray`.

        Parameters
        ----------
        da : xarray.DataArray of shape (n_levels, n)
            Labels with dims (level, item).

        Returns
        -------
        PartitionTree
            The tree on the n items of `da`.

        Raises
        ------
        ValueError
            If the dims of `da` are not (level, item), or its labels are not a valid tree.
        """
        if tuple(da.dims) != ("level", "item"):
            raise ValueError(f"tree DataArray {da.name!r}: expected dims (level, item), got {da.dims}")
        return cls(np.asarray(da.values))


@dataclass(frozen=True)
class Organization:
    """Trees and affinities of the three axes of a (query, key, head) tensor.

    What the questionnaire (docs/method.md §5) gives and the organize stage stores. It lives
    here, beside the trees, so that the stages that only read organized stores (the explorer's)
    load neither torch nor the questionnaire; `oattn_lib.questionnaire.Organization` is the same
    class.

    Attributes
    ----------
    tree_q, tree_k, tree_h : PartitionTree
        Trees on n_query, n_key and n_head items.
    affinity_q : ndarray of shape (n_query, n_query)
        float64, symmetric.
    affinity_k : ndarray of shape (n_key, n_key)
        float64, symmetric.
    affinity_h : ndarray of shape (n_head, n_head)
        float64, symmetric.
    """

    tree_q: PartitionTree
    tree_k: PartitionTree
    tree_h: PartitionTree
    affinity_q: np.ndarray
    affinity_k: np.ndarray
    affinity_h: np.ndarray

    @property
    def orders(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Organized leaf orders of query, key and head: ``X[oq][:, ok][:, :, oh]``.

        Returns
        -------
        oq, ok, oh : ndarray of shape (n_query,), (n_key,), (n_head,)
            int64 permutations.
        """
        return self.tree_q.order, self.tree_k.order, self.tree_h.order

    def organize(self, X):
        """X permuted into the organized order on all three axes.

        Parameters
        ----------
        X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
            A tensor on the three axes.

        Returns
        -------
        ndarray or torch.Tensor of shape (n_query, n_key, n_head)
            Same shape and kind as X (a tensor on X's device).
        """
        oq, ok, oh = self.orders
        if is_tensor(X):
            import torch

            dev = X.device
            return X[torch.as_tensor(oq, device=dev)][:, torch.as_tensor(ok, device=dev)][
                :, :, torch.as_tensor(oh, device=dev)]
        return np.asarray(X)[np.ix_(oq, ok, oh)]


def _levels_to_tree(levels_bottom_up: list[np.ndarray]) -> PartitionTree:
    return PartitionTree(np.stack(levels_bottom_up[::-1]))


def balanced_tree(order) -> PartitionTree:
    """Balanced binary tree over a given leaf order (docs/method.md §2.5).

    Each folder of m items (in the given order) splits into the first ceil(m/2) and the
    rest, until singletons. The tree's `order` equals `order`.

    Parameters
    ----------
    order : array_like of shape (n,)
        int, a permutation of 0..n-1.

    Returns
    -------
    PartitionTree
        A tree on n items.

    Raises
    ------
    ValueError
        If `order` is not a non-empty 1-D permutation of 0..n-1.
    """
    order = np.asarray(order)
    if order.ndim != 1 or order.size == 0:
        raise ValueError(f"order: expected a non-empty 1-D permutation, got shape {order.shape}")
    n = order.size
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError("order: not a permutation of 0..n-1")
    # position p of the ordered axis lies in folder floor(p / size) at a level of a
    # dyadic split; with ceil halves, folder boundaries are computed level by level.
    starts = [np.array([0, n])]
    while len(starts[-1]) - 1 < n:
        b = starts[-1]
        mids = b[:-1] + (b[1:] - b[:-1] + 1) // 2
        nb = np.unique(np.concatenate([b, mids]))
        starts.append(nb)
    labels = np.empty((len(starts), n), dtype=np.int64)
    pos = np.arange(n)
    for lev, b in enumerate(starts):
        labels[lev, order] = np.searchsorted(b, pos, side="right") - 1
    return PartitionTree(labels)


def random_tree(n: int, rng: np.random.Generator) -> PartitionTree:
    """Balanced binary tree over a random order of n items: the null model of organization.

    The order is `rng.permutation(n)`; the tree is `balanced_tree` of it.

    Parameters
    ----------
    n : int
        Number of items.
    rng : numpy.random.Generator
        The random state.

    Returns
    -------
    PartitionTree
        A tree on n items.
    """
    return balanced_tree(rng.permutation(n))


PARTIAL_EIGEN_MIN = 1024
"""From this many items on, `_diffusion_embedding` computes only the eigenpairs it keeps
(`_top_eigenpairs`: Lanczos, then a check that it skipped none) instead of all of them, which
at thousands of items costs a small fraction of the full decomposition (docs/method.md §2.2)."""


def _inertia_above(p: np.ndarray, theta: float) -> int:
    """How many eigenvalues of the symmetric `p` exceed `theta`: the positive eigenvalues of
    p - theta I, by Sylvester's law of inertia from its Bunch-Kaufman factorization L D L^T
    (LAPACK's dsytrf): D's 1 x 1 blocks count by their sign, each 2 x 2 block (a pair of negative
    pivot indices) by the signs of its two eigenvalues (its determinant and trace)."""
    import scipy.linalg.lapack

    a = p - theta * np.eye(len(p))
    lwork = int(scipy.linalg.lapack.dsytrf_lwork(len(p), lower=1)[0])
    ldu, ipiv, info = scipy.linalg.lapack.dsytrf(a, lower=1, lwork=max(lwork, 1), overwrite_a=1)
    if info < 0:
        raise ValueError(f"dsytrf: argument {-info} is invalid")
    d, off = np.diag(ldu), np.diag(ldu, -1)
    first = np.flatnonzero(ipiv < 0)[0::2]  # the rows of a 2 x 2 block come in adjacent pairs
    det = d[first] * d[first + 1] - off[first] ** 2
    trace = d[first] + d[first + 1]
    in_blocks = np.where(det < 0, 1, np.where(trace > 0, np.where(det > 0, 2, 1), 0)).sum()
    single = np.ones(len(p), dtype=bool)
    single[first] = single[first + 1] = False
    return int(in_blocks + (d[single] > 0).sum())


def _top_eigenpairs(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The k eigenpairs of the symmetric `p` of largest |eigenvalue| (values, vectors), by ARPACK's
    Lanczos from a fixed random vector (a run is repeatable; phi_0 itself, an eigenvector, would
    span nothing), or None where they cannot be trusted: a pair that is not one to rounding,
    or a skipped eigenvalue (Lanczos from one vector sees one direction of a repeated eigenvalue;
    counted by inertia: exactly k eigenvalues must have magnitude at least the k-th's)."""
    import scipy.sparse.linalg

    try:
        v0 = np.random.default_rng(0).standard_normal(len(p))
        w, v = scipy.sparse.linalg.eigsh(p, k=k, which="LM", v0=v0, tol=0)
    except scipy.sparse.linalg.ArpackError:
        return None
    scale = max(1.0, float(np.abs(w).max()))
    if not np.all(np.linalg.norm(p @ v - v * w, axis=0) <= 1e-10 * scale):
        return None
    theta = float(np.abs(w).min()) * (1.0 - 1e-9)
    if _inertia_above(p, theta) + _inertia_above(-p, theta) != k:
        return None
    return w, v


def _top_singular_connected(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """`_top_singular` of one connected component's `p`: every eigenpair (torch's eigh, much
    faster than numpy's on a busy machine) below `PARTIAL_EIGEN_MIN` items, or where the partial
    solution cannot be trusted; the k alone from there on (`_top_eigenpairs`)."""
    n = len(p)
    got = _top_eigenpairs(p, k) if n >= PARTIAL_EIGEN_MIN and k < n // 4 else None
    if got is None:
        import torch  # here: reading trees needs no torch

        got = tuple(a.numpy() for a in torch.linalg.eigh(torch.from_numpy(p)))
    w, v = got
    s = np.abs(w)
    idx = np.argsort(s)[::-1][:k]
    return v[:, idx], s[idx]


EIGEN_DECIMALS = 12
"""`_top_singular` ranks the magnitudes of different components' eigenvalues rounded to this many
decimals: each component's top eigenvalue is 1, computed to within ~1e-14."""


def _top_singular(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric `p`'s k singular pairs (vectors, values): its eigenvectors by |eigenvalue|
    descending, as numpy's svd(hermitian=True) orders them, one connected component of the graph
    of p's nonzero entries at a time (docs/method.md §2.2).

    `p` is block diagonal over the components, so its eigenpairs are theirs, padded with zeros.
    Each component's top eigenvalue is 1: on a disconnected graph the eigenvalue 1 is repeated,
    and a solver of the whole matrix returns an arbitrary basis of its eigenspace (Lanczos from
    one vector misses copies of it and falls back to every eigenpair). Per component, the basis is
    each component's own vector and a component's coordinates are exactly 0 on the others.
    Eigenvalues of equal magnitude (to `EIGEN_DECIMALS`) rank by their component, largest
    first, then by its first item."""
    from .tree_kernels import graph_components  # here: reading trees needs no numba

    n = len(p)
    n_comp, comp = graph_components(p)
    if n_comp == 1:
        return _top_singular_connected(p, k)
    sizes = np.bincount(comp, minlength=n_comp)
    members = np.argsort(comp, kind="stable")  # items grouped by component, in index order
    starts = np.concatenate([[0], np.cumsum(sizes)])
    first = members[starts[:-1]]
    vals, columns = [], []  # each candidate pair's |eigenvalue|, and its (items, vector)
    for c in np.lexsort((first, -sizes)):  # largest component first
        idx = members[starts[c]:starts[c + 1]]
        if len(idx) == 1:
            u, s = np.ones((1, 1)), np.abs(p[idx, idx])
        else:
            u, s = _top_singular_connected(p[np.ix_(idx, idx)], min(k, len(idx)))
        vals.append(s)
        columns.extend((idx, vec) for vec in u.T)
    vals = np.concatenate(vals)
    top = np.argsort(-np.round(vals, EIGEN_DECIMALS), kind="stable")[:k]
    out = np.zeros((n, len(top)))
    for col, j in enumerate(top):
        idx, vec = columns[j]
        out[idx, col] = vec
    return out, vals[top]


def _diffusion_embedding(affinity: np.ndarray, n_eigs: int):
    """docs/method.md §2.2 steps 1-2: the bi-stochastic-like normalisation and its top singular triplets.

    Returns (phi, s) with phi[:, k] = u_k / phi_0 (signs fixed by each coordinate's third moment)
    and s descending. phi_0 is the top vector of a connected graph, sqrt of the row sums of P1;
    using it (rather than the first singular vector, which is arbitrary inside the
    eigenspace of 1 when the graph is disconnected) keeps the division safe.
    """
    a = affinity * (affinity > 1e-8)
    d = a.sum(1) + 1e-15
    p1 = a / np.outer(d, d)
    d2 = np.sqrt(p1.sum(1)) + 1e-15
    p = p1 / np.outer(d2, d2)
    phi0 = d2 / np.linalg.norm(d2)
    u, s = _top_singular(p, min(n_eigs, len(d2)))
    phi = u / phi0[:, None]
    # a sign that does not depend on which item is listed first (it sets the sibling order only,
    # §2.4): the sign of each coordinate's third moment (sum of cubes), or of its largest-|.|
    # entry where that moment is 0 to rounding
    cubes = (phi ** 3).sum(0)
    big = phi[np.argmax(np.abs(phi), axis=0), np.arange(phi.shape[1])]
    sign = np.where(np.abs(cubes) > 1e-9 * (np.abs(phi) ** 3).sum(0), np.sign(cubes), np.sign(big))
    return phi * np.where(sign == 0, 1.0, sign), s


def _embedding_coordinates(phi: np.ndarray, s: np.ndarray, level: int) -> np.ndarray:
    """docs/method.md §2.2 step 3: the items' diffusion coordinates at time t = 2^(level - 1),
    (n, d) float64, whose Euclidean distances the levels compare (`tree_kernels.node_mean_distances`).

    Distances come from coordinate differences (pdist, `tree_kernels`), never as |a|^2 + |b|^2 - 2 a.b:
    that form cancels catastrophically once the coordinates decay, and at the coarse levels of an
    LLM's trees it returned rounding noise or exact zeros, so rounding-level changes of the input
    (or the order of the items) decided the merges. The trivial coordinate is left out where it
    is constant (a connected graph): it carries nothing but rounding noise. Coordinate k is
    scaled by s_k (s_k / s_max)^(t - 1) instead of s_k^t, s_max the largest kept s: every
    distance by the same factor s_max^(t - 1), which the greedy merge does not see (it compares
    distances with each other and with their median, §2.3), and no coordinate that matters
    underflows at large t (0.055^512 is 0 in float64).
    """
    n = phi.shape[0]
    col0 = phi[:, 0]
    start = 1 if np.ptp(col0) <= 1e-8 * max(1.0, float(np.abs(col0).max())) else 0
    if start >= phi.shape[1]:
        return np.zeros((n, 1))
    ss = s[start:]
    t = 2.0 ** (level - 1)
    top = float(ss.max())
    scale = ss * (ss / top) ** (t - 1) if top > 0 else ss ** t
    return phi[:, start:] * scale[None, :]


def _node_means(d_leaf: np.ndarray, node_of_leaf: np.ndarray) -> np.ndarray:
    """Mean of the symmetric d_leaf over the leaves of every pair of nodes: M d M^T with
    the sparse 0/1 membership M, O(n^2) (a dense membership product is O(n^3))."""
    import scipy.sparse  # here: its import is paid by the questionnaire only

    counts = np.bincount(node_of_leaf).astype(np.float64)
    n = node_of_leaf.size
    mem = scipy.sparse.csr_matrix((np.ones(n), (node_of_leaf, np.arange(n))), shape=(counts.size, n))
    d = mem @ (mem @ d_leaf).T
    return d / counts[:, None] / counts[None, :]


TIE_TOLERANCE = 1e-6
"""Distances within this relative gap of the next smaller one count as equal in the greedy
merge's orders (docs/method.md §2.3): ranked by the affinity the cut dropped, then by node
index, never by their last bits."""


def _runs(v: np.ndarray, tol: float, breaks: np.ndarray | None = None) -> np.ndarray:
    """Run ids along the last axis of a sorted nonnegative `v`: a value within a relative `tol`
    of the one before it shares its run, unless `breaks` (one bool fewer than `v`) starts a new one."""
    step = v[..., 1:] > v[..., :-1] * (1.0 + tol)
    if breaks is not None:
        step |= breaks
    return np.concatenate([np.zeros(v.shape[:-1] + (1,), dtype=np.int64), np.cumsum(step, axis=-1)], axis=-1)


def tie_order(values: np.ndarray, tol: float = TIE_TOLERANCE, secondary=None) -> np.ndarray:
    """argsort of nonnegative `values` along the last axis, near-equal values ranked together.

    A value within a relative `tol` of the one before it in sorted order ranks with it: an exact
    tie, moved by a rounding error, keeps its order. Such runs of near-equal values rank by the
    nonnegative `secondary` (its own near-equal values again within `tol`), then by index.

    Parameters
    ----------
    values : ndarray of shape (..., m)
        Nonnegative values, ranked along the last axis (a 1-D input is one row).
    tol : float, default TIE_TOLERANCE
        Relative gap within which values count as equal.
    secondary : ndarray of shape (..., m) or callable, optional
        Nonnegative, the same shape as `values`, or a function that returns it, called only
        where there is a tie.

    Returns
    -------
    ndarray of shape (..., m)
        int, the indices that sort each row.
    """
    values = np.asarray(values)
    order = np.argsort(values, axis=-1, kind="stable")
    run = _runs(np.take_along_axis(values, order, axis=-1), tol)
    tied = run[..., -1] < values.shape[-1] - 1  # only these rows can change (a 1-D input is one row)
    if not np.any(tied):
        return order
    rows = order[None] if order.ndim == 1 else order[tied]
    run = run[None] if order.ndim == 1 else run[tied]
    if secondary is not None:
        sec = np.asarray(secondary() if callable(secondary) else secondary)
        sec = np.take_along_axis(sec[None] if sec.ndim == 1 else sec[tied], rows, axis=-1)
        by_sec = np.lexsort((sec, run), axis=-1)  # positions by run, then by secondary
        # sub-runs of near-equal secondary values, never across a primary run's end
        sub = _runs(np.take_along_axis(sec, by_sec, axis=-1), tol,
                    breaks=np.diff(np.take_along_axis(run, by_sec, axis=-1), axis=-1) > 0)
        run = np.empty_like(sub)
        np.put_along_axis(run, by_sec, sub, axis=-1)
    ranked = np.take_along_axis(rows, np.lexsort((rows, run), axis=-1), axis=-1)
    if order.ndim == 1:
        return ranked[0]
    out = order.copy()
    out[tied] = ranked
    return out


NEIGHBOURS_SORTED = 32
"""How many of each node's nearest neighbours `_greedy_merge` ranks up front (`tie_order_prefix`);
a node that tries more gets its whole order then. A full sort of every row was most of a
4096-item tree's merge time, and a node stops after a few neighbours."""


def tie_order_prefix(values: np.ndarray, k: int, secondary=None) -> tuple[np.ndarray, np.ndarray]:
    """The first `k` columns of `tie_order(values, secondary=secondary)`, without sorting whole rows.

    Each row's 2k smallest values are found by partition and ranked as `tie_order` ranks them.
    The prefix is the full order's where the run of near-equal values at position k - 1 ends
    before the last of those 2k (runs are consecutive in sorted order, so none of its members
    is left out); `complete` is False on the other rows, whose prefix is not to be used.

    Parameters
    ----------
    values : ndarray of shape (rows, m)
        Nonnegative values, ranked along the last axis.
    k : int
        Number of leading columns wanted.
    secondary : ndarray of shape (rows, m) or callable, optional
        As `tie_order`'s.

    Returns
    -------
    prefix : ndarray of shape (rows, k)
        int, the first k columns of each row's order.
    complete : ndarray of shape (rows,)
        bool, whether each row's prefix is the full order's.
    """
    values = np.asarray(values)
    n_rows, m = values.shape
    if 2 * k >= m:
        return tie_order(values, secondary=secondary)[:, :k], np.ones(n_rows, dtype=bool)
    near = np.argpartition(values, 2 * k - 1, axis=-1)[:, :2 * k]
    v = np.take_along_axis(values, near, axis=-1)
    sec = None
    if secondary is not None:
        full_sec = secondary() if callable(secondary) else secondary
        sec = np.take_along_axis(np.asarray(full_sec), near, axis=-1)
    # rank the 2k by value, near-equal ones by the secondary key, then by index, as tie_order
    by_index = np.argsort(near, axis=-1, kind="stable")
    near, v = np.take_along_axis(near, by_index, axis=-1), np.take_along_axis(v, by_index, axis=-1)
    if sec is not None:
        sec = np.take_along_axis(sec, by_index, axis=-1)
    local = tie_order(v, secondary=sec)
    run = _runs(np.take_along_axis(v, np.argsort(v, axis=-1, kind="stable"), axis=-1), TIE_TOLERANCE)
    return np.take_along_axis(near, local[:, :k], axis=-1), run[:, k - 1] < run[:, -1]


def _greedy_merge(dist: np.ndarray, constant: float, log: list | None = None,
                  tiebreak=None) -> np.ndarray:
    """docs/method.md §2.3: group the current nodes at one level; returns a group id per node.

    `tiebreak`, (m, m) nonnegative (or a function that returns it, called only if `dist` has a
    tie), ranks the nodes of a tie in `dist` (smaller first) before their index does:
    `flexible_tree` passes the node means of -log(affinity) before the cut.

    `log`, a list, receives every decision as (decision, node i, node j or -1): "skip" (i is
    already in a group), "stop" (the median stop), "penalty" (a refused merge with j), and the
    outcome of i's turn, "join", "median", "2x nn" or "single" (`bench/near_ties.py` reads it)."""
    def note(*entry):
        if log is not None:
            log.append(entry)

    m = dist.shape[0]
    dist = dist.copy()
    np.fill_diagonal(dist, 999.0)
    med = float(np.median(dist))
    penalty = med / constant

    @cache
    def secondary():  # the tie-break, computed at most once and only where a tie needs it
        t = np.array(tiebreak() if callable(tiebreak) else tiebreak, dtype=np.float64)
        np.fill_diagonal(t, np.inf)
        return t

    # each node's neighbours, nearest first: the first few of every row, a whole row when a
    # node tries more of them (or where the few cannot be told apart from the rest)
    k = min(NEIGHBOURS_SORTED, m)
    prefix, complete = tie_order_prefix(dist, k, secondary=None if tiebreak is None else secondary)

    @cache
    def whole_row(i):
        return tie_order(dist[i], secondary=None if tiebreak is None else secondary()[i])

    def neighbours(i):  # self, at 999, is last
        if complete[i]:
            yield from prefix[i, :m - 1]
        if not complete[i] or k < m - 1:
            yield from whole_row(i)[k if complete[i] else 0:m - 1]

    nearest = prefix[:, 0].copy()
    for i in np.flatnonzero(~complete):
        nearest[i] = whole_row(i)[0]
    nn_dist = dist[np.arange(m), nearest]
    # visit ties: the node nearer its nearest neighbour by the tie-break goes first
    nn_tiebreak = None if tiebreak is None else (lambda: secondary()[np.arange(m), nearest])
    group = np.arange(m)
    size = np.ones(m, dtype=np.int64)  # number of current nodes in each group (by group id)
    # every comparison below counts values within TIE_TOLERANCE as equal: a near-tie with the
    # median or a threshold is decided the same way whatever its last bits
    lo, hi = 1.0 - TIE_TOLERANCE, 1.0 + TIE_TOLERANCE
    merges = 0
    for i in tie_order(nn_dist, secondary=nn_tiebreak):
        if size[group[i]] > 1:
            note("skip", i, -1)
            continue
        # stop at the median; identical nodes (distance 0) always join (degenerate input)
        if merges and nn_dist[i] >= med * lo and nn_dist[i] > 0:
            note("stop", i, -1)
            break
        outcome = ("single", i, -1)
        for j in neighbours(i):
            dij = dist[i, j]
            if merges and dij >= med * lo and dij > 0:
                outcome = ("median", i, j)
                break
            # "next-nearest" means comparably near: an isolated node stays single for
            # this level rather than pairing with a far singleton (keeps leaf orders smooth)
            if dij > 2.0 * nn_dist[i] * hi:
                outcome = ("2x nn", i, j)
                break
            gj = group[j]
            if size[gj] == 1 or dij < penalty * 2.0 ** (1 - size[gj]) * lo:
                group[i] = gj
                size[gj] += 1
                merges += 1
                outcome = ("join", i, j)
                break
            note("penalty", i, j)
        note(*outcome)
    _, group = np.unique(group, return_inverse=True)
    return group


def flexible_tree(affinity, constant: float = 1.0, n_eigs: int = 12, seed: int = 0) -> PartitionTree:
    """Bottom-up flexible tree from a symmetric nonnegative affinity (docs/method.md §2.2-§2.4).

    Levels are built by greedy merges in diffusion embeddings at dyadic times; siblings
    are ordered by the mean of the first nontrivial diffusion coordinate over their
    leaves, which makes the leaf order smooth. The construction is deterministic (no
    randomness is used; `seed` is accepted for API stability).

    Parameters
    ----------
    affinity : ndarray or torch.Tensor of shape (n, n)
        float, symmetric and nonnegative.
    constant : float, default 1.0
        The greedy merge's constant (docs/method.md §2.3: the penalty is the median distance
        divided by it), positive.
    n_eigs : int, default 12
        Number of diffusion eigenpairs computed (at most n).
    seed : int, default 0
        Unused: accepted for API stability.

    Returns
    -------
    PartitionTree
        A tree on the n items.

    Raises
    ------
    ValueError
        If `affinity` is not a square, symmetric, nonnegative, finite matrix with at least one
        item, or `constant` is not positive.
    """
    a = check_affinity(affinity, "affinity")
    if constant <= 0:
        raise ValueError(f"constant: must be positive, got {constant}")
    n = a.shape[0]
    if n == 1:
        return PartitionTree(np.zeros((1, 1), dtype=np.int64))
    phi, s = _diffusion_embedding(a, n_eigs)
    # ties of the diffusion distances (items the 1e-8 cut left equally unconnected, §2.3) rank
    # by the affinity before the cut, which they still differ in
    raw = cache(lambda: -np.log(np.maximum(a, 1e-300)))  # at the first tie only
    levels = [np.arange(n)]
    node_of_leaf = np.arange(n)
    lev = 1
    from .tree_kernels import node_mean_distances, node_means  # here: reading trees needs no numba

    while node_of_leaf.max() > 0:
        d_node = node_mean_distances(_embedding_coordinates(phi, s, lev), node_of_leaf)
        group = _greedy_merge(d_node, constant, tiebreak=lambda nodes=node_of_leaf: node_means(raw(), nodes))
        node_of_leaf = group[node_of_leaf]
        levels.append(node_of_leaf.copy())
        lev += 1
    # sibling order: by mean of psi_1 over each folder's leaves, at every level. psi_1 is the
    # first coordinate whose eigenvalue is below the top one: on a disconnected graph (the 1e-8
    # cut) the top eigenvalue repeats, once per component, and a vector inside that eigenspace
    # is whatever the eigensolver returned
    below = np.flatnonzero(s[1:] < s[0] * (1.0 - 1e-9)) + 1
    psi1 = phi[:, below[0]] if below.size else np.zeros(n)
    keys = []
    for lab in levels[::-1]:  # root first
        means = np.bincount(lab, weights=psi1) / np.bincount(lab)
        keys.append(np.round(means[lab], 12))
        keys.append(lab)  # ties: keep folders contiguous
    order = np.lexsort(keys[::-1])
    # relabel so that label order is the sibling order
    relabelled = []
    for lab in levels:
        seq = lab[order]
        first = np.unique(seq, return_index=True)[1]
        rank = np.empty(seq.max() + 1, dtype=np.int64)
        rank[seq[np.sort(first)]] = np.arange(first.size)
        relabelled.append(rank[lab])
    return _levels_to_tree(relabelled)


def level_agreement(tree: PartitionTree, labels) -> np.ndarray:
    """Adjusted Rand index between the folders of each level of `tree` and a labelling of its items.

    1 where a level's folders are exactly the label classes, about 0 where they are no closer
    to them than a random partition with the same folder sizes (negative: further). The root
    scores 0 against any labelling with more than one class, and so do the leaves (singletons)
    against any labelling with a class of two items or more.

    Parameters
    ----------
    tree : PartitionTree
        A tree on n items.
    labels : array_like of shape (n,)
        A label per item (say, each head's layer).

    Returns
    -------
    ndarray of shape (n_levels,)
        float64, level 0 (the root) first.

    Raises
    ------
    ValueError
        If `labels` does not have shape (n,).
    """
    lab = np.asarray(labels)
    if lab.shape != (tree.n,):
        raise ValueError(f"labels: expected one label per item, shape ({tree.n},), got {lab.shape}")
    return adjusted_rand_index(lab, np.asarray(tree.labels))


def adjusted_rand_index(labels, partitions) -> np.ndarray:
    """Adjusted Rand index (Hubert and Arabie, 1985) between one labelling of n items and each row of `partitions`.

    All rows at once, from the pair counts in exact integers: of the n(n-1)/2 pairs of items,
    `same` are together in both, `only_l` in the labelling alone, `only_p` in the partition alone,
    `apart` in neither; ARI = 2 (same apart - only_l only_p) / ((same + only_l)(only_l + apart) +
    (same + only_p)(only_p + apart)), and 1 where the two agree on every pair (no pair in only one
    of them: both one class, or both all singletons).

    Parameters
    ----------
    labels : array_like of shape (n,)
        The labelling.
    partitions : array_like of shape (k, n)
        One partition of the n items per row, by label.

    Returns
    -------
    ndarray of shape (k,)
        float64, one index per row of `partitions`.
    """
    lab = np.unique(np.asarray(labels), return_inverse=True)[1].reshape(-1)
    n = lab.size
    part = np.unique(np.asarray(partitions), return_inverse=True)[1].reshape(-1, n)
    k, width = part.shape[0], int(part.max()) + 1
    # together in a row's classes, and in both: sums of squared class sizes, every row's classes
    # (and their intersections with the labelling's) counted by one bincount over all rows
    cell = np.arange(k)[:, None] * width + part
    sq_part = (np.bincount(cell.ravel(), minlength=k * width).reshape(k, -1) ** 2).sum(1)
    n_lab = int(lab.max()) + 1
    sq_both = (np.bincount((cell * n_lab + lab).ravel(), minlength=k * width * n_lab).reshape(k, -1) ** 2).sum(1)
    sq_lab = int((np.bincount(lab) ** 2).sum())
    # ordered pairs of distinct items: together in both, in one only, in neither
    same = sq_both - n
    only_l = sq_lab - sq_both
    only_p = sq_part - sq_both
    apart = n * n - sq_lab - sq_part + sq_both
    num = 2.0 * (same * apart - only_l * only_p).astype(np.float64)
    den = ((same + only_l) * (only_l + apart) + (same + only_p) * (only_p + apart)).astype(np.float64)
    out = np.ones(k, dtype=np.float64)
    split = (only_l != 0) | (only_p != 0)
    out[split] = num[split] / den[split]
    return out


def architecture_agreement(tree: PartitionTree, unit_layer, unit_head, unit_kv_group=None):
    """`level_agreement` of a head tree against the heads' layers and key/value heads.

    Against the layers, and against the key/value heads ((layer, kv_group) pairs) in a
    grouped-query model: one with fewer key/value groups than heads; NaN otherwise (no groups,
    or a group per head).

    Parameters
    ----------
    tree : PartitionTree
        A tree on n heads.
    unit_layer : array_like of shape (n,)
        int, each head's layer.
    unit_head : array_like of shape (n,)
        Each head's query-head index; only its number of distinct values is used (against
        `unit_kv_group`'s).
    unit_kv_group : array_like of shape (n,), optional
        int, each head's key/value group (None: no groups).

    Returns
    -------
    by_layer : ndarray of shape (n_levels,)
        `level_agreement` against the layers.
    by_kv_head : ndarray of shape (n_levels,)
        `level_agreement` against the (layer, kv_group) pairs, or all NaN.

    Raises
    ------
    ValueError
        If `unit_layer` (or `unit_kv_group`) does not have one entry per item of `tree`.
    """
    layer = np.asarray(unit_layer, dtype=np.int64)
    by_layer = level_agreement(tree, layer)
    if unit_kv_group is None:
        return by_layer, np.full(tree.n_levels, np.nan)
    kv = np.asarray(unit_kv_group, dtype=np.int64)
    if np.unique(kv).size >= np.unique(np.asarray(unit_head)).size:
        return by_layer, np.full(tree.n_levels, np.nan)
    return by_layer, level_agreement(tree, layer * (int(kv.max()) + 1) + kv)


def padded_labels(trees: list[PartitionTree], n: int) -> np.ndarray:
    """The labels of trees of n items and of different depths in one (tree, level, item) array.

    The shallower ones are padded with rows of -1 (a store variable; `from_padded` reads one
    back).

    Parameters
    ----------
    trees : list of PartitionTree
        Trees on n items each.
    n : int
        Number of items.

    Returns
    -------
    ndarray of shape (n_trees, n_levels, n)
        int64, n_levels the deepest tree's number of levels. No trees: shape (0, 1, n).

    Raises
    ------
    ValueError
        If a tree does not have n items.
    """
    for t in trees:
        if t.n != n:
            raise ValueError(f"trees: a tree of {t.n} items among trees of {n}")
    out = np.full((len(trees), max((t.n_levels for t in trees), default=1), n), -1, dtype=np.int64)
    for i, t in enumerate(trees):
        out[i, :t.n_levels] = t.labels
    return out


def from_padded(labels: np.ndarray) -> PartitionTree:
    """The tree of one (level, item) slice of `padded_labels` (its rows of -1 dropped).

    Parameters
    ----------
    labels : ndarray of shape (n_levels, n)
        int, one tree's slice of `padded_labels`.

    Returns
    -------
    PartitionTree
        The tree on the n items.

    Raises
    ------
    ValueError
        If the rows that are not padding are not a valid tree (see `PartitionTree`).
    """
    labels = np.asarray(labels)
    return PartitionTree(labels[labels[:, 0] >= 0])
