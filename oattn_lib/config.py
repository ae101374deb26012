"""Semantic checks of the workflow config, beyond what the JSON schema can say.

The schema (oattn_lib/schemas/config.schema.yaml, package data, which the workflow's
workflow/schemas/config.schema.yaml links to) catches misspelled keys, wrong types and
out-of-range numbers; these checks catch combinations that would fail an hour into a
run: duplicate names, a model too small for the Haar top_k, impossible figure heads.
"""
from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import yaml

from .models import adapter
from .models.sizes import n_tokens, n_units, stored_units
from .units import resolve_unit

__all__ = ["ConfigError", "SCHEMA", "validate_config", "defaults_validator", "check_config", "coerce_config", "canonical",
           "complete_model", "prune_settings", "softmax_free_bases",
           "planned_store_bytes", "disk_problem", "counted_candidates", "MAX_PLANNED_SAMPLES", "plan_problem",
           "section_settings", "compare_pairs"]

# the workflow's schema, the one place defaults live: package data, so that an installed
# library (a wheel, not only a clone) can validate and complete a config
SCHEMA = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what is allowed."""


def _one_line(err) -> str:
    """A jsonschema ValidationError as `key.path: what is wrong; allowed: ...`."""
    path = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err.absolute_path)
    path = path.replace(".[", "[") or "config"
    msg = err.message
    schema = err.schema if isinstance(err.schema, dict) else {}
    if err.validator == "additionalProperties":
        msg += f"; allowed keys: {sorted(schema.get('properties', {}))}"
    elif "enum" in schema and err.validator != "enum":
        msg += f"; allowed: {schema['enum']}"
    return f"{path}: {msg}"


# -- coercion: command-line values take the schema's types --------------------------------
_INT = re.compile(r"^[+-]?\d+$")
_TRUE, _FALSE = {"true", "yes", "on"}, {"false", "no", "off"}


def _subschemas(value, schema: dict, root: dict, validator_cls) -> list[dict]:
    """The subschemas that apply to `value`: `schema` with its $ref, allOf and if/then resolved."""
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return [schema]
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        return _subschemas(value, {**target, **{k: v for k, v in schema.items() if k != "$ref"}}, root,
                           validator_cls)
    out = [schema]
    for sub in schema.get("allOf", []):
        out += _subschemas(value, sub, root, validator_cls)
    if "if" in schema and validator_cls(schema["if"]).is_valid(value):
        out += _subschemas(value, schema.get("then", {}), root, validator_cls)
    return out


def _types(schemas: list[dict]) -> set[str]:
    types: set[str] = set()
    for s in schemas:
        t = s.get("type")
        types.update([t] if isinstance(t, str) else (t or []))
    return types


def _coerce_scalar(value, types: set[str]):
    """`value` as the one scalar type the schema asks for, when it parses as that type."""
    if isinstance(value, str):
        text = value.strip()
        if types == {"integer"}:
            if _INT.match(text):
                return int(text)
            try:
                f = float(text)
            except ValueError:
                return value
            return int(f) if math.isfinite(f) and f.is_integer() else value
        if "integer" in types and types <= {"integer", "string"} and _INT.match(text):
            # `n_samples: 20` inside a --config mapping arrives as "20": a count, or `all`
            return int(text)
        if types == {"number"}:
            try:
                f = float(text)
            except ValueError:
                return value
            return f if math.isfinite(f) else value
        if types == {"boolean"}:
            low = text.lower()
            return True if low in _TRUE else False if low in _FALSE else value
        if types & {"array", "object"} and text[:1] in "[{":
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError:
                return value
            return parsed if isinstance(parsed, (list, dict)) else value
        return value
    if isinstance(value, bool):
        return value
    # one number, one form: 1 and 1.0 are the same learning rate, 3.0 and 3 the same count
    if types == {"number"} and isinstance(value, int):
        return float(value)
    if types == {"integer"} and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _coerce(value, schema: dict, root: dict, validator_cls):
    schemas = _subschemas(value, schema, root, validator_cls)
    value = _coerce_scalar(value, _types(schemas))
    if isinstance(value, dict):
        props: dict = {}
        extra: list = []
        for s in schemas:
            props.update(s.get("properties", {}))
            if isinstance(s.get("additionalProperties"), dict):
                extra.append(s["additionalProperties"])
        for key in list(value):
            sub = props.get(key) or (extra[0] if extra else None)
            if sub is not None:
                value[key] = _coerce(value[key], sub, root, validator_cls)
    elif isinstance(value, list):
        items = [s["items"] for s in schemas if isinstance(s.get("items"), dict)]
        if items:
            value[:] = [_coerce(v, items[0], root, validator_cls) for v in value]
    return value


def coerce_config(config: dict, schema: dict) -> dict:
    """Give every value the type the schema asks for, where it parses as that type (in place).

    Values nested in `snakemake --config key='{a: 100}'` arrive as strings; a string that
    does not parse stays as it is, and validation then names its key. Numbers take one
    form per key: an integer key holds ints (3.0 -> 3), a number key floats (1 -> 1.0).
    """
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(schema)
    _coerce(config, schema, schema, validator_cls)
    return config


def canonical(value):
    """`value` with every mapping's keys in sorted order (recursively) and tuples as lists.

    Snakemake compares a rule's params by their repr, so the same config written with its
    keys in another order would otherwise rerun every stage; the workflow canonicalises its
    config once, after validation, and every rule's params inherit the order.
    """
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def defaults_validator(schema: dict):
    """The schema's validator (JSON Schema 2020-12, its `$ref`s within the file) that also fills
    in each absent property's `default` before validating the object, as Snakemake's
    `validate(..., set_default=True)` does, without Snakemake: a notebook or a machine without
    the workflow's packages validates a config the same way. Each default is a copy, so no two
    places share one mutable default. `schema`: the loaded schema (a dict)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    properties = base.VALIDATORS["properties"]

    def set_defaults(validator, props, instance, schema):
        if validator.is_type(instance, "object"):
            for name, sub in props.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from properties(validator, props, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})(schema)


