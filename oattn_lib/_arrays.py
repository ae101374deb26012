"""Input validation and the numpy/torch boundary shared by the numerical core.

The core computes in torch so that the same code runs on CPU and CUDA: work happens on
the device of the input. Public functions accept numpy arrays or torch tensors and
return the kind they were given. This module imports torch only when a function needs it
(`is_tensor` and `to_numpy` never do): the stages that only read and sum stored arrays
start without torch's import.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

ArrayLike = "np.ndarray | torch.Tensor"


def is_tensor(x) -> bool:
    """Whether `x` is a torch tensor, without importing torch (no tensor exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def as_tensor(x, name: str, ndim: int | tuple[int, ...] | None = None,
              dtype: torch.dtype | str | None = "float32", finite: bool = True) -> tuple[torch.Tensor, bool]:
    """Validate `x` and return it as a torch tensor, plus whether it came in as numpy.

    `dtype`: a torch dtype or its name (None keeps x's). Raises ValueError naming `name`
    for a wrong number of dimensions, an axis of length 0, or (with `finite`) NaN/inf entries.
    """
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    was_numpy = not isinstance(x, torch.Tensor)
    if was_numpy:
        try:
            arr = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"{name}: cannot be read as an array ({exc})") from exc
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"{name}: expected a numeric array, got dtype {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    else:
        t = x
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name}: expected {want} dimensions, got shape {tuple(t.shape)}")
    if any(s == 0 for s in t.shape):
        raise ValueError(f"{name}: has an axis of length 0 (shape {tuple(t.shape)})")
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if finite and t.is_floating_point() and not all_finite(t):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name}: contains NaN or inf (first at index {tuple(bad)})")
    return t, was_numpy


def all_finite(t: torch.Tensor, chunk: int = 1 << 22) -> bool:
    """No NaN or inf in `t`; on CPU checked a chunk at a time (no tensor-sized mask)."""
    import torch

    if not t.is_floating_point():
        return True
    if t.device.type != "cpu" or t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        return bool(torch.isfinite(t).all())
    # numpy's check is several times faster than torch's on CPU
    return all_finite_array(t.detach().numpy(), chunk)


def all_finite_array(a: np.ndarray, chunk: int = 1 << 22) -> bool:
    """No NaN or inf in the numpy array `a`, checked a slab of its first axis at a time (about
    `chunk` entries; no mask the size of `a`); True for a non-floating dtype."""
    if not np.issubdtype(a.dtype, np.floating):
        return True
    finite = _finite_float16 if a.dtype == np.float16 else (lambda x: bool(np.isfinite(x).all()))
    if a.ndim == 0 or a.size <= chunk:
        return finite(a)
    step = max(1, chunk // (a.size // a.shape[0]))
    return all(finite(a[i:i + step]) for i in range(0, a.shape[0], step))


def _finite_float16(x: np.ndarray) -> bool:
    # NaN and inf are the float16 values whose exponent bits (0x7C00) are all set; numpy's
    # float16 isfinite is not vectorised, an integer mask and maximum are, so the bits are read
    bits = np.ascontiguousarray(x).view(np.uint16)
    return bits.size == 0 or int((bits & 0x7FFF).max()) < 0x7C00


def back(t: torch.Tensor, was_numpy: bool):
    """Return `t` in the kind the caller gave: numpy (on CPU) or torch (on its device)."""
    return t.detach().cpu().numpy() if was_numpy else t


def to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if is_tensor(x) else np.asarray(x)


def check_affinity(a: np.ndarray, name: str = "affinity", atol: float = 1e-6) -> np.ndarray:
    """A square, symmetric, nonnegative, finite matrix, as float64 numpy."""
    a = to_numpy(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{name}: expected a square matrix, got shape {a.shape}")
    if a.shape[0] == 0:
        raise ValueError(f"{name}: has an axis of length 0 (shape {a.shape})")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: contains NaN or inf")
    scale = max(1.0, float(np.abs(a).max()))
    at = np.ascontiguousarray(a.T)  # one strided pass, not two: the copy serves the check and the symmetrisation
    err = float(np.abs(a - at).max())  # np.allclose(rtol=0), without its temporaries
    if not err <= atol * scale:
        raise ValueError(f"{name}: not symmetric (max |A - A^T| = {err:.3g})")
    if (a < -atol * scale).any():
        raise ValueError(f"{name}: has negative entries (min {a.min():.3g})")
    at += a
    at /= 2
    return at
