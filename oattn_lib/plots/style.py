"""The one look of every figure, the validation of plot inputs, and the atomic PNG write.

Figures are built without pyplot (no global figure registry): `new_figure` gives a
figure with its own Agg canvas and constrained layout, `styled` wraps a figure function
in the project's rc settings, and `save` writes one PNG atomically. Inputs are validated
at the boundary like scikit-learn does (`as_array`, `same_shape`, `name_list`): a wrong
shape raises `ValueError` naming the argument and the shape it got. Colour limits
(`seq_clim`, `sym_clim`) stay valid for constant inputs.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .. import store

__all__ = ["DIVERGING", "DPI", "SEQUENTIAL", "as_array", "heatmap", "name_list", "new_figure",
           "same_shape", "save", "seq_clim", "styled", "sym_clim"]

DPI = 120
"""Resolution of saved PNGs: a figure of w x h inches is 120 w x 120 h pixels."""

SEQUENTIAL = "viridis"
DIVERGING = "RdBu_r"

_RC = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.framealpha": 0.85,
    "figure.titlesize": 13,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "image.interpolation": "nearest",
    "image.origin": "upper",
    "axes.grid": False,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.4,
}


# -- style and figures ----------------------------------------------------------------
def styled(fn):
    """Build the figure under the project's one style (font sizes, white background)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with mpl.rc_context(_RC):
            return fn(*args, **kwargs)
    return wrapper


def new_figure(width: float, height: float) -> Figure:
    """A pyplot-free figure with an Agg canvas and constrained layout."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def as_array(x, name: str, ndim: int | tuple[int, ...], finite: bool = True) -> np.ndarray:
    """`x` as float64 numpy (torch tensors accepted), validated like scikit-learn does."""
    if hasattr(x, "detach"):  # torch tensor, on any device; avoids importing torch here
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a numeric array ({exc})") from exc
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if a.ndim not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{name}: expected {want} dimensions, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name}: has an axis of length 0 (shape {a.shape})")
    if finite and not np.isfinite(a).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name}: contains NaN or inf (first at index {bad})")
    return a


def same_shape(ref: np.ndarray, ref_name: str, **others: np.ndarray) -> None:
    """Raise ValueError naming any of `others` whose shape differs from `ref`'s."""
    for name, a in others.items():
        if a.shape != ref.shape:
            raise ValueError(f"{name}: expected the shape of {ref_name} {ref.shape}, got {a.shape}")


def name_list(names, n: int, what: str) -> list[str]:
    """`names` as n strings; ValueError naming `what` if there are not n of them."""
    names = [str(s) for s in names]
    if len(names) != n:
        raise ValueError(f"{what}: expected {n} names, got {len(names)}")
    return names


def seq_clim(*arrays: np.ndarray, robust: bool = False) -> tuple[float, float]:
    """Shared colour limits; a constant input gets a widened, still valid, range.

    With `robust`, the upper limit is the 99.5th percentile of the pooled values, so a
    few dominant entries (a CLS or sink column) do not flatten the rest of the image.
    """
    lo = float(min(np.min(a) for a in arrays))
    hi = float(max(np.max(a) for a in arrays))
    if robust:
        q = float(np.percentile(np.concatenate([np.ravel(a) for a in arrays]), 99.5))
        hi = q if q > lo else hi
    if not hi - lo > 1e-12 * max(1.0, abs(lo), abs(hi)):
        pad = 0.5 * max(abs(lo), 1.0)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def sym_clim(*arrays: np.ndarray) -> tuple[float, float]:
    """Colour limits symmetric about 0 (diverging maps centred at zero)."""
    m = float(max(np.max(np.abs(a)) for a in arrays))
    if not m > 0:
        m = 1.0
    return -m, m


def _aspect(shape: tuple[int, int]) -> str:
    """Square pixels unless the matrix is so elongated that it would become a sliver."""
    return "equal" if max(shape) <= 4 * min(shape) else "auto"


def heatmap(ax, img, clim, cmap, title, xlabel, ylabel):
    """Draw `img` on `ax` with the project's heatmap conventions; returns the image."""
    im = ax.imshow(img, cmap=cmap, vmin=clim[0], vmax=clim[1], aspect=_aspect(img.shape),
                   interpolation="nearest")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(6, integer=True))
    return im


# -- saving ----------------------------------------------------------------------------
def save(fig: Figure, path) -> Path:
    """Write `fig` as a PNG at `DPI` to `path` atomically, then close the figure.

    The image is written to a temporary sibling and renamed over `path`
    (`store.atomic_output`), so a reader (or Snakemake) never sees a half-written file.
    Figure size is kept as is (no tight bounding box): the PNG is DPI * figsize pixels.
    """
    path = Path(path)
    try:
        with store.atomic_output(path) as tmp, open(tmp, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI)
    finally:
        # Only figures made through pyplot are registered there; ours never are.
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(fig)
    return path
