"""The header of a .safetensors file, read and checked without reading its tensors.

A .safetensors file is an 8-byte little-endian length n, n bytes of a JSON object (each array's
`dtype`, `shape` and `data_offsets`, the byte range of its data after the header, and an
optional `__metadata__` of strings), then the arrays' bytes. `read_safetensors_header` is the
one reader of that header: the attention files a model of kind `attention` is read from
(`attention_files`) and the weight files whose parameters the resource model counts
(`resources.parameter_count`) both go through it. Standard library only, so that the workflow
checks files at start-up without numpy's or the safetensors package's import.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SafetensorsHeaderError", "SafetensorsArray", "SafetensorsHeader", "read_safetensors_header", "DTYPE_BITS",
           "MAX_HEADER_BYTES"]

DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
              "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
"""Bits per element of each dtype the safetensors format names."""
MAX_HEADER_BYTES = 100_000_000
"""The longest header read, the safetensors library's own bound: a length beyond it is refused
before anything of that size is read."""


class SafetensorsHeaderError(ValueError):
    """A .safetensors file whose header cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class SafetensorsArray:
    """One array of a .safetensors file, as its header describes it.

    Parameters
    ----------
    dtype : str
        The format's name of its dtype, a key of `DTYPE_BITS` ("F32", "BF16", ...).
    shape : tuple of int
        Its shape.
    offsets : (int, int)
        The byte range [start, stop) of its data, counted from the end of the header.
    """

    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


@dataclass(frozen=True)
class SafetensorsHeader:
    """The header of a .safetensors file.

    Parameters
    ----------
    arrays : dict of str to SafetensorsArray
        Each array by name, in the header's order.
    metadata : dict of str to str
        Its `__metadata__` ({} where there is none).
    data_start : int
        The file offset where the arrays' data begins (8 + the header's length).
    """

    arrays: dict[str, SafetensorsArray]
    metadata: dict[str, str]
    data_start: int


def _fail(path, what: str) -> SafetensorsHeaderError:
    return SafetensorsHeaderError(f"{path}: {what}")


def _array(path, name: str, info, data_bytes: int) -> SafetensorsArray:
    """The header entry `info` of array `name`, checked: a known dtype, a list of sizes and two
    offsets whose span is the shape's bytes, within the file's `data_bytes` after the header."""
    if not isinstance(info, dict):
        raise _fail(path, f"array {name!r}: malformed header entry {info!r:.80}")
    dtype, shape, where = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _fail(path, f"array {name!r}: dtype {dtype!r} is not a safetensors dtype (allowed: "
                          f"{', '.join(DTYPE_BITS)})")
    if not (isinstance(shape, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)
            and isinstance(where, list) and len(where) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in where)):
        raise _fail(path, f"array {name!r}: malformed header entry (shape {shape!r}, data_offsets {where!r})")
    need = (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8
    if not 0 <= where[0] <= where[1] <= data_bytes or where[1] - where[0] != need:
        raise _fail(path, f"array {name!r}: its header says shape {tuple(shape)} ({need} bytes) at bytes "
                          f"{where[0]}..{where[1]}, the file holds {data_bytes} after its header (truncated or "
                          "malformed)")
    return SafetensorsArray(dtype, tuple(shape), (where[0], where[1]))


def read_safetensors_header(path) -> SafetensorsHeader:
    """The header of a .safetensors file, checked against the file's size; no tensor is read.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    SafetensorsHeader
        Its arrays' dtypes, shapes and byte ranges, its metadata and where its data begins.

    Raises
    ------
    SafetensorsHeaderError
        A ValueError naming the file and what is wrong: no header, a header longer than
        `MAX_HEADER_BYTES` or than the file, a header that is not a JSON object, metadata that is
        not strings, an array entry with an unknown dtype, a shape that is not sizes, or data
        offsets that do not hold the shape's bytes within the file (a truncated file).
    OSError
        Where the file cannot be opened.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise _fail(path, f"is not a .safetensors file (no JSON header: {size} bytes"
                              + (f", whose first 8 give a header of {n} bytes)" if n >= 0 else ")"))
        if n > MAX_HEADER_BYTES:
            raise _fail(path, f"is not a .safetensors file (a header of {n} bytes, more than the "
                              f"{MAX_HEADER_BYTES} a header may have)")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise _fail(path, f"is not a .safetensors file (its header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise _fail(path, f"is not a .safetensors file (its header is a JSON {type(header).__name__}, not an object)")
    metadata = header.pop("__metadata__", None) or {}
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise _fail(path, f"its __metadata__ is not an object of strings: {metadata!r:.80}")
    arrays = {name: _array(path, name, info, size - 8 - n) for name, info in header.items()}
    return SafetensorsHeader(arrays, metadata, 8 + n)
