"""Checkpoints: tensors and plain metadata only, loaded with torch's restricted unpickler."""
import json
import os

import pytest
import torch

from oattn_lib.models.checkpoint import CheckpointError, build_model, load_checkpoint, load_trained, save_checkpoint

ARCH = {"n_layer": 1, "n_head": 2, "d_model": 16, "d_head": 8, "d_inner": 32, "tgt_len": 8, "mem_len": 8}


def test_round_trip_restores_weights_and_metadata(tmp_path):
    torch.manual_seed(0)
    net = build_model("txl", ARCH, n_token=50)
    save_checkpoint(net, "txl", ARCH, {"corpus": "stdlib"}, {"valid_ppl": 9.0}, tmp_path / "c.pt", tmp_path / "m.json")
    ck = load_checkpoint(tmp_path / "c.pt")
    assert ck["kind"] == "txl" and ck["arch"] == ARCH and ck["data"] == {"corpus": "stdlib"}
    loaded, _ = load_trained(tmp_path / "c.pt", n_token=50)
    for (k, a), (k2, b) in zip(net.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert len(json.loads((tmp_path / "m.json").read_text())["state_sha256"]) == 64
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


class _RunsCode:
    """Unpickling this would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"kind": "txl", "arch": ARCH, "data": {}, "state_dict": {}, "extra": _RunsCode(marker)}, path)
    with pytest.raises(CheckpointError, match=r"evil\.pt: refused to load"):
        load_checkpoint(path)
    assert not marker.exists(), "loading must not have run the payload"
    # torch's own unrestricted load would have run it: the test's payload is real
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_missing_and_foreign_checkpoints_are_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"nothere\.pt: checkpoint does not exist"):
        load_checkpoint(tmp_path / "nothere.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"other\.pt: not an oattn checkpoint \(missing \['kind', 'arch', 'state_dict'\]\)"):
        load_checkpoint(tmp_path / "other.pt")


def test_metadata_that_is_not_plain_data_is_not_saved(tmp_path):
    net = build_model("txl", ARCH, n_token=50)
    with pytest.raises(ValueError, match="arch: checkpoint metadata must be JSON-able"):
        save_checkpoint(net, "txl", {**ARCH, "bad": object()}, {}, {}, tmp_path / "c.pt", tmp_path / "m.json")
    assert list(tmp_path.iterdir()) == []
