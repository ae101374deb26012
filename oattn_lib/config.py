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
from .units import resolve_unit

__all__ = ["ConfigError", "SCHEMA", "validate_config", "check_config", "coerce_config", "canonical",
           "complete_model", "prune_settings", "n_tokens", "n_units", "stored_units", "batched_samples",
           "softmax_free_bases", "stability_samples", "explorer_parts",
           "shown_samples", "planned_store_bytes", "disk_problem", "counted_candidates"]

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


def validate_config(config: dict, schema_path: str) -> None:
    """Coerce values to the schema's types, validate (filling in defaults), run
    `check_config`, and put the config in canonical key order, all in place.

    Any problem is one ConfigError line naming the key and what is allowed, instead of a
    page of jsonschema output.
    """
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    with open(schema_path) as f:
        schema = yaml.safe_load(f)
    coerce_config(config, schema)
    # the schema's default `{}` is one object: filled in place for one model, it would be
    # shared by the next model that omits the same section
    for m in config.get("models") or []:
        if isinstance(m, dict):
            for key in ("data", "arch", "train"):
                m.setdefault(key, {})
    try:
        validate(config, schema_path, set_default=True)
    except WorkflowError as exc:
        # snakemake raises its WorkflowError while handling jsonschema's error
        err = exc.__cause__ or exc.__context__
        if not isinstance(err, jsonschema.ValidationError):
            raise
        raise ConfigError(_one_line(err)) from None
    # defaults filled in by the schema take the same forms as given values
    coerce_config(config, schema)
    _complete_model_prune(config, schema)
    _resolve_n_samples(config)
    check_config(config)
    if config["check_disk"]:
        problem = disk_problem(config)
        if problem:
            raise ConfigError(problem)
    ordered = canonical(copy.deepcopy(config))
    config.clear()
    config.update(ordered)


def n_tokens(model: dict) -> int | None:
    """Tokens per sample (query = key axis length) when known before running the model and the
    same for every sample; None otherwise."""
    ex = model["extract"]
    n = adapter(model).n_tokens(model)
    crop = ex.get("crop")
    if crop and n is not None:
        n = min(n, crop[1]) - crop[0]
    return n


def n_units(model: dict) -> tuple[int, int] | None:
    """(layers, heads) of the model when known before running it: from the config (txl,
    vit) or from the model's files (hf: config.json or the GGUF header, `models.files.hf_layout`);
    None for an hf model whose files cannot be read here (a hub id)."""
    return adapter(model).n_units(model)


def stored_units(model: dict) -> tuple[list[int], list[int]] | None:
    """The layer and head indices an attention store of the model holds (extract.layers,
    extract.heads; every one when null), in the model's order; None when the model's size
    is not known before running it."""
    units = n_units(model)
    if units is None:
        return None
    ex = model["extract"]
    layers = sorted(ex.get("layers") or range(units[0]))
    heads = sorted(ex.get("heads") or range(units[1]))
    return layers, heads


def batched_samples(model: dict, max_entries: int) -> bool:
    """Whether the per-sample stages of `model` run as one job for all its samples (config
    `jobs.batch_max_entries`): when its network tensor, tokens x tokens x stored heads, has at
    most `max_entries` entries. False when `max_entries` is 0 or the model's size cannot be read
    before running it."""
    if max_entries <= 0:
        return False
    units, n = stored_units(model), n_tokens(model)
    if n is None:  # samples of their own lengths: planned for the longest
        n = adapter(model).max_tokens(model)
    if units is None or n is None:
        return False
    return n * n * len(units[0]) * len(units[1]) <= max_entries


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


def explorer_parts(n_samples: int, max_jobs: int) -> list[list[int]]:
    """The samples of each `explorer_samples` job of a model of one job per sample (config
    `jobs.explorer_jobs` = `max_jobs`): consecutive runs of ceil(n / max_jobs) samples."""
    if n_samples < 1 or max_jobs < 1:
        raise ValueError(f"n_samples, max_jobs: need at least 1 each, got {n_samples}, {max_jobs}")
    per = -(-n_samples // max_jobs)
    return [list(range(start, min(n_samples, start + per))) for start in range(0, n_samples, per)]


def shown_samples(n_samples: int, max_samples: int | None) -> int:
    """How many samples a model's explorer page shows: its first `max_samples` (config
    `explorer.max_samples`), or all `n_samples` where that is None or more."""
    return n_samples if max_samples is None else min(n_samples, int(max_samples))


def stability_samples(model: dict) -> list[int]:
    """The samples of a model that get stability replicates (`stability.samples`: the first n, or
    all); [] when the model has no `stability` section (docs/method.md §14)."""
    st = model.get("stability")
    if not st:
        return []
    n = model["extract"]["n_samples"]
    k = st.get("samples", "all")
    return list(range(n if k == "all" else min(int(k), n)))


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
    root = Path(config["results"]) / model["name"] / "attention"
    todo = sum(not (root / f"sample{i}.zarr" / "zarr.json").exists() for i in range(int(ex["n_samples"])))
    return todo * (attention + decomposed)


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
    return (f"models[{i}] ({big}).extract: the attention and decomposed stores still to be written take about "
            f"{total / 1e9:.1f} GB ({big}: {planned[big] / 1e9:.1f} GB, samples x tokens² x stored heads), "
            f"{free / 1e9:.1f} GB are free under {where}; lower extract.n_samples or extract.max_length, set "
            "extract.dtype: float16, keep fewer extract.layers / extract.heads, or free space (check_disk: false "
            "skips this check)")


def check_config(config: dict) -> None:
    names = [m["name"] for m in config["models"]]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"models[].name: {dup} used more than once; model names must be unique")
    softmax_free_bases(config)
    ent = config["entropy"]
    for i, m in enumerate(config["models"]):
        where = f"models[{i}] ({m['name']})"
        problem = adapter(m).config_problem(m, i)  # the kind's own checks (models.kinds)
        if not problem and prune_settings(config, m)["enabled"] and adapter(m).prunes:
            problem = adapter(m).prune_problem(m, i)
        if problem:
            raise ConfigError(problem)
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
    tests) with only the keys that matter; `sections` are other top-level config sections
    the checks read (for example `entropy={"head_top_k": 16}` for a small model).
    """
    config = {"models": [{"extract": {}, **copy.deepcopy(model)}], **copy.deepcopy(sections)}
    validate_config(config, str(schema_path))
    return config["models"][0]