_SCHEMAS: dict[tuple, dict] = {}


def section_settings(section: str, given: dict | None = None, schema_path=SCHEMA) -> dict:
    """One section of the config (`organize`, or a model's `$defs/stability`), `given` over the
    schema's defaults and validated as the workflow validates it: the settings a library call
    takes where the workflow takes its config, from the one schema.

    Parameters
    ----------
    section : str
        A top-level key of the schema, or "$defs/<name>" for a section of a model's entry.
    given : dict, optional
        The keys set; the others take their defaults.

    Returns
    -------
    dict
        Every key of the section.

    Raises
    ------
    ConfigError
        One line naming `<section>.<key>` and what is allowed.
    """
    import jsonschema

    schema = load_schema(schema_path)
    label = section.split("/")[-1]
    node = schema["$defs"][label] if section.startswith("$defs/") else schema["properties"][section]
    if given is not None and not isinstance(given, dict):
        raise ConfigError(f"{label}: expected a mapping of its keys, got {type(given).__name__}")
    value = copy.deepcopy(dict(given or {}))
    coerce_config(value, node)
    try:
        defaults_validator({**node, "$defs": schema.get("$defs", {})}).validate(value)
    except jsonschema.ValidationError as err:
        line = _one_line(err)
        raise ConfigError(f"{label}.{line}" if not line.startswith("config:") else f"{label}:{line[7:]}") from None
    return value


