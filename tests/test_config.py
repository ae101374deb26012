"""Config validation: schema defaults, one-line errors naming the key, semantic checks."""
import copy
from pathlib import Path

import pytest
import yaml

from oattn_lib.config import ConfigError, validate_config

REPO = Path(__file__).resolve().parents[1]
SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")


@pytest.fixture
def config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_embedded_default_is_valid_and_gets_defaults(config):
    validate_config(config, SCHEMA)
    assert config["data_root"] == "resources"
    assert config["prune"]["random_seeds"] == 5
    assert config["models"][0]["arch"]["dropatt"] == 0.0  # a txl default filled in


@pytest.mark.parametrize("edit, expect", [
    (lambda c: c["entropy"].update(head_tpo_k=3), "entropy: Additional properties are not allowed ('head_tpo_k'"),
    (lambda c: c["organize"].update(n_iters="three"), "organize.n_iters: 'three' is not of type 'integer'"),
    (lambda c: c["models"][0]["extract"].update(n_samples=-1), "models[0].extract.n_samples: -1 is less than"),
    (lambda c: c["models"][1].update(kind="lstm"), "models[1].kind: 'lstm' is not one of ['txl', 'vit', 'hf']"),
    (lambda c: c["models"][0]["arch"].update(n_layr=2), "models[0].arch: Additional properties"),
    (lambda c: c["entropy"].update(head_top_k=5000), "entropy.head_top_k: 5000 exceeds the 64 x 64"),
    (lambda c: c["models"].append(copy.deepcopy(c["models"][0])), "used more than once"),
    (lambda c: c["decompose"].update(figure_heads=[[7, 0]]), "decompose.figure_heads: (7, 0) is outside"),
    (lambda c: c["models"][1]["arch"].update(patch_size=5), "patch_size: 5 must divide data.image_size 32"),
])
def test_bad_config_is_one_line_naming_the_key(config, edit, expect):
    edit(config)
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    assert expect in str(err.value)
    assert "\n" not in str(err.value)
