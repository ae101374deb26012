"""Config fuzzing: whatever config a user writes, start-up accepts it or stops with one line naming a key.

Configs are drawn by mutating the embedded default (config.yaml) and the tiny preset
(workflow/presets/test.yaml): a key anywhere in the schema (every section, and every key of
every model kind's sections, `$defs` included) set to a value the schema allows, to one it
refuses (a wrong type, out of range, null, empty, nested, huge, a number written as a string)
or deleted; an unknown key added; a model's kind changed or a model added. `validate_config`
(in-process, many configs), `snakemake -n` (fewer) and real runs of the tiny preset (a few)
either accept the config or stop with one ConfigError line that begins with a key path of the
schema or of the config, never with the traceback of another exception.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, Phase, assume, event, example, given, note, settings
from hypothesis import strategies as st

from oattn_lib.config import ConfigError, validate_config
from oattn_lib.models.sizes import n_tokens, n_units
from oattn_lib.models.files import SMOLLM2_FILE
from wfutil import REPO, TINY, planned_jobs, snakemake

SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
ROOT = yaml.safe_load(Path(SCHEMA).read_text())
DEFAULT = yaml.safe_load((REPO / "config.yaml").read_text())
KINDS = ["txl", "vit", "hf", "attention"]

# placeholders of the drawn configs, replaced by the test's temporary folders: the input files
# (`files`) and the results folder
FILES, RESULTS = "@FILES@", "@RESULTS@"


# -- the schema's keys ---------------------------------------------------------------------------
def _resolved(schema: dict) -> dict:
    """`schema` with its local $ref merged in."""
    while isinstance(schema, dict) and "$ref" in schema:
        target = ROOT
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _kind_section(kind: str, section: str) -> dict:
    """The schema of a model's `data`, `arch` or `train` section for a model of `kind` (the
    model's allOf branch)."""
    for branch in ROOT["$defs"]["model"]["allOf"]:
        if branch["if"]["properties"]["kind"]["const"] == kind:
            return _resolved(branch["then"]["properties"][section])
    raise KeyError(kind)


def _slots(schema: dict, path: tuple) -> list[tuple[tuple, dict]]:
    """(path, schema) of every key below `schema`, nested objects' keys included."""
    out = []
    for key, sub in _resolved(schema).get("properties", {}).items():
        sub = _resolved(sub)
        out.append((path + (key,), sub))
        if sub.get("properties"):
            out += _slots(sub, path + (key,))
    return out


def _model_slots(kind: str) -> list[tuple[tuple, dict]]:
    """(path within a model entry, schema) of every key a model of `kind` has."""
    out = []
    for key, sub in ROOT["$defs"]["model"]["properties"].items():
        if key in ("data", "arch", "train"):
            sub = _kind_section(kind, key)
        elif key == "prune":  # a model's own prune section takes the top-level section's keys
            sub = {**ROOT["properties"]["prune"], "type": "object"}
        sub = _resolved(sub)
        out.append(((key,), sub))
        out += _slots(sub, (key,))
    return out


TOP_SLOTS = [s for s in _slots(ROOT, ()) if s[0][0] != "models"]
MODEL_SLOTS = {kind: _model_slots(kind) for kind in KINDS}


def _schema_keys(schema) -> set[str]:
    """Every property name anywhere in the schema."""
    keys = set()
    if isinstance(schema, dict):
        keys |= set(schema.get("properties", {}))
        for v in schema.values():
            keys |= _schema_keys(v)
    elif isinstance(schema, list):
        for v in schema:
            keys |= _schema_keys(v)
    return keys


SCHEMA_KEYS = _schema_keys(ROOT)


# -- values ---------------------------------------------------------------------------------------
PATHS = ["minilm", "smollm2", f"{FILES}/attn.npy", f"{FILES}/texts.txt", f"{FILES}/texts.jsonl",
         f"{FILES}/empty.txt", f"{FILES}/bad.gguf", f"{FILES}/emptydir", f"{FILES}/missing", FILES,
         f"{FILES}/texts.txt/below", "some-org/some-model", "x" * 300, "é" * 200, "a\x00b"]
