"""Figures (paper Figures 1-6 and the ablation plot): the data is really drawn, scales are
shared or centred as promised, edge shapes and constant inputs render without warnings,
and `save` writes a PNG of the promised pixel size atomically."""
import warnings

import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from oattn_lib import plots
from oattn_lib.haar import haar_basis
from oattn_lib.trees import random_tree

RNG = np.random.default_rng(0)


def render_strict(fig):
    """Draw the whole figure with every warning turned into an error."""
    fig.set_dpi(50)  # a coarse raster is enough to run every draw path, and faster
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.canvas.draw()
    return fig


def strict(fn, *args, **kwargs):
    """Build and draw a figure with every warning turned into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return render_strict(fn(*args, **kwargs))


def by_gid(ax, gid):
    arts = [a for a in ax.get_children() if a.get_gid() == gid]
    return arts


def clim_ok(im):
    lo, hi = im.get_clim()
    return np.isfinite(lo) and np.isfinite(hi) and lo < hi


# -- Figure 1 ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 7), (1, 1), (197, 197)])
def test_fig1_draws_both_heads_on_one_scale(shape):
    orig = RNG.random(shape)
    org = orig[::-1] * 2
    fig = strict(plots.fig1_organized_head, orig, org, "layer 3 head 5")
    a, b = fig.axes[:2]
    np.testing.assert_array_equal(a.images[0].get_array(), orig)
    np.testing.assert_array_equal(b.images[0].get_array(), org)
    assert a.images[0].get_clim() == b.images[0].get_clim()
    lo, hi = a.images[0].get_clim()
    assert lo <= min(orig.min(), org.min()) and hi >= max(orig.max(), org.max())
    assert clim_ok(a.images[0])
    assert a.get_xlabel() == "key" and a.get_ylabel() == "query"
    assert len(fig.axes) == 3  # two panels and one shared colorbar


def test_fig1_robust_scale_is_shared_and_below_the_maximum():
    orig = RNG.random((20, 30))
    orig[2, 0] = 50.0  # one dominant entry (< 0.5% of the cells)
    fig = strict(plots.fig1_organized_head, orig, orig[::-1], robust=True)
    c0, c1 = (ax.images[0].get_clim() for ax in fig.axes[:2])
    assert c0 == c1 and c0[1] < 50.0


def test_constant_head_gets_a_valid_colour_scale():
    fig = strict(plots.fig1_organized_head, np.full((4, 6), 0.25), np.full((4, 6), 0.25))
    assert all(clim_ok(ax.images[0]) for ax in fig.axes[:2])


def test_shapes_are_validated_with_the_argument_name():
    with pytest.raises(ValueError, match="organized"):
        plots.fig1_organized_head(np.zeros((3, 4)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="original"):
        plots.fig1_organized_head(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        plots.fig1_organized_head(np.full((2, 2), np.nan), np.zeros((2, 2)))


# -- Figure 2 ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 9), (1, 1)])
def test_fig2_panels_and_centred_residual(shape):
    exact = RNG.random(shape)
    approx = exact + 0.05 * RNG.normal(size=shape)
    res = exact - approx + 0.3  # deliberately off-centre: the scale must still be centred
    fig = strict(plots.fig2_paraproduct, exact, approx, res, 0.0123, 0.456, "TXL 10.7")
    imgs = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(imgs) == 3
    np.testing.assert_array_equal(imgs[0].get_array(), exact)
    np.testing.assert_array_equal(imgs[1].get_array(), approx)
    np.testing.assert_array_equal(imgs[2].get_array(), res)
    assert imgs[0].get_clim() == imgs[1].get_clim()
    lo, hi = imgs[2].get_clim()
    assert lo == -hi and hi >= np.abs(res).max()
    assert imgs[2].get_cmap().name == plots.DIVERGING
    text = fig.get_suptitle() + fig.axes[2].get_title()
    assert "0.0123" in text and "0.456" in text


def test_fig2_zero_residual_and_nan_norm_render():
    x = np.full((3, 5), 0.2)
    fig = strict(plots.fig2_paraproduct, x, x, np.zeros_like(x), 0.0, float("nan"))
    res = [ax.images[0] for ax in fig.axes if ax.images][2]
    assert res.get_clim() == (-1.0, 1.0)
    assert "n/a" in fig.get_suptitle()


# -- Figure 3 ---------------------------------------------------------------------------
def head_inputs(n_layers, n_heads, seed=0):
    rng = np.random.default_rng(seed)
    h = n_layers * n_heads
    coords = rng.normal(size=(h, 3))
    f = rng.normal(size=(h, 2))
    aff = np.exp(-((f[:, None] - f[None]) ** 2).sum(-1))
    tree = random_tree(h, rng)
    labels = [f"{i // n_heads}.{i % n_heads}" for i in range(h)]
    return coords, aff, tree, labels


@pytest.mark.parametrize("n_layers,n_heads", [(3, 4), (1, 1)])
def test_fig3_scatter_affinity_and_tree(n_layers, n_heads):
    coords, aff, tree, labels = head_inputs(n_layers, n_heads)
    fig = strict(plots.fig3_head_geometry, coords, aff, tree.labels, labels, tree.order)
    ax3d, ax_aff, ax_tree = fig.axes[0], fig.axes[2], fig.axes[4]
    sc = ax3d.collections[0]
    np.testing.assert_allclose(np.column_stack(sc._offsets3d), coords)
    # coloured by layer, parsed from "layer.head"
    np.testing.assert_array_equal(sc.get_array(), [int(s.split(".")[0]) for s in labels])
    np.testing.assert_array_equal(ax_aff.images[0].get_array(), aff[tree.order][:, tree.order])
    folders = by_gid(ax_tree, "folders")[0]
    n_folders = sum(tree.n_folders(lev) for lev in range(tree.n_levels))
    assert len(folders.get_paths()) == n_folders
    # every folder's bar spans exactly its leaves' positions in the organized order
    pos = np.empty(tree.n)
    pos[tree.order] = np.arange(tree.n)
    got = sorted((round(p.vertices[:, 1].mean()), p.vertices[:, 0].min() + 0.5,
                  p.vertices[:, 0].max() - 0.5) for p in folders.get_paths())
    want = sorted((lev, pos[tree.labels[lev] == f].min(), pos[tree.labels[lev] == f].max())
                  for lev in range(tree.n_levels) for f in range(tree.n_folders(lev)))
    np.testing.assert_allclose(got, want)
    assert ax_tree.get_ylim()[0] > ax_tree.get_ylim()[1]  # root at the top


def test_fig3_constant_coordinates_and_affinity_render():
    coords, aff, tree, labels = head_inputs(2, 3)
    strict(plots.fig3_head_geometry, np.zeros((6, 3)), np.ones((6, 6)), tree.labels, labels, tree.order)


def test_fig3_validates_labels_and_order():
    coords, aff, tree, labels = head_inputs(2, 2)
    with pytest.raises(ValueError, match="unit_labels"):
        plots.fig3_head_geometry(coords, aff, tree.labels, ["a", "b", "c", "d"], tree.order)
    with pytest.raises(ValueError, match="order"):
        plots.fig3_head_geometry(coords, aff, tree.labels, labels, np.zeros(4, int))
    with pytest.raises(ValueError, match="affinity"):
        plots.fig3_head_geometry(coords, aff[:3], tree.labels, labels, tree.order)


# -- Figure 4 ---------------------------------------------------------------------------
def bihaar_inputs(n=12, h=10, seed=0):
    rng = np.random.default_rng(seed)
    sup = np.sort(rng.integers(1, 100, n))[::-1].astype(float)
    coeffs = [rng.normal(size=n), rng.normal(size=n) * 0.1]
    b, _, _ = haar_basis(random_tree(h, rng))
    return coeffs, [sup, sup], ["10.7", "15.0"], b[:, :4]


def test_fig4_coefficients_and_haar_vectors_drawn():
    coeffs, sups, names, hv = bihaar_inputs()
    coeffs[0][3] = 0.0  # an exact zero: below the log floor, marked on the edge
    fig = strict(plots.fig4_bihaar, coeffs, sups, names, hv)
    for ax, c, name in zip(fig.axes, coeffs, names):
        line = by_gid(ax, "coefficients")[0]
        np.testing.assert_array_equal(line.get_ydata(), np.abs(c))
        np.testing.assert_array_equal(line.get_xdata(), np.arange(c.size))
        assert ax.get_yscale() == "log" and name in ax.get_title()
    assert len(by_gid(fig.axes[0], "below-floor")[0].get_xdata()) == 1
    vec_ax = [ax for ax in fig.axes if by_gid(ax, "haar-vector")][0]
    lines = by_gid(vec_ax, "haar-vector")
    assert len(lines) == hv.shape[1]
    for line, v in zip(lines, hv.T):  # stacked with an offset: the shape is the vector
        y = np.asarray(line.get_ydata())
        np.testing.assert_allclose(y - y[0], v - v[0], atol=1e-12)


def test_fig4_single_head_zero_coefficients_and_validation():
    fig = strict(plots.fig4_bihaar, [np.zeros(5)], [np.full(5, 4.0)], ["0.0"], np.ones((1, 1)))
    assert fig.axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match="sorted"):
        plots.fig4_bihaar([np.ones(3)], [np.array([1.0, 2.0, 3.0])], ["0.0"], np.ones((2, 1)))
    with pytest.raises(ValueError, match="head_names"):
        plots.fig4_bihaar([np.ones(3)], [np.ones(3)], ["a", "b"], np.ones((2, 1)))


# -- Figure 5 ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 1, 1)])
def test_fig5_one_heatmap_per_sample_on_one_scale(shape):
    e = RNG.gamma(3.0, 100.0, size=shape)
    e.flat[0] = 12345.0  # large values are written in full, not as 1.23e+04
    names = [f"batch {i}" for i in range(shape[0])]
    fig = strict(plots.fig5_entropy_heatmaps, e, names)
    panels = [ax for ax in fig.axes if ax.images and ax.get_title() in names]
    assert [ax.get_title() for ax in panels] == names
    for ax, x in zip(panels, e):
        np.testing.assert_array_equal(ax.images[0].get_array(), x)
        assert ax.images[0].get_clim() == panels[0].images[0].get_clim()
        assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
        assert len(ax.texts) == x.size  # annotated: few cells
        assert not any("e+" in t.get_text() for t in ax.texts)


def test_fig5_constant_and_unannotated():
    fig = strict(plots.fig5_entropy_heatmaps, np.ones((2, 3, 20)), ["a", "b"])
    panels = [ax for ax in fig.axes if ax.images]
    assert all(clim_ok(ax.images[0]) and not ax.texts for ax in panels[:2])


# -- Figure 6 ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 100), (1, 1)])
def test_fig6_one_series_per_sample(shape):
    v = RNG.normal(size=shape)
    names = [f"batch {i}" for i in range(shape[0])]
    fig = strict(plots.fig6_top_trihaar, v, names)
    lines = by_gid(fig.axes[0], "sample")
    assert len(lines) == shape[0]
    for line, y, name in zip(lines, v, names):
        np.testing.assert_array_equal(line.get_ydata(), y)
        np.testing.assert_array_equal(line.get_xdata(), np.arange(1, shape[1] + 1))
        assert name in line.get_label() and f"{np.abs(y).sum():.3g}" in line.get_label()


def test_fig6_constant_values_render():
    strict(plots.fig6_top_trihaar, np.zeros((3, 10)), ["a", "b", "c"])


# -- Figure 7 ---------------------------------------------------------------------------
def test_fig7_lines_and_random_band():
    f = np.linspace(0, 0.5, 6)
    rand = RNG.random((4, 6))
    curves = {"low entropy first": 1 - f, "high entropy first": 1 - 2 * f, "random": rand}
    fig = strict(plots.fig7_ablation, f, curves, "top-1 accuracy")
    ax = fig.axes[0]
    lines = by_gid(ax, "ranking")
    assert len(lines) == 3
    np.testing.assert_array_equal(lines[0].get_ydata(), 1 - f)
    np.testing.assert_allclose(lines[2].get_ydata(), rand.mean(0))
    bands = by_gid(ax, "band")
    assert len(bands) == 1 and isinstance(bands[0], PolyCollection)
    ys = np.concatenate([p.vertices[:, 1] for p in bands[0].get_paths()])
    assert np.isclose(ys.min(), rand.min()) and np.isclose(ys.max(), rand.max())
    assert ax.get_ylabel() == "top-1 accuracy"


def test_fig7_single_fraction_constant_and_validation():
    strict(plots.fig7_ablation, [0.0], {"random": np.ones((3, 1)), "a": [1.0]}, "loss")
    with pytest.raises(ValueError, match="'a'"):
        plots.fig7_ablation([0.0, 0.1], {"a": [1.0, 2.0, 3.0]}, "loss")


# -- save -------------------------------------------------------------------------------
def test_save_writes_png_of_dpi_times_figsize_atomically(tmp_path):
    fig = plots.fig1_organized_head(RNG.random((8, 5)), RNG.random((8, 5)), "t")
    w, h = fig.get_size_inches()
    out = plots.save(fig, tmp_path / "sub" / "fig1.png")
    img = mpimg.imread(out)
    assert img.shape[:2] == (round(h * plots.DPI), round(w * plots.DPI))
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["fig1.png"]
    # overwrite in place, still no temporary left behind
    plots.save(plots.fig6_top_trihaar(np.ones((1, 3)), ["a"]), out)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["fig1.png"]


def test_save_failure_leaves_no_temporary(tmp_path, monkeypatch):
    fig = plots.fig6_top_trihaar(np.ones((1, 3)), ["a"])

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(fig, "savefig", boom)
    with pytest.raises(RuntimeError):
        plots.save(fig, tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    v = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    fig = plots.fig6_top_trihaar(v, ["a", "b"])
    np.testing.assert_array_equal(by_gid(fig.axes[0], "sample")[1].get_ydata(), [3, 4, 5])


def test_the_package_keeps_the_public_names_of_the_old_module():
    old = {"DPI", "SEQUENTIAL", "DIVERGING", "save", "new_figure", "styled", "fig1_organized_head",
           "fig2_paraproduct", "fig3_head_geometry", "fig4_bihaar", "fig5_entropy_heatmaps", "fig6_top_trihaar",
           "fig7_ablation"}
    assert old <= set(plots.__all__)
    assert all(callable(getattr(plots, n)) or n in ("DPI", "SEQUENTIAL", "DIVERGING") for n in plots.__all__)
