"""Table 1's note on the head tree against the architecture (docs/method.md §6.4), from organized stores
written here: a grouped-query network of 3 layers x 4 heads with 2 key/value heads per layer."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import store
from oattn_lib.stages.tables import head_tree_architecture, tables

LAYER = np.repeat(np.arange(3), 4)
HEAD = np.tile(np.arange(4), 3)
KV = HEAD // 2  # transformers' layout: query heads 0-1 read key/value head 0, 2-3 head 1


def _organized(path, levels, kv=True):
    coords = {"unit_layer": ("unit", LAYER), "unit_head": ("unit", HEAD)}
    if kv:
        coords["unit_kv_group"] = ("unit", KV)
    ds = xr.Dataset({"tree_h": (("level_h", "unit"), np.stack(levels))}, coords=coords)
    store.write_store(ds, path)
    return path


def _entropy(path, n_s):
    e = np.random.default_rng(0).random((n_s, 3, 4))
    ds = xr.Dataset({"head_entropy": (("sample", "layer", "head"), e),
                     **{k: ("sample", np.ones(n_s)) for k in (
                         "network_entropy", "network_sparsity", "network_sparsity_random", "network_l1",
                         "network_l1_random", "network_sparsity_natural", "network_l1_natural", "network_l2")}},
                    coords={"sample": np.arange(n_s), "layer": np.arange(3), "head": np.arange(4)})
    store.write_store(ds, path)
    return path


def test_a_tree_of_layers_then_kv_heads_is_found_and_a_scrambled_one_is_not(tmp_path):
    root, leaves = np.zeros(12, int), np.arange(12)
    by_kv = LAYER * 2 + KV
    found = _organized(tmp_path / "a.zarr", [root, LAYER, by_kv, leaves])
    # the second sample: folders of heads with the same index across layers (kv and layer crossed)
    crossed = _organized(tmp_path / "b.zarr", [root, KV, HEAD, leaves])
    arch = head_tree_architecture([found, crossed])
    assert list(arch["level"]) == [1, 2] and list(arch["samples"]) == [2, 2]
    assert list(arch["folders"]) == [2.5, 5.0]  # (3 + 2) / 2, (6 + 4) / 2
    one = head_tree_architecture([found]).set_index("level")
    assert one.loc[1, "ari_layer"] == pytest.approx(1.0) and one.loc[2, "ari_kv_group"] == pytest.approx(1.0)
    two = head_tree_architecture([crossed]).set_index("level")
    assert two.loc[1, "ari_layer"] < 0.05 and two.loc[2, "ari_kv_group"] < 0.05
    # the means over the two samples, and the note of Table 1
    n_s = 2
    outs = [tmp_path / f for f in ("t1.csv", "t1.md", "t2.csv", "t2.md")]
    tables(_entropy(tmp_path / "ent.zarr", n_s), *outs, fraction=0.25, model_name="gqa",
           organized_stores=[found, crossed], out_head_tree_csv=tmp_path / "head_tree.csv")
    csv = pd.read_csv(tmp_path / "head_tree.csv").set_index("level")
    assert csv.loc[1, "ari_layer"] == pytest.approx((1.0 + two.loc[1, "ari_layer"]) / 2)
    note = outs[1].read_text()
    assert "Head tree against the architecture" in note and "key/value heads: level 2" in note


def test_without_grouped_heads_only_layers_are_compared(tmp_path):
    mha = _organized(tmp_path / "a.zarr", [np.zeros(12, int), LAYER, np.arange(12)], kv=False)
    arch = head_tree_architecture([mha])
    assert arch["ari_kv_group"].isna().all() and arch["ari_layer"].iloc[0] == pytest.approx(1.0)
    outs = [tmp_path / f for f in ("t1.csv", "t1.md", "t2.csv", "t2.md")]
    tables(_entropy(tmp_path / "ent.zarr", 1), *outs, organized_stores=[mha])
    note = outs[1].read_text()
    assert "level 1 (3 folders, ARI 1.00)" in note and "key/value" not in note