GGUF_FILES = [SMOLLM2_FILE, "bad.gguf", "missing.gguf", "../bad.gguf"]
NAMES = st.sampled_from(["txl", "vit", "lm", "txl-tiny", "minilm", "x" * 300]) | st.from_regex(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)
# values a schema refuses almost anywhere: wrong types, null, empty, nested, huge, negative,
# numbers written as strings, strings no key takes
ODD = [None, "", " ", [], {}, {"nested": {"deeper": 1}}, [None], [[0, 0]], 10**12, -(10**12), -1, 0, 1.5, -0.5,
       True, False, "1e3", "-1", "1e400", "nan", "inf", "0x10", "abc", "a\nb", "1" * 300, float("inf"),
       float("nan")]


def _strings(key: str, schema: dict) -> st.SearchStrategy:
    if key in ("path", "texts"):
        return st.sampled_from(PATHS)
    if key == "gguf_file":
        return st.sampled_from(GGUF_FILES)
    if key == "results":
        return st.sampled_from([RESULTS, f"{RESULTS}/sub"])
    if key == "data_root":
        return st.sampled_from([f"{FILES}/resources", "resources"])
    if key == "name":
        return NAMES
    if key in ("field", "target_field"):
        return st.sampled_from(["text", "target", "missing"])
    if schema.get("pattern") == "^all$":
        return st.just("all")
    return st.text(max_size=6)


def valid_value(key: str, schema: dict) -> st.SearchStrategy:
    """A value `schema` allows for `key` (the key decides what a string names: a file, a model)."""
    schema = _resolved(schema)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if key == "device_map":
        return st.sampled_from(["auto", "balanced", "sequential"]) | st.dictionaries(
            st.sampled_from(["model.layers.0", "lm_head", "encoder"]), st.sampled_from([0, 1, "cpu", "cuda:1"]),
            max_size=2)
    types = schema.get("type", "object")
    if isinstance(types, list):
        return st.one_of([valid_value(key, {**schema, "type": t}) for t in types])
    if types == "null":
        return st.none()
    if types == "boolean":
        return st.booleans()
    if types == "integer":
        lo = schema.get("minimum", -3)
        return st.integers(lo, schema.get("maximum", lo + 40))
    if types == "number":
        lo = schema.get("exclusiveMinimum", schema.get("minimum", -10.0))
        return st.floats(lo, schema.get("maximum", lo + 10.0), exclude_min="exclusiveMinimum" in schema,
                         allow_nan=False, allow_infinity=False)
    if types == "string":
        return _strings(key, schema)
    if types == "array":
        items = schema.get("items", {})
        return st.lists(valid_value(key, items), min_size=schema.get("minItems", 0),
                        max_size=schema.get("maxItems", 3), unique=bool(schema.get("uniqueItems")))
    props = schema.get("properties", {})
    return st.fixed_dictionaries({}, optional={k: valid_value(k, v) for k, v in props.items()})


def invalid_value(key: str, schema: dict) -> st.SearchStrategy:
    """A value that is mostly refused by `schema`: one of `ODD`, or just beyond its bounds."""
    schema = _resolved(schema)
    near = []
    if "minimum" in schema:
        near.append(schema["minimum"] - 1)
    if "exclusiveMinimum" in schema:
        near.append(schema["exclusiveMinimum"])
    if "maximum" in schema:
        near += [schema["maximum"] + 1, schema["maximum"] + 0.5]
    odd = ODD
    if key in ("results", "data_root"):  # no string: results stay in the test's folder
        odd = [v for v in ODD if not isinstance(v, str)]
    return st.sampled_from(odd + near)


DELETE = object()


def _put(target: dict, path: tuple, value) -> None:
    """Set (or with DELETE remove) `path` of the dict `target`, making dicts on the way."""
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    if value is DELETE:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value


def _slot_value(draw, path: tuple, schema: dict):
    how = draw(st.sampled_from(["valid", "invalid", "valid", "delete", "valid"]))
    if how == "delete" and path != ("results",):
        return DELETE
    return draw(valid_value(path[-1], schema) if how == "valid" else invalid_value(path[-1], schema))


def _models(config: dict) -> list[dict]:
    models = config.get("models")
    return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []


