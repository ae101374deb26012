"""Semantic checks of the workflow config, beyond what the JSON schema can say.

The schema (workflow/schemas/config.schema.yaml) catches misspelled keys, wrong types and
out-of-range numbers; these checks catch combinations that would fail an hour into a
run: duplicate names, a model too small for the Haar top_k, impossible figure heads.
"""
from __future__ import annotations

__all__ = ["ConfigError", "validate_config", "check_config", "n_tokens", "n_units"]


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


def validate_config(config: dict, schema_path: str) -> None:
    """Validate against the JSON schema (filling in its defaults), then `check_config`.

    Any problem is one ConfigError line naming the key and what is allowed, instead of a
    page of jsonschema output.
    """
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    try:
        validate(config, schema_path, set_default=True)
    except WorkflowError as exc:
        # snakemake raises its WorkflowError while handling jsonschema's error
        err = exc.__cause__ or exc.__context__
        if not isinstance(err, jsonschema.ValidationError):
            raise
        raise ConfigError(_one_line(err)) from None
    check_config(config)


def n_tokens(model: dict) -> int | None:
    """Tokens per sample (query = key axis length) when known before running the model."""
    kind, arch, ex = model["kind"], model.get("arch", {}), model.get("extract", {})
    if kind == "txl":
        n = arch.get("tgt_len", 64)
    elif kind == "vit":
        if arch.get("variant") == "vit_b_16":
            n = 197
        else:
            size = model.get("data", {}).get("image_size", 32)
            patch = arch.get("patch_size", 4)
            n = (size // patch) ** 2 + 1
    else:
        n = ex.get("max_length", 128)
    crop = ex.get("crop")
    if crop:
        n = min(n, crop[1]) - crop[0]
    return n


def n_units(model: dict) -> tuple[int, int] | None:
    """(layers, heads) when known from the config (txl, vit); None for hf models."""
    arch = model.get("arch", {})
    if model["kind"] == "txl":
        return arch.get("n_layer", 4), arch.get("n_head", 4)
    if model["kind"] == "vit":
        if arch.get("variant") == "vit_b_16":
            return 12, 12
        return arch.get("num_layers", 4), arch.get("num_heads", 4)
    return None


def check_config(config: dict) -> None:
    names = [m["name"] for m in config["models"]]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"models[].name: {dup} used more than once; model names must be unique")
    ent = config.get("entropy", {})
    for i, m in enumerate(config["models"]):
        where = f"models[{i}] ({m['name']})"
        arch = m.get("arch", {})
        if m["kind"] == "vit" and arch.get("variant", "custom") == "custom":
            size, patch = m.get("data", {}).get("image_size", 32), arch.get("patch_size", 4)
            if size % patch:
                raise ConfigError(f"{where}.arch.patch_size: {patch} must divide data.image_size {size}")
            if arch.get("hidden_dim", 64) % arch.get("num_heads", 4):
                raise ConfigError(f"{where}.arch.num_heads: must divide arch.hidden_dim "
                                  f"{arch.get('hidden_dim', 64)}")
        crop = m.get("extract", {}).get("crop")
        if crop and not crop[0] < crop[1]:
            raise ConfigError(f"{where}.extract.crop: start {crop[0]} must be below stop {crop[1]}")
        n = n_tokens(m)
        units = n_units(m)
        top = ent.get("head_top_k", 400)
        if n * n < top:
            raise ConfigError(f"entropy.head_top_k: {top} exceeds the {n} x {n} = {n * n} bi-Haar "
                              f"coefficients of {where}; allowed: 1..{n * n}")
        if units is not None:
            total = n * n * units[0] * units[1]
            if total < ent.get("network_top_k", 100):
                raise ConfigError(f"entropy.network_top_k: {ent.get('network_top_k')} exceeds the {total} "
                                  f"tri-Haar coefficients of {where}; allowed: 1..{total}")
            for layer, head in config.get("decompose", {}).get("figure_heads", []):
                if not (-units[0] <= layer < units[0] and -units[1] <= head < units[1]):
                    raise ConfigError(f"decompose.figure_heads: ({layer}, {head}) is outside {where}'s "
                                      f"{units[0]} layers x {units[1]} heads; allowed: layer in "
                                      f"-{units[0]}..{units[0] - 1}, head in -{units[1]}..{units[1] - 1}")
