"""Stage `prepare_model`: a GGUF model converted once to a float32 safetensors directory.

transformers parses and dequantises a GGUF file every time it loads one, a cost that grows with
the model (bench/gguf_load.py measures it); the extract and prune jobs of a GGUF model load this
directory instead, whose float32 tensors are read as they are.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .. import store
from ..models.files import resolve_hf
from ..models.hf_recording import gguf_parsed_once

log = logging.getLogger("oattn")

__all__ = ["prepare_model"]


def prepare_model(path: str, gguf_file: str | None, out_dir, local_file=None) -> None:
    """Write the model `path` / `gguf_file` (or the `smollm2` alias) to the directory `out_dir`:
    config.json, model.safetensors (float32, a decoder with its language-modelling head, so
    the directory serves both `load_hf(out_dir)` and `load_hf(out_dir, causal_lm=True)`), the
    tokenizer's files and source.json (the GGUF file and its SHA-256). Atomic: written into
    a temporary directory renamed into place.

    `local_file`: the GGUF file `path` names, already found (the rule's input); read as it is,
    so that a job in another environment (a conda one, without the package an alias names)
    needs only the file.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if local_file:
        directory, gguf_file = str(Path(local_file).parent), Path(local_file).name
    else:
        directory, gguf_file = resolve_hf(path, gguf_file)
    if not gguf_file:
        raise ValueError(f"gguf_file: model {path!r} names no GGUF file; only GGUF models need preparing")
    source = Path(directory) / gguf_file
    local = Path(directory).is_dir()
    with gguf_parsed_once():
        config = AutoConfig.from_pretrained(directory, gguf_file=gguf_file, local_files_only=local)
        # a decoder keeps its language-modelling head; a GGUF encoder is saved as the bare model
        auto = AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else AutoModel
        log.info("dequantising %s to float32 (%s)", source, auto.__name__)
        model = auto.from_pretrained(directory, gguf_file=gguf_file, config=config, dtype=torch.float32,
                                     local_files_only=local)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file, local_files_only=local)
    # the weights are plain float32 now; without its GGUF quantizer transformers saves the
    # model as any other (and refuses to while the quantizer is attached)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir = Path(out_dir)
    with store.atomic_output(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        sha = store.file_sha256(source) if source.is_file() else None
        (tmp / "source.json").write_text(json.dumps({"path": path, "gguf_file": gguf_file, "sha256": sha},
                                                    indent=2, sort_keys=True))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s: %s, %d layers, %.1fM parameters -> %s", gguf_file, type(model).__name__,
             model.config.num_hidden_layers, n_params / 1e6, out_dir)
