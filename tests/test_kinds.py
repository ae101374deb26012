"""Kinds of model (oattn_lib.models.kinds): the registry, the protocol every adapter answers, and
what an adapter refuses."""
import inspect
import subprocess
import sys

import pytest
import yaml

from oattn_lib.config import SCHEMA, ConfigError
from oattn_lib.models import KINDS, ModelKind, Unsupported, adapter, adapter_for


def test_the_registry_holds_exactly_the_schemas_kinds():
    schema = yaml.safe_load(open(SCHEMA))
    assert set(KINDS) == set(schema["$defs"]["model"]["properties"]["kind"]["enum"])
    for name, kind in KINDS.items():
        assert adapter_for(name) is kind and kind.name == name
        assert adapter({"name": "m", "kind": name}) is kind


@pytest.mark.parametrize("bad", ["gpt", "", None, "TXL"])
def test_an_unknown_kind_is_refused_naming_it_and_the_allowed_ones(bad):
    with pytest.raises(ValueError, match=rf"unknown model kind {bad!r}.*allowed: txl, vit, hf"):
        adapter_for(bad)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_adapter_answers_the_whole_protocol(name):
    kind = adapter_for(name)
    assert isinstance(kind, ModelKind) and not inspect.isabstract(type(kind))
    for method in ("n_tokens", "n_units", "config_problem", "datasets", "pretrained_weights", "prune_params",
                   "retrain_problem", "validation_metric", "prepare_data", "build", "train", "retrain",
                   "extraction", "ablation"):
        ours, base = inspect.signature(getattr(type(kind), method)), inspect.signature(getattr(ModelKind, method))
        assert list(ours.parameters) == list(base.parameters), f"{name}.{method}{ours} differs from {base}"
    for flag in ("trains", "prunes", "image_patches"):
        assert isinstance(getattr(kind, flag), bool)
    assert kind.typical_quantity in ("scores", "probs")
    # a kind that is trained reports a metric; one that is not says so, naming itself
    if kind.trains:
        assert len(kind.validation_metric()) == 2
    else:
        with pytest.raises(Unsupported, match=f"kind '{name}'"):
            kind.validation_metric()


def test_what_a_kind_cannot_do_is_an_error_naming_the_model():
    hf = adapter_for("hf")
    assert not hf.trains
    with pytest.raises(Unsupported, match="be built or trained"):
        hf.build({}, {}, {})
    with pytest.raises(Unsupported, match="be trained by the workflow"):
        hf.train(None, {}, {}, {}, {}, "cpu")

    class Precomputed(ModelKind):  # a kind that only reads attention files: no training, no gates
        name = "precomputed"

        def n_tokens(self, model):
            return None

        def n_units(self, model):
            return None

        def prepare_data(self, data, data_root):
            return {}, {}

        def extraction(self, model, **kw):
            raise NotImplementedError

    k = Precomputed()
    assert not (k.trains or k.prunes)
    with pytest.raises(Unsupported, match=r"model 'files' \(kind precomputed\): a precomputed model cannot have "
                                          r"its heads masked"):
        k.ablation({"name": "files"}, data_npz=None, meta={}, checkpoint=None, device="cpu")
    assert "not trained by the experiment" in k.retrain_problem({})


def test_the_stages_refuse_a_kind_before_any_work(tmp_path):
    from oattn_lib.stages.prune import prune
    from oattn_lib.stages.train import train_model

    with pytest.raises(Unsupported, match="kind 'hf'.*cannot be trained by the workflow"):
        train_model("hf", {}, {}, {}, tmp_path / "missing.npz", tmp_path / "missing.json", None, None)
    with pytest.raises(ValueError, match="unknown model kind 'gpt'"):
        prune("gpt", {"name": "m"}, None, None, None, [], None, {}, fraction_step=0.1, random_seeds=1, seed=0,
              held_out={}, grad_projections=1, batch_size=1, tolerance=0.1, stability_fraction=0.2,
              bottom_exact_max=10, bottom_random_sets=9, fraction=0.1, device="cpu")


def test_what_the_rules_read_of_each_kind():
    txl = {"name": "t", "kind": "txl", "data": {"corpus": "wikitext103"}, "arch": {"tgt_len": 32, "n_layer": 2,
                                                                                  "n_head": 4}}
    vit = {"name": "v", "kind": "vit", "data": {"dataset": "cifar10", "image_size": 32},
           "arch": {"variant": "custom", "patch_size": 8, "num_layers": 3, "num_heads": 2, "hidden_dim": 16}}
    hf = {"name": "h", "kind": "hf", "path": "minilm", "data": {"corpus": "stdlib"}, "extract": {"max_length": 64}}
    assert adapter(txl).datasets(txl) == ["wikitext103"] and adapter(vit).datasets(vit) == ["cifar10"]
    assert adapter(hf).datasets(hf) == []
    assert (adapter(txl).n_tokens(txl), adapter(vit).n_tokens(vit), adapter(hf).n_tokens(hf)) == (32, 17, 64)
    assert adapter(txl).n_units(txl) == (2, 4) and adapter(vit).n_units(vit) == (3, 2)
    assert adapter(txl).prune_params(txl, None) == {"name": "t", "kind": "txl"}
    assert adapter(vit).prune_params(vit, None) == {"name": "v", "kind": "vit", "data": {"image_size": 32}}
    assert adapter(hf).prune_params(hf, "results/h/model") == {"name": "h", "kind": "hf", "path": "results/h/model"}
    assert adapter(hf).prune_params(hf, None)["path"] == "minilm"
    assert [adapter(m).retrain_problem(m["arch"]) is None for m in (txl, vit)] == [True, True]
    assert "custom ViT only" in adapter(vit).retrain_problem({**vit["arch"], "variant": "vit_b_16"})
    assert adapter(vit).pretrained_weights(vit) is None
    assert adapter(vit).config_problem({**vit, "arch": {**vit["arch"], "patch_size": 5}}, 1) == \
        "models[1] (v).arch.patch_size: 5 must divide data.image_size 32"
    assert adapter(txl).config_problem({**txl, "gguf_file": "x.gguf"}, 0).startswith(
        "models[0].gguf_file: only hf models load GGUF files")
    assert issubclass(Unsupported, ValueError) and not issubclass(ConfigError, Unsupported)


def test_the_registry_imports_no_torch():
    code = ("import sys; from oattn_lib.models import KINDS, adapter; "
            "m = {'name': 'v', 'kind': 'vit', 'data': {'dataset': 'digits'}, 'pretrained': False}; "
            "adapter(m).datasets(m), adapter(m).pretrained_weights(m); assert 'torch' not in sys.modules, 'torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
