"""Shared test settings: offline Hugging Face, a non-interactive matplotlib, one torch thread.

Tiny models run faster on one thread than on two competing ones, and a test suite that
runs beside other work must not oversubscribe the cores.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)