def load_schema(schema_path) -> dict:
    """The schema at `schema_path`, parsed once per process while the file is unchanged (its
    path, size and modification time), and given as a copy of its own: validation reads it and
    must never see a change a caller made. Parsing its YAML takes most of a validation (libyaml
    where PyYAML has it, else the pure-Python parser), and the suite and a notebook validate
    many configs."""
    path = Path(schema_path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SCHEMAS:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        _SCHEMAS.clear()
        _SCHEMAS[key] = yaml.load(path.read_text(), Loader=loader)  # noqa: S506 (a safe loader)
    return copy.deepcopy(_SCHEMAS[key])


def validate_config(config: dict, schema_path: str, *, check_disk: bool = True) -> None:
    """Coerce values to the schema's types, validate (filling in defaults), run
    `check_config`, and put the config in canonical key order, all in place. With
    `check_disk` (and the config's own `check_disk`), stores that do not fit the free disk
    (`disk_problem`) are an error too; the Snakefile passes False and checks at the start of
    a real run instead, so that a dry run, which writes nothing, still plans.

    Any problem is one ConfigError line naming the key and what is allowed, instead of a
    page of jsonschema output.
    """
    import jsonschema

    schema = load_schema(schema_path)
    coerce_config(config, schema)
    # the schema's default `{}` is one object: filled in place for one model, it would be
    # shared by the next model that omits the same section
    models = config.get("models")
    for m in models if isinstance(models, list) else []:
        if isinstance(m, dict):
            for key in ("data", "arch", "train"):
                m.setdefault(key, {})
    # entries whose `extract` the schema fills in: what their inputs decide is completed below
    without_extract = [m for m in models if isinstance(m, dict) and "extract" not in m] \
        if isinstance(models, list) else []
    try:
        defaults_validator(schema).validate(config)
    except jsonschema.ValidationError as err:
        raise ConfigError(_one_line(err)) from None
    # defaults filled in by the schema take the same forms as given values
    coerce_config(config, schema)
    _check_finite(config)
    _complete_model_prune(config, schema)
    _check_paths(config)
    for m in without_extract:
        m["extract"].update(adapter(m).extract_defaults(m) or {})
    _resolve_n_samples(config)
    problem = plan_problem(config)
    if problem:
        raise ConfigError(problem)
    check_config(config)
    if check_disk and config["check_disk"]:
        problem = disk_problem(config)
        if problem:
            raise ConfigError(problem)
    ordered = canonical(copy.deepcopy(config))
    config.clear()
    config.update(ordered)


def _merged(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _complete_model_prune(config: dict, schema: dict) -> None:
    """A model's own `prune` section becomes the whole of its settings: the top-level `prune`
    with the model's keys merged over it, validated as the top-level section is."""
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(schema)
    prune_schema = {**schema["properties"]["prune"], "$defs": schema.get("$defs", {})}
    for i, m in enumerate(config["models"]):
        if "prune" not in m:
            continue
        merged = _merged(config["prune"], m["prune"])
        coerce_config(merged, prune_schema)
        err = jsonschema.exceptions.best_match(validator_cls(prune_schema).iter_errors(merged))
        if err is not None:
            line = _one_line(err)
            raise ConfigError(f"models[{i}] ({m['name']}).prune{'' if line.startswith('config') else '.'}"
                              f"{line.removeprefix('config')}")
        m["prune"] = merged


def _non_finite(value, path: str = "") -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinite number in `value`, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "config", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def _check_finite(config: dict) -> None:
    """No number of the config is NaN or infinite (YAML's .nan, .inf): the schema's bounds let NaN
    through (every comparison with it is false), and a run would compute with it for hours.
    The strings nan and inf are refused already (`coerce_config` keeps them strings)."""
    found = _non_finite(config)
    if found:
        raise ConfigError(f"{found[0]}: {found[1]} is not a finite number; allowed: a finite number")


# what the system lets a path be (Linux: NAME_MAX, PATH_MAX), less what the workflow appends to
# `results` (<model>/organized2d/sample<i>.zarr/zarr.json, softmax_free/<model>/<attention>/seed<k>/...)
_NAME_BYTES, _PATH_BYTES, _APPENDED_BYTES = 255, 4095, 512


def _path_problem(value: str, limit: int = _PATH_BYTES) -> str | None:
    """Why the system cannot look up the path `value` (NUL, a name over 255 bytes, over `limit` bytes
    in all), whether or not it exists; None when it can. Asking would raise, not answer no."""
    if "\0" in value:
        return "it holds a NUL character"
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not UTF-8 text"
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > _NAME_BYTES:
        return f"a name of {longest} bytes in it, above the system's {_NAME_BYTES}"
    if len(raw) > limit:
        return f"{len(raw)} bytes, above {limit}"
    return None


def _check_paths(config: dict) -> None:
    """Every path the config gives (results, data_root, a model's path, gguf_file, data.texts,
    prune.held_out.texts) is one the system can look up: otherwise checking whether the file
    exists raises OSError (File name too long) or ValueError (embedded null byte), naming no key."""
    paths = [("results", config["results"], _PATH_BYTES - _APPENDED_BYTES),
             ("data_root", config["data_root"], _PATH_BYTES),
             ("prune.held_out.texts", config["prune"]["held_out"].get("texts"), _PATH_BYTES)]
    for i, m in enumerate(config["models"]):
        own_texts = ((m.get("prune") or {}).get("held_out") or {}).get("texts")
        paths += [(f"models[{i}].{key}", value, _PATH_BYTES)
                  for key, value in (("path", m.get("path")), ("gguf_file", m.get("gguf_file")),
                                     ("data.texts", (m.get("data") or {}).get("texts")))]
        paths.append((f"models[{i}] ({m['name']}).prune.held_out.texts", own_texts, _PATH_BYTES))
    for key, value, limit in paths:
        problem = value is not None and _path_problem(str(value), limit)
        if problem:
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise ConfigError(f"{key}: {shown!r} cannot name a file: {problem}; allowed: a path without NUL "
                              f"characters, its names at most {_NAME_BYTES} bytes each, at most {limit} bytes in all")


def _resolve_n_samples(config: dict) -> None:
    """`extract.n_samples: all` becomes the number of the model's inputs, and a number above it
    is an error, where the inputs can be counted before the run (`ModelKind.n_candidates`)."""
    for i, m in enumerate(config["models"]):
        ex, where = m["extract"], f"models[{i}] ({m['name']}).extract.n_samples"
        try:
            available = adapter(m).n_candidates(m)
        except ValueError:  # the kind's own check (check_config) names what is wrong with the inputs
            if ex["n_samples"] != "all":
                continue
            problem = adapter(m).config_problem(m, i)
            raise ConfigError(problem or f"{where}: all, but the model's inputs cannot be read") from None
        if ex["n_samples"] == "all":
            if available is None:
                raise ConfigError(f"{where}: all needs inputs counted before the run (hf data.texts, kind "
                                  "attention); give a number")
            ex["n_samples"] = available
        elif available is not None and ex["n_samples"] > available:
            raise ConfigError(f"{where}: {ex['n_samples']} samples requested but the model's inputs hold "
                              f"{available}; allowed: 1..{available} or all")
        elif available is None:
            counted = counted_candidates(config, m)
            if counted is not None and ex["n_samples"] > counted["count"]:
                raise ConfigError(f"{where}: {ex['n_samples']} samples requested but only {counted['count']} "
                                  f"{counted['what']} (counted by prepare_data); allowed: 1..{counted['count']}, "
                                  "or a shorter extract.max_length")


def counted_candidates(config: dict, model: dict) -> dict | None:
    """The candidate samples a previous prepare_data job counted for `model` (its meta's
    `candidates`: `ModelKind.count_candidates`), where they were counted for the same data
    section and the same `candidates_params`; None otherwise (not run yet, or stale)."""
    import json

    wanted = adapter(model).candidates_params(model)
    path = Path(config["results"]) / model["name"] / "data" / "meta.json"
    if not wanted or not path.is_file():
        return None
    try:
        counted = json.loads(path.read_text()).get("candidates")
    except (OSError, ValueError, AttributeError):
        return None  # prepare_data writes it again
    if (not isinstance(counted, dict) or counted.get("source") != wanted
            or counted.get("data") != canonical(model.get("data") or {}) or not isinstance(counted.get("count"), int)):
        return None
    return counted


def prune_settings(config: dict, model: dict) -> dict:
    """The head-ablation settings of one model: its own `prune` section when it has one
    (already merged over the top-level one by `validate_config`), else the top-level one."""
    return model.get("prune") or config["prune"]


def softmax_free_bases(config: dict) -> list[dict]:
    """The models the softmax-free experiment retrains (`softmax_free.models`, or every model
    that can be retrained with another attention when it is empty: txl and custom vit), in the
    order listed; `oattn_lib.softmax_free` makes their runs. A model named there that cannot be
    retrained is a ConfigError naming the key and the allowed names."""
    eligible = [m["name"] for m in config["models"] if adapter(m).retrain_problem(m["arch"]) is None]
    chosen = config["softmax_free"]["models"] or eligible
    bad = [n for n in chosen if n not in eligible]
    if bad:
        raise ConfigError(f"softmax_free.models: {bad} are not txl or custom vit models of `models`; "
                          f"allowed: {eligible}")
    by_name = {m["name"]: m for m in config["models"]}
    return [by_name[n] for n in chosen]


_DTYPE_BYTES = {"float16": 2, "float32": 4}


def planned_store_bytes(config: dict, model: dict) -> int:
    """Bytes of the attention and decomposed stores of `model` that a run would still write
    (samples whose attention store is not there yet), uncompressed: scores and probs of every
    stored head plus the mask, in `extract.dtype`, and the decomposed store's coefficients
    (every one with `decompose.keep_coefficients`, else the figure heads'). 0 where the
    model's size is not known before running it (a hub id)."""
    units, n = stored_units(model), adapter(model).n_tokens(model) or adapter(model).max_tokens(model)
    if units is None or not n:
        return 0
    n_layers, n_heads = len(units[0]), len(units[1])
    ex = model["extract"]
    attention = n * n * (2 * n_layers * n_heads * _DTYPE_BYTES[ex.get("dtype", "float32")] + n_layers)
    dec = config["decompose"]
    decomposed = n * n * 4 * (2 * n_layers * n_heads if dec.get("keep_coefficients")
                              else 3 * len(dec.get("figure_heads") or []))
    n_samples = int(ex["n_samples"])
    # the stores already written, listed (a loop over the samples would not end for a huge n_samples)
    root = Path(config["results"]) / model["name"] / "attention"
    done = sum(1 for p in (root.iterdir() if root.is_dir() else ())
               if (i := _sample_index(p.name)) is not None and i < n_samples and (p / "zarr.json").exists())
    return (n_samples - done) * (attention + decomposed)


MAX_PLANNED_SAMPLES = 200_000
"""The most samples one configuration may plan, over every model and softmax-free run: Snakemake
plans three to four jobs a sample, one after another, so a count beyond this would keep
`snakemake -n` busy for hours before saying anything (bench/plan.py times the planning)."""


def plan_problem(config: dict) -> str | None:
    """Why the run's samples are too many to plan (`MAX_PLANNED_SAMPLES`), naming the key that
    contributes most; None when they are not. Counted without enumerating them: the models'
    `extract.n_samples`, and the softmax-free runs (models x attentions x `softmax_free.seeds`)
    times `softmax_free.n_samples`."""
    counts = {}
    for i, m in enumerate(config["models"]):
        n = m["extract"]["n_samples"]
        counts[f"models[{i}] ({m['name']}).extract.n_samples"] = n if isinstance(n, int) else 0
    sf = config["softmax_free"]
    runs = len(softmax_free_bases(config)) * (1 + len(sf["variants"])) * sf["seeds"]
    if runs:
        counts["softmax_free.seeds"] = runs * sf["n_samples"]
    total = sum(counts.values())
    if total <= MAX_PLANNED_SAMPLES and runs <= MAX_PLANNED_SAMPLES:
        return None
    key = max(counts, key=counts.get)
    if key == "softmax_free.seeds":
        what = (f"softmax_free.seeds: {sf['seeds']:,} seeds x {runs // sf['seeds']} (model, attention) runs x "
                f"softmax_free.n_samples {sf['n_samples']} = {counts[key]:,} samples")
    else:
        what = f"{key}: {counts[key]:,} samples"
    return (f"{what}; the run would plan {total:,} samples in all, and at most {MAX_PLANNED_SAMPLES:,} can be "
            "planned (Snakemake plans 3-4 jobs a sample at about 2 ms each); lower it, or split the samples "
            "over several configurations with their own results folders")


def _sample_index(name: str) -> int | None:
    """i of an attention store's folder name `sample<i>.zarr` (as the workflow writes i); None for
    another name."""
    m = re.fullmatch(r"sample(0|[1-9][0-9]*)\.zarr", name)
    return int(m.group(1)) if m else None


def disk_problem(config: dict) -> str | None:
    """Why the stores a run would still write do not fit the free space of the results folder
    (`planned_store_bytes`, summed over models), naming the keys that scale them; None when
    they fit."""
    import shutil

    planned = {m["name"]: planned_store_bytes(config, m) for m in config["models"]}
    total = sum(planned.values())
    if total == 0:
        return None
    where = Path(config["results"]).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if total <= free:
        return None
    big = max(planned, key=planned.get)
    i = [m["name"] for m in config["models"]].index(big)
    return (f"models[{i}] ({big}).extract: the attention and decomposed stores still to be written take up to "
            f"{total / 1e9:.1f} GB uncompressed ({big}: {planned[big] / 1e9:.1f} GB, samples x tokens² x stored "
            "heads), "
            f"{free / 1e9:.1f} GB are free under {where}; lower extract.n_samples or extract.max_length, set "
            "extract.dtype: float16, keep fewer extract.layers / extract.heads, or free space (check_disk: false "
            "skips this check)")


def compare_pairs(config: dict) -> list[dict]:
    """The config's `compare` pairs with `heads` resolved to a bool (docs/method.md §15): auto
    compares head by head where both entries are of one kind and name one model (the same `path`:
    a Hugging Face model, or attention files); ConfigError naming the pair's key where a name is not a model's,
    a pair compares a model with itself, or a pair is listed twice."""
    models = {m["name"]: m for m in config["models"]}
    out, seen = [], set()
    for i, pair in enumerate(config.get("compare") or []):
        for key in ("a", "b"):
            if pair[key] not in models:
                raise ConfigError(f"compare[{i}].{key}: {pair[key]!r} is not a model's name; allowed: {sorted(models)}")
        if pair["a"] == pair["b"]:
            raise ConfigError(f"compare[{i}]: compares {pair['a']!r} with itself; name two models")
        if (pair["a"], pair["b"]) in seen:
            raise ConfigError(f"compare[{i}]: {pair['a']} vs {pair['b']} is listed twice")
        seen.add((pair["a"], pair["b"]))
        heads = pair.get("heads", "auto")
        if heads == "auto":
            ma, mb = models[pair["a"]], models[pair["b"]]
            heads = (ma.get("path") is not None and ma.get("path") == mb.get("path")
                     and type(adapter(ma)) is type(adapter(mb)))
        out.append({"a": pair["a"], "b": pair["b"], "heads": bool(heads)})
    return out


def check_config(config: dict) -> None:
    names = [m["name"] for m in config["models"]]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"models[].name: {dup} used more than once; model names must be unique")
    compare_pairs(config)
    softmax_free_bases(config)
    ent = config["entropy"]
    for i, m in enumerate(config["models"]):
        where = f"models[{i}] ({m['name']})"
        problem = adapter(m).config_problem(m, i)  # the kind's own checks (models.kinds)
        if not problem and prune_settings(config, m)["enabled"] and adapter(m).prunes:
            problem = adapter(m).prune_problem(m, i)
        if problem:
            raise ConfigError(problem)
        _check_held_out_texts(config, m, i)
        if m["extract"].get("compute_dtype") == "float16" and config.get("device") == "cpu":
            raise ConfigError(f"models[{i}].extract.compute_dtype: float16 runs on a GPU only, and device is cpu; "
                              "allowed: float32 or bfloat16 on the CPU")
        st = m.get("stability")
        if st and st["samples"] != "all" and isinstance(m["extract"]["n_samples"], int) \
                and st["samples"] > m["extract"]["n_samples"]:
            raise ConfigError(f"{where}.stability.samples: {st['samples']} exceeds extract.n_samples "
                              f"({m['extract']['n_samples']}); allowed: 1..{m['extract']['n_samples']} or all")
        crop = m["extract"].get("crop")
        if crop and not crop[0] < crop[1]:
            raise ConfigError(f"{where}.extract.crop: start {crop[0]} must be below stop {crop[1]}")
        uncropped = adapter(m).n_tokens(m)
        if crop and uncropped is not None and crop[0] >= uncropped:
            # the window would hold no token (n_tokens negative), and the top_k checks would
            # then name the wrong key
            raise ConfigError(f"{where}.extract.crop: start {crop[0]} is beyond the model's {uncropped} tokens; "
                              f"allowed: start in 0..{uncropped - 1}, below stop")
        n = n_tokens(m)
        units = n_units(m)
        for key, size in (("layers", units and units[0]), ("heads", units and units[1])):
            bad = [v for v in m["extract"].get(key) or [] if size is not None and v >= size]
            if bad:
                raise ConfigError(f"{where}.extract.{key}: {bad} outside the model's {size} {key}; "
                                  f"allowed: 0..{size - 1}")
            if m["extract"].get(key) is not None and prune_settings(config, m)["enabled"] and adapter(m).prunes:
                # the ablation masks heads of the whole model in the order of their Haar entropies
                raise ConfigError(f"{where}.extract.{key}: the prune stage ranks every head of the model by its "
                                  f"Haar entropy, so it needs every head stored; allowed: null, or set "
                                  f"prune.enabled: false (for this model: {where}.prune: {{enabled: false}})")
        top = ent["head_top_k"]
        # n None: samples of their own lengths; the entropy stage takes every coefficient of a
        # sample shorter than the top_k and records so
        if n is not None and n * n < top:
            raise ConfigError(f"entropy.head_top_k: {top} exceeds the {n} x {n} = {n * n} bi-Haar "
                              f"coefficients of {where}; allowed: 1..{n * n}")
        stored = stored_units(m)
        if stored is not None:
            layers, heads = stored
            total = None if n is None else n * n * len(layers) * len(heads)
            if total is not None and total < ent["network_top_k"]:
                raise ConfigError(f"entropy.network_top_k: {ent['network_top_k']} exceeds the {total} "
                                  f"tri-Haar coefficients of {where}; allowed: 1..{total}")
            for layer, head in config["decompose"]["figure_heads"]:
                try:
                    resolve_unit(layer, head, layers, heads, owner=f"{where}'s")
                except ValueError as exc:
                    raise ConfigError(f"decompose.figure_heads: {exc}") from None
    _check_coarse_coefficients(config)


def _check_held_out_texts(config: dict, model: dict, index: int) -> None:
    """`prune.held_out.texts` (the model's own, or the top-level one) of a model the prune stage
    runs for holds texts: it is an input of the model's prune rule, so a missing file would stop
    the workflow's planning naming the file and no key, and a malformed one its prune job."""
    from .data.prompts import read_texts

    settings, top = prune_settings(config, model), config["prune"]["held_out"]
    held_out = settings["held_out"]
    if not held_out.get("texts") or not settings["enabled"] or not adapter(model).prunes:
        return
    own = (held_out.get("texts"), held_out.get("field")) != (top.get("texts"), top.get("field"))
    key = f"models[{index}] ({model['name']}).prune.held_out.texts" if own else "prune.held_out.texts"
    try:
        read_texts(str(held_out["texts"]), held_out.get("field"), key=key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_coarse_coefficients(config: dict) -> None:
    """The entropy and figure stages read the coarsest coefficients the decompose stage keeps
    (docs/method.md §6.6): every top_k they take must be among them, unless every coefficient
    is kept."""
    dec = config["decompose"]
    if dec["keep_coefficients"]:
        return
    kept = dec["coarse_coefficients"]
    for section, key in (("entropy", "head_top_k"), ("entropy", "network_top_k"), ("figures", "trihaar_top_k")):
        if config[section][key] > kept:
            raise ConfigError(f"{section}.{key}: {config[section][key]} exceeds decompose.coarse_coefficients "
                              f"({kept}), the coarsest coefficients each sample's decomposed store keeps; "
                              f"allowed: 1..{kept}, or raise decompose.coarse_coefficients, or set "
                              "decompose.keep_coefficients: true")


def complete_model(model: dict, schema_path=SCHEMA, **sections) -> dict:
    """One entry of `models` as a stage receives it from the workflow: every default filled in
    from the schema, validated and canonical. For calling the stages from Python (notebooks,
    tests) with only the keys that matter (an absent `extract` section is the schema's defaults,
    or for a kind that defaults it from its inputs, theirs); `sections` are other top-level
    config sections the checks read (for example `entropy={"head_top_k": 16}` for a small model).
    """
    entry = copy.deepcopy(model)
    if "extract" not in entry:
        try:
            required = adapter(entry).extract_defaults(entry) is None
        except (KeyError, ValueError):  # no or an unknown kind: validation names it
            required = True
        if required:
            entry["extract"] = {}
    config = {"models": [entry], **copy.deepcopy(sections)}
    validate_config(config, str(schema_path))
    return config["models"][0]