def _mutate(draw, config: dict) -> None:
    """One random change of `config` (in place)."""
    models = _models(config)
    what = draw(st.sampled_from(["model key", "section key", "model key", "kind", "section key", "model key",
                                 "unknown key", "whole", "compare"]))
    if what == "model key" and models:
        m = draw(st.sampled_from(models))
        path, schema = draw(st.sampled_from(MODEL_SLOTS[m.get("kind") if m.get("kind") in KINDS else "txl"]))
        _put(m, path, _slot_value(draw, path, schema))
    elif what == "kind" and models:
        kind = draw(st.sampled_from(KINDS + KINDS + ["lstm", None, 3]))
        if draw(st.booleans()):  # a new entry of that kind
            m = {"name": draw(NAMES), "kind": kind, "extract": {}}
            config["models"].append(m)
        else:
            m = draw(st.sampled_from(models))
            m["kind"] = kind
        if draw(st.booleans()):  # the entry made plausible for its new kind
            for key in ("data", "arch", "train", "path", "gguf_file", "device_map", "pretrained"):
                m.pop(key, None)
            if kind in ("hf", "attention"):
                m["path"] = draw(st.sampled_from(PATHS))
    elif what == "compare":  # a pair of the compare section: names of models or not, any `heads`
        names = [m.get("name") for m in models] + ["nope"]
        pair = {k: draw(st.sampled_from(names) | NAMES) for k in ("a", "b")}
        if draw(st.booleans()):
            pair["heads"] = draw(st.sampled_from(["auto", True, False, "yes", 3, None]))
        if draw(st.integers(0, 5)) == 0:
            pair[draw(st.sampled_from(["bogus", "c"]))] = 1
        config["compare"] = [*(config.get("compare") or []), pair] if isinstance(config.get("compare"), list) \
            else [pair]
    elif what == "unknown key":
        where = draw(st.sampled_from([config, *(config.get(p[0]) for p, _ in TOP_SLOTS if len(p) == 1), *models,
                                      *(m.get(s) for m in models for s in ("data", "arch", "train", "extract"))]))
        if isinstance(where, dict):
            where[draw(st.sampled_from(["bogus", "head_tpo_k", "n_layr", "Models", "extract"]))] = 1
    elif what == "whole":
        target = draw(st.sampled_from(["models", "model", *(s[0] for s, _ in TOP_SLOTS if len(s) == 1)]))
        value = draw(st.sampled_from([v for v in ODD if not isinstance(v, str)] + [[]]))
        if target == "model" and models:
            config["models"][draw(st.integers(0, len(config["models"]) - 1))] = value
        elif target not in ("model", "results"):
            config[target] = value
    else:
        path, schema = draw(st.sampled_from(TOP_SLOTS))
        _put(config, path, _slot_value(draw, path, schema))


BASES = {"default": DEFAULT, "tiny": TINY}


@st.composite
def configs(draw, bases=("default", "tiny"), max_changes: int = 3):
    """A config as a user could write it: one of `bases` with 1 to `max_changes` changes."""
    config = copy.deepcopy(BASES[draw(st.sampled_from(bases))])
    config["results"] = RESULTS
    for _ in range(draw(st.integers(1, max_changes))):
        _mutate(draw, config)
    return config


