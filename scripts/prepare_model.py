"""Snakemake entry: dequantise one GGUF model to a float32 safetensors directory."""
from pathlib import Path

from oattn_lib.runtime import setup_logging
from oattn_lib.stages.prepare_model import prepare_model

setup_logging(snakemake.log[0], snakemake.threads)
p = snakemake.params
prepare_model(p.path, p.gguf_file, Path(snakemake.output.config).parent, local_file=snakemake.input.gguf or None)