def placed(value, files: Path, results: Path):
    """`value` with the placeholders replaced by the test's folders."""
    if isinstance(value, dict):
        return {k: placed(v, files, results) for k, v in value.items()}
    if isinstance(value, list):
        return [placed(v, files, results) for v in value]
    if isinstance(value, str):
        return value.replace(RESULTS, str(results)).replace(FILES, str(files))
    return value


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The files the drawn configs name: texts, an attention file, a file that is no GGUF file."""
    d = tmp_path_factory.mktemp("fuzz_files")
    (d / "texts.txt").write_text("The first text of the user.\nA second one, a little longer than the first.\n")
    (d / "texts.jsonl").write_text('{"text": "one text", "target": "its target"}\n'
                                   '{"text": "another text", "target": "another target"}\n')
    (d / "empty.txt").write_text("")
    (d / "bad.gguf").write_bytes(b"not a gguf file")
    (d / "emptydir").mkdir()
    np.save(d / "attn.npy", np.full((2, 2, 6, 6), 1 / 6, dtype=np.float32))  # (layer, head, query, key)
    return d


# -- what an error must look like -------------------------------------------------------------------
# a key path at the start of the message: `entropy.head_top_k`, `models[1] (vit).extract.crop`,
# `decompose.figure_heads[0][1]`, `models[].name`, `config` (the whole config)
KEY_PATH = re.compile(r"^(?P<path>[A-Za-z_]\w*(?:\[\d*\])*(?: \([^)]*\))?(?:\.[^\s:.\[(]+(?:\[\d+\])*)*): ")


def _config_keys(value) -> set[str]:
    """Every key of the config (and each dotted part of one, as a device_map's module names)."""
    keys = set()
    if isinstance(value, dict):
        for k, v in value.items():
            keys |= {str(k), *str(k).split(".")} | _config_keys(v)
    elif isinstance(value, list):
        for v in value:
            keys |= _config_keys(v)
    return keys


def assert_one_line_naming_a_key(message: str, config: dict) -> None:
    """`message` is one line beginning with a key path: top-level key first, every key one of the
    schema's or of the config's."""
    assert message and "\n" not in message, f"not one line: {message!r}"
    m = KEY_PATH.match(message)
    assert m, f"does not begin with a key path: {message!r}"
    keys = re.findall(r"[^.]+", re.sub(r" \([^)]*\)|\[\d*\]", "", m.group("path")))
    assert keys[0] in set(ROOT["properties"]) | {"config"}, f"not a top-level key: {message!r}"
    unknown = set(keys) - SCHEMA_KEYS - _config_keys(config) - {"config"}
    assert not unknown, f"{sorted(unknown)} are no keys of the schema or the config: {message!r}"


class _time_limit:
    """Fail (TimeoutError) where the block takes more than `seconds`, rather than hang."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def stop(signum, frame):
            raise TimeoutError(f"still running after {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, stop)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)
        return False


# -- the properties ----------------------------------------------------------------------------------
def test_the_fuzzer_reaches_every_key_of_the_schema():
    """Every property name of the schema, `$defs` of every model kind included, is a key the
    mutations can change."""
    reached = {p[-1] for p, _ in TOP_SLOTS} | {p[-1] for slots in MODEL_SLOTS.values() for p, _ in slots}
    reached |= {"a", "b", "heads"}  # a compare pair's keys, which _mutate's "compare" sets
    assert SCHEMA_KEYS - {"models"} <= reached
    assert {"n_layer", "patch_size", "texts", "chat", "dataset", "epochs"} <= reached


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=configs())
def test_validation_accepts_or_stops_with_one_line_naming_a_key(config, files):
    """validate_config on any drawn config returns, or raises a ConfigError of one line that
    begins with a key path; any other exception escaping it fails the test. A config it accepts
    is final (validating it again changes nothing) and every model's size known before running
    is at least one token, layer and head."""
    config = placed(config, files, files / "results")
    note(f"config: {config!r}")
    try:
        with _time_limit(60):
            validate_config(config, SCHEMA)
    except ConfigError as exc:
        event("stopped: ConfigError")
        assert_one_line_naming_a_key(str(exc), config)
        return
    event("accepted")
    again = copy.deepcopy(config)
    validate_config(again, SCHEMA)
    assert again == config
    for m in config["models"]:
        n, units = n_tokens(m), n_units(m)
        assert n is None or n >= 1, f"{m['name']}: {n} tokens"
        assert units is None or min(units) >= 1, f"{m['name']}: {units} layers and heads"


# configs the fuzzer found that stopped with a traceback, or never stopped, before their fixes
@pytest.mark.parametrize("edit, expect", [
    # `for m in config["models"]` before the schema had checked that it is a list: TypeError
    (lambda c: c.update(models=10**12), "models: 1000000000000 is not of type 'array'"),
    (lambda c: c.update(models=float("nan")), "models: nan is not of type 'array'"),
    # a name the system cannot look up: OSError (File name too long) from pathlib
    (lambda c: c["models"].append({"name": "a", "kind": "attention", "extract": {}, "path": "x" * 300}),
     "models[3].path: 'xxx"),
    (lambda c: c["models"][2].update(path="é" * 200), "models[2].path: 'ééé"),
    (lambda c: c["models"][2].update(path="smollm2", gguf_file="x" * 300), "models[2].gguf_file: 'xxx"),
    (lambda c: c["models"][2]["data"].update(texts="x" * 300), "models[2].data.texts: 'xxx"),
    (lambda c: c.update(results=c["results"] + "/" + "x" * 300), "results: '"),
    (lambda c: c["models"][0].update(name="x" * 300), "models[0].name: 'xxx"),
    # a NUL character: ValueError (embedded null byte), whose message named no key
    (lambda c: c["models"][2]["data"].update(texts="a\x00b"), "models[2].data.texts: 'a\\x00b' cannot name a file"),
    (lambda c: c.update(prune={"held_out": {"texts": "a\x00b"}}), "prune.held_out.texts: 'a\\x00b'"),
    # a huge sample count: the disk check looked for every sample's store in turn, without end; now
    # the count of samples to plan stops it first
    (lambda c: c["models"][0]["extract"].update(n_samples=10**12),
     "models[0] (txl).extract.n_samples: 1,000,000,000,000 samples"),
    # YAML's .nan and .inf passed every bound of the schema: accepted, and computed with for hours
    (lambda c: c["organize"].update(alpha=float("nan")), "organize.alpha: nan is not a finite number"),
    (lambda c: c["models"][0]["train"].update(lr=float("inf")), "models[0].train.lr: inf is not a finite number"),
    (lambda c: c.update(prune={"fraction_step": float("nan")}), "prune.fraction_step: nan is not a finite number"),
    # a crop starting beyond the model's tokens: accepted with a small top_k, else blamed on entropy.head_top_k
    (lambda c: c["models"][1]["extract"].update(crop=[20, 30]) or c["entropy"].update(head_top_k=4, network_top_k=4),
     "models[1] (vit).extract.crop: start 20 is beyond the model's 17 tokens"),
    (lambda c: c["models"][1]["extract"].update(crop=[17, 30]), "models[1] (vit).extract.crop: start 17 is beyond"),
    # held-out texts that do not exist: accepted, then Snakemake's MissingInputException for rule prune
    (lambda c: c["models"][0].update(prune={"held_out": {"texts": "minilm"}}),
     "models[0] (txl).prune.held_out.texts: minilm does not exist"),
    (lambda c: c.update(prune={"held_out": {"texts": "missing.txt"}}), "prune.held_out.texts: missing.txt does not"),
])
def test_found_configs_stop_with_one_line_naming_the_key(files, edit, expect):
    """Each config the fuzzer found escaping validation as another exception, or never returning,
    now stops within seconds with one ConfigError line naming its key."""
    config = copy.deepcopy(TINY)
    config["results"] = str(files / "results")
    edit(config)
    with pytest.raises(ConfigError) as err, _time_limit(30):
        validate_config(config, SCHEMA)
    assert expect in str(err.value)
    assert_one_line_naming_a_key(str(err.value), config)


# -- Snakemake's start-up -----------------------------------------------------------------------------
# another exception's name (KeyError, TypeError, jsonschema's ValidationError, ...) in Snakemake's output
OTHER_EXCEPTION = re.compile(r"\b(?!ConfigError\b)\w*(?:Error|Exception)\b")
CONFIG_ERROR = re.compile(r'^ConfigError in file "[^"]+", line \d+:\n(?P<message>.*)\n(?P<after>.*)', re.MULTILINE)


def assert_started_or_stopped_naming_a_key(proc, config: dict, results: Path) -> bool:
    """Snakemake's run `proc` on `config` either succeeded, or stopped with one ConfigError line
    naming a key (followed by its location) before writing anything under `results`; no other
    exception and no traceback. Returns whether it succeeded."""
    text = proc.stdout + proc.stderr
    m = CONFIG_ERROR.search(text)
    # the message itself may quote a library's error it explains (a saved dataset that cannot be read)
    rest = text.replace(m.group("message"), "") if m else text
    assert "Traceback" not in rest and not OTHER_EXCEPTION.search(rest), text[-4000:]
    if proc.returncode == 0:
        return True
    assert m, f"stopped without a ConfigError:\n{text[-4000:]}"
    # the message is one line: the next one is the location trailer (or nothing)
    assert m.group("after").startswith("  File ") or not m.group("after").strip(), text[-4000:]
    assert_one_line_naming_a_key(m.group("message"), config)
    assert not results.exists() or not any(results.rglob("*.zarr")), sorted(results.rglob("*"))[:20]
    return False


def _refused(config: dict) -> str | None:
    """The ConfigError line `validate_config` stops `config` with, as the Snakefile calls it
    (the disk checked at the start of a real run only); None where it accepts the config."""
    try:
        validate_config(copy.deepcopy(config), SCHEMA, check_disk=False)
    except ConfigError as exc:
        return str(exc)
    return None


# Snakemake's start-up and planning, 7 times. Drawn configs that validation refuses are left out:
# the Snakefile stops them at its first call, validate_config, whose line for any drawn config
# test_validation_accepts_or_stops_with_one_line_naming_a_key holds, and the way Snakemake shows
# that line test_dry_run_shows_the_line_validation_stops_with holds; the configs validation
# accepts are the ones whose planning (input functions, params, the disk check) can still fail.
@pytest.mark.workflow
@settings(max_examples=7, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(config=configs())
def test_dry_run_plans_or_stops_with_one_line_naming_a_key(config, files, tmp_path_factory):
    """`snakemake -n` on any drawn config that validation accepts plans its jobs, or exits with
    the ConfigError line naming a key; never the traceback or the name of another exception."""
    workdir = tmp_path_factory.mktemp("fuzz_dry_run")
    config = placed(config, files, workdir / "results")
    assume(_refused(config) is None)
    note(f"config: {config!r}")
    proc = snakemake(workdir, config, "-n", check=False)
    planned = assert_started_or_stopped_naming_a_key(proc, config, workdir / "results")
    event("planned" if planned else "stopped: ConfigError")
    if planned:
        assert planned_jobs(proc).get("all") == 1, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.workflow
@pytest.mark.parametrize("section", [
    {"prune": {"held_out": {"texts": f"{FILES}/missing"}}},  # a path: checked after the schema
    {"organize": {"n_iters": {"nested": {"deeper": 1}}}},  # a value whose repr has braces
])
def test_dry_run_shows_the_line_validation_stops_with(section, files, tmp_path_factory):
    """A config validation refuses stops `snakemake -n` with exactly validate_config's line, shown
    as one ConfigError line naming the key; never the traceback or the name of another exception."""
    workdir = tmp_path_factory.mktemp("fuzz_dry_run")
    config = placed({**TINY, "results": RESULTS, **section}, files, workdir / "results")
    line = _refused(config)
    assert line is not None
    proc = snakemake(workdir, config, "-n", check=False)
    assert not assert_started_or_stopped_naming_a_key(proc, config, workdir / "results")
    assert CONFIG_ERROR.search(proc.stdout + proc.stderr).group("message") == line


# -- real runs -----------------------------------------------------------------------------------------
# keys whose values keep a run of the tiny preset small (its txl model alone)
SMALL_KEYS = {
    ("organize", "n_iters"): st.integers(1, 2),
    ("entropy", "head_top_k"): st.integers(1, 700),       # 24 x 24 = 576 coefficients per head
    ("explorer", "heads_2d"): st.integers(0, 4),
    ("decompose", "figure_heads"): st.lists(st.lists(st.integers(-3, 2), min_size=2, max_size=2), min_size=1,
                                            max_size=2),
}


def _tiny_txl(**sections) -> dict:
    """The tiny preset with its txl model alone (and `sections` replaced)."""
    config = copy.deepcopy(TINY)
    config.update(results=RESULTS, models=[m for m in TINY["models"] if m["kind"] == "txl"], **sections)
    return config


@st.composite
def small_runs(draw):
    """The tiny preset's txl model alone, with one key of `SMALL_KEYS` set to a valid or an invalid value."""
    config = _tiny_txl()
    path = draw(st.sampled_from(sorted(SMALL_KEYS)))
    schema = dict(TOP_SLOTS)[path]
    _put(config, path, draw(SMALL_KEYS[path] | invalid_value(path[-1], schema)))
    return config


# a run takes about a minute: two drawn changes and one known to stop, none shrunk
@pytest.mark.workflow
@settings(max_examples=2, derandomize=True, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
# the slow tier (CI): real runs of fuzzed configs; make test keeps their validation and dry runs
@pytest.mark.slow
@given(config=small_runs())
@example(config=_tiny_txl(entropy={"head_top_k": 10**4}))  # 24 x 24 coefficients: stops at start-up
def test_real_run_succeeds_or_stops_before_writing(config, files, tmp_path_factory):
    """A real run of a small change of the tiny preset finishes with every target written, or
    stops with the ConfigError line before any job wrote a store."""
    workdir = tmp_path_factory.mktemp("fuzz_run")
    results = workdir / "results"
    config = placed(config, files, results)
    note(f"config: {config!r}")
    proc = snakemake(workdir, config, check=False)
    if assert_started_or_stopped_naming_a_key(proc, config, results):
        assert (results / "summary.md").is_file() and (results / "explorer.html").is_file()
        assert all((results / "txl" / "figures" / f"fig{i}.png").is_file() for i in range(1, 8))
