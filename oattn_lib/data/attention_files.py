"""Attention computed elsewhere (vLLM, TransformerLens, nnsight, JAX), read from files: the data of
the model kind `attention` (`models.kinds.attention`, docs/method.md §9.1).

A source is a path: a `.npy`, `.npz` or `.safetensors` file, a zarr store, or a directory of
such files and stores, whose samples are taken in the order of the entries' names. A file
holds one sample, (layer, head, query, key), or several, (sample, layer, head, query, key),
of the quantities `probs` (attention weights) and/or `scores` (pre-softmax logits), named
so (a `.npy` holds one array: its quantity is the entry's `quantity_in_file`), and
optionally:

- `tokens`: (query,) or (sample, query), token ids (integers) or token text (strings); in a
  `.safetensors` file, which holds numbers only, its metadata's `tokens` as JSON;
- `allowed`: the model's mask, True (or nonzero) where a query may attend to a key: (query,
  key) or (layer, query, key) in a one-sample file; (query, key), (sample, query, key) or
  (sample, layer, query, key) in a file of several samples;
- `kv_group`: (head,) the key/value head each query head reads (grouped-query attention:
  0, 0, 1, 1, ...).

A zarr store may be an xarray dataset (dimensions named `sample`, `layer`, `head`, `query`,
`key` are put in that order, whatever the store's order) or an attention store oattn wrote
(`token` and its `token_text`, `allowed`, `kv_group`). Samples may differ in their numbers
of queries and keys (query != key is allowed: cross-attention); every sample has the same
layers and heads.

`describe` reads the headers only (numpy's .npy header, the zip directory of a .npz, the
JSON header of a .safetensors file, `safetensors_header`'s, zarr metadata) and checks shapes and dtypes; `check_values`
reads the data a block at a time (at most about 64 MB) for NaN, inf and negative
probabilities; `read_sample` gives one sample's arrays. Errors are `AttentionFileError`, one
line naming the file and what is wrong. Numpy only: the workflow checks files at start-up.
"""
from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .safetensors_header import SafetensorsHeaderError, read_safetensors_header

__all__ = ["AttentionFileError", "AttentionFiles", "SampleInfo", "AttentionSample", "QUANTITIES", "SUFFIXES",
           "describe", "check_values", "checked", "read_sample", "source_files", "masked_softmax"]

QUANTITIES = ("probs", "scores")
"""The attention quantities a file may hold, by their array names."""

SUFFIXES = (".npy", ".npz", ".safetensors", ".zarr")
"""The formats read, by the file's (or the zarr store's directory's) suffix."""

_DIMS = ("sample", "layer", "head", "query", "key")
_BLOCK_BYTES = 64 << 20  # at most this much of a tensor is read at a time by `check_values`
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "bf16", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class AttentionFileError(ValueError):
    """An attention file that cannot be analysed; the message names the file and the problem."""



def _code(dtype) -> str:
    """numpy's one-letter code of a dtype's family (b bool, i/u integers, f floats, U/S strings,
    T numpy's variable-width strings)."""
    return getattr(dtype, "kind", "")

def _fail(file, what: str) -> AttentionFileError:
    return AttentionFileError(f"{file}: {what}")


# -- one file: its arrays' headers and blocks of their data ------------------------------------
@dataclass(frozen=True)
class _Header:
    """One array of a file: its shape and dtype in canonical axis order (`perm` takes the file's
    axes there; None: as stored) and its dimension names there where the file names them (zarr).
    dtype "bf16" is bfloat16, read as float32."""

    shape: tuple
    dtype: object
    perm: tuple | None = None
    dims: tuple | None = None


class _File:
    """A file's arrays by name (`arrays`), the text tokens of its metadata (`token_text`), and
    `read(name, lead)`: the array's block at the leading indices `lead`, in canonical order."""

    def __init__(self, path: Path):
        self.path = path
        self.arrays: dict[str, _Header] = {}
        self.token_text = None

    def read(self, name: str, lead: tuple = ()) -> np.ndarray:
        raise NotImplementedError

    def blocks(self, name: str, n_lead: int) -> Iterator[tuple[tuple, np.ndarray]]:
        """(leading index, block) over every index of the first `n_lead` axes, in C order."""
        for lead in np.ndindex(*self.arrays[name].shape[:n_lead]):
            yield lead, self.read(name, lead)


def _bf16(raw: np.ndarray) -> np.ndarray:
    return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _npy_problem(path: Path) -> str | None:
    """Why a .npy file whose header reads is not whole: the bytes its header's shape and dtype
    need against the file's; None where the header does not read or the sizes agree."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                               else np.lib.format.read_array_header_2_0(f))
            start = f.tell()
    except (OSError, ValueError):
        return None
    if dtype.hasobject:
        return None
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    have = path.stat().st_size - start
    return None if have >= need else (f"is truncated: its header says shape {tuple(shape)} of {dtype} ({need} bytes), "
                                      f"the file holds {have}")


class _Npy(_File):
    def __init__(self, path: Path, quantity: str):
        super().__init__(path)
        try:
            self._a = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise _fail(path, _npy_problem(path) or f"cannot be read without pickles ({exc}); save numbers with "
                                                      "numpy.save") from None
        except OSError as exc:
            raise _fail(path, f"is not a .npy file ({exc})") from None
        self.arrays[quantity] = _Header(self._a.shape, self._a.dtype)
        self._name = quantity

    def read(self, name, lead=()):
        return np.asarray(self._a[lead])


class _Npz(_File):
    """Members are read from the zip archive as streams (compressed or not): the header, then the
    bytes of the block asked for, never the whole member."""

    def __init__(self, path: Path):
        super().__init__(path)
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise _fail(path, f"is not a .npz archive ({exc})") from None
        self._offset = {}
        for member in self._zip.namelist():
            if not member.endswith(".npy"):
                continue
            name = member[:-4]
            with self._zip.open(member) as f:
                try:
                    version = np.lib.format.read_magic(f)
                    shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                             else np.lib.format.read_array_header_2_0(f))
                except ValueError as exc:
                    raise _fail(path, f"array {name!r}: unreadable .npy header ({exc})") from None
                self._offset[name] = (member, f.tell(), fortran)
            self.arrays[name] = _Header(tuple(shape), dtype)

    def _member(self, name):
        member, offset, fortran = self._offset[name]
        h = self.arrays[name]
        if h.dtype.hasobject:
            raise _fail(self.path, f"array {name!r} holds Python objects (pickled); save numbers or fixed-width "
                                   "strings")
        return member, offset, fortran, h

    def read(self, name, lead=()):
        member, offset, fortran, h = self._member(name)
        with self._zip.open(member) as f:
            if fortran:  # not contiguous by leading index: the whole member
                return np.lib.format.read_array(f, allow_pickle=False)[lead]
            trailing = h.shape[len(lead):]
            count = int(np.prod(trailing, dtype=np.int64))
            flat = int(np.ravel_multi_index(lead, h.shape[:len(lead)])) if lead else 0
            f.seek(offset + flat * count * h.dtype.itemsize)
            return self._block(f.read(count * h.dtype.itemsize), name, h, trailing)

    def _block(self, data: bytes, name: str, h, trailing) -> np.ndarray:
        if len(data) != int(np.prod(trailing, dtype=np.int64)) * h.dtype.itemsize:
            raise _fail(self.path, f"array {name!r} is truncated: its header says shape {h.shape} of {h.dtype}")
        return np.frombuffer(data, dtype=h.dtype).reshape(trailing)

    def blocks(self, name, n_lead):
        member, offset, fortran, h = self._member(name)
        if fortran:
            yield from super().blocks(name, n_lead)
            return
        trailing = h.shape[n_lead:]
        nbytes = int(np.prod(trailing, dtype=np.int64)) * h.dtype.itemsize
        with self._zip.open(member) as f:
            f.seek(offset)
            for lead in np.ndindex(*h.shape[:n_lead]):
                yield lead, self._block(f.read(nbytes), name, h, trailing)


class _Safetensors(_File):
    def __init__(self, path: Path):
        super().__init__(path)
        try:
            header = read_safetensors_header(path)
        except SafetensorsHeaderError as exc:
            raise AttentionFileError(str(exc)) from None
        self._start = header.data_start
        self._where = {}
        text = header.metadata.get("tokens")
        if text is not None:
            try:
                self.token_text = json.loads(text)
            except ValueError:
                raise _fail(path, "metadata 'tokens' is not JSON (a list of strings)") from None
        for name, a in header.arrays.items():
            dtype = _SAFETENSORS_DTYPES.get(a.dtype)
            if dtype is None:
                raise _fail(path, f"array {name!r}: dtype {a.dtype} is not read here (allowed: "
                                  f"{', '.join(_SAFETENSORS_DTYPES)})")
            self._where[name] = a.offsets
            self.arrays[name] = _Header(a.shape, dtype if dtype == "bf16" else np.dtype(dtype))

    def read(self, name, lead=()):
        h = self.arrays[name]
        raw = np.memmap(self.path, mode="r", offset=self._start + self._where[name][0],
                        dtype=np.uint16 if h.dtype == "bf16" else h.dtype, shape=h.shape)
        block = np.array(raw[lead])
        return _bf16(block) if h.dtype == "bf16" else block


class _Zarr(_File):
    """Arrays of a zarr group; an oattn attention store's `token` is read as `tokens` and its
    `token_text` attribute as the tokens' text."""

    def __init__(self, path: Path):
        import zarr

        super().__init__(path)
        try:
            self._group = zarr.open_group(str(path), mode="r")
        except Exception as exc:
            raise _fail(path, f"cannot be opened as a zarr store ({type(exc).__name__}: {exc})") from None
        self._names = {}
        for key, arr in self._group.arrays():
            name = "tokens" if key == "token" and "tokens" not in self._group else key
            dims = getattr(arr.metadata, "dimension_names", None) or arr.attrs.get("_ARRAY_DIMENSIONS")
            perm, named = None, None
            if dims and len(dims) == arr.ndim and set(dims) <= set(_DIMS):
                order = sorted(range(arr.ndim), key=lambda i: _DIMS.index(dims[i]))
                perm = tuple(order) if order != list(range(arr.ndim)) else None
                named = tuple(dims[i] for i in order)
            shape = tuple(arr.shape) if perm is None else tuple(arr.shape[i] for i in perm)
            self._names[name] = key
            self.arrays[name] = _Header(shape, np.dtype(arr.dtype) if _code(arr.dtype) != "T" else np.dtype(str),
                                        perm, named)
        text = self._group.attrs.get("token_text")
        if text is not None:
            self.token_text = json.loads(text) if isinstance(text, str) else list(text)

    def read(self, name, lead=()):
        arr = self._group[self._names[name]]
        perm = self.arrays[name].perm
        if perm is None:
            return np.asarray(arr[lead] if lead else arr[...])
        index = [slice(None)] * arr.ndim
        for axis, i in zip(perm, lead):
            index[axis] = i
        block = np.asarray(arr[tuple(index)])
        rest = [a for a in perm if a not in perm[:len(lead)]]  # the kept axes, in canonical order
        kept = [a for a in range(arr.ndim) if a not in perm[:len(lead)]]
        return block.transpose([kept.index(a) for a in rest])


def _open(path: Path, quantity_in_file: str) -> _File:
    suffix = path.suffix.lower()
    if path.is_dir():
        return _Zarr(path)
    if suffix == ".npy":
        return _Npy(path, quantity_in_file)
    if suffix == ".npz":
        return _Npz(path)
    if suffix == ".safetensors":
        return _Safetensors(path)
    raise _fail(path, f"format {suffix or '(no suffix)'} is not read here; allowed: {', '.join(SUFFIXES)}")


def _is_zarr(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in ("zarr.json", ".zgroup", ".zattrs"))


def source_files(path) -> list[Path]:
    """The files (and zarr stores) of an attention source, in sample order: the file or store
    itself, or a directory's entries of the formats read (`SUFFIXES`), sorted by name."""
    path = Path(path)
    try:
        if not path.exists():
            raise _fail(path, "no such file or directory")
        if not path.is_dir() or _is_zarr(path):
            return [path]
        entries = sorted(p for p in path.iterdir() if not p.name.startswith(".")
                         and p.suffix.lower() in SUFFIXES and (p.is_file() or _is_zarr(p)))
    except OSError as exc:
        raise _os_problem(path, exc) from None
    if not entries:
        raise _fail(path, f"the directory holds no attention file ({', '.join(SUFFIXES)})")
    return entries


# -- what a source holds ------------------------------------------------------------------------
@dataclass(frozen=True)
class SampleInfo:
    """One sample of a source: the file it is in, its index there (None: a one-sample file) and
    its shape."""

    file: str
    index: int | None
    n_layers: int
    n_heads: int
    n_query: int
    n_key: int


@dataclass(frozen=True, eq=False)
class AttentionFiles:
    """An attention source as `describe` read it: `path`, its `files` in sample order, every
    `samples`' shape, the `quantities` each file holds (probs and/or scores) and whether the
    files give `tokens`, `allowed` and `kv_group`."""

    path: str
    files: tuple
    samples: tuple
    quantities: tuple
    optional: tuple = ()
    opened: dict = field(default_factory=dict, repr=False)

    @property
    def n_units(self) -> tuple[int, int]:
        return self.samples[0].n_layers, self.samples[0].n_heads

    def n_tokens(self) -> int | None:
        """The common query = key length of every sample; None when they differ or query != key."""
        sizes = {(s.n_query, s.n_key) for s in self.samples}
        if len(sizes) != 1:
            return None
        n_q, n_k = sizes.pop()
        return n_q if n_q == n_k else None


def _is_float(dtype) -> bool:
    return dtype == "bf16" or np.issubdtype(dtype, np.floating)


def _check_file(f: _File, quantity_in_file: str) -> tuple[list[SampleInfo], tuple, tuple]:
    """The samples of one file and its quantities and optional arrays, from headers only."""
    found = [q for q in QUANTITIES if q in f.arrays]
    if not found:
        raise _fail(f.path, f"holds neither 'probs' nor 'scores' (arrays: {sorted(f.arrays) or 'none'}); name the "
                            "attention weights 'probs' and/or the pre-softmax logits 'scores'")
    shape = f.arrays[found[0]].shape
    for q in found:
        h = f.arrays[q]
        if len(h.shape) not in (4, 5):
            raise _fail(f.path, f"{q}: rank {len(h.shape)}, shape {h.shape}; expected (layer, head, query, key) or "
                                "(sample, layer, head, query, key)")
        if not _is_float(h.dtype):
            raise _fail(f.path, f"{q}: dtype {h.dtype} is not floating point; expected float16, bfloat16, float32 "
                                "or float64")
        if h.shape != shape:
            raise _fail(f.path, f"probs {f.arrays['probs'].shape} and scores {f.arrays['scores'].shape} differ in "
                                "shape")
        if 0 in h.shape:
            raise _fail(f.path, f"{q}: shape {h.shape} is empty")
    many = len(shape) == 5
    n_s = shape[0] if many else 1
    n_l, n_h, n_q, n_k = shape[-4:]
    tok = f.arrays.get("tokens")
    if tok is not None:
        ok = [(n_q,), (n_s, n_q)] if many else [(n_q,)]
        if tok.shape not in ok:
            raise _fail(f.path, f"tokens: shape {tok.shape}; expected {' or '.join(map(str, ok))} (one per query)")
        if tok.dtype == "bf16" or _code(tok.dtype) not in "iuUS":
            raise _fail(f.path, f"tokens: dtype {tok.dtype}; expected integer token ids or strings (token text)")
    if f.token_text is not None:
        text = f.token_text
        ok = (isinstance(text, list) and (len(text) == n_q and all(isinstance(t, str) for t in text)
                                          or many and len(text) == n_s and all(
                    isinstance(t, list) and len(t) == n_q for t in text)))
        if not ok:
            raise _fail(f.path, f"metadata tokens: expected a JSON list of {n_q} strings (one per query)"
                                + (f", or {n_s} such lists" if many else ""))
    mask = f.arrays.get("allowed")
    if mask is not None:
        ok = [(n_q, n_k), (n_s, n_q, n_k), (n_s, n_l, n_q, n_k)] if many else [(n_q, n_k), (n_l, n_q, n_k)]
        if many and _layer_mask(mask):
            ok[1] = (n_l, n_q, n_k)
        if mask.shape not in ok:
            raise _fail(f.path, f"allowed: shape {mask.shape} does not fit {found[0]} {shape}; expected "
                                f"{' or '.join(map(str, ok))}")
        if mask.dtype == "bf16" or _code(mask.dtype) not in "biu":
            raise _fail(f.path, f"allowed: dtype {mask.dtype}; expected bool (True where a query may attend)")
    kv = f.arrays.get("kv_group")
    if kv is not None:
        if kv.shape != (n_h,) or kv.dtype == "bf16" or _code(kv.dtype) not in "iu":
            raise _fail(f.path, f"kv_group: {kv.dtype} {kv.shape}; expected ({n_h},) integers, one per head")
        groups = f.read("kv_group").astype(np.int64)
        n_kv = int(groups.max()) + 1 if groups.size else 0
        if n_kv < 1 or n_h % n_kv or not np.array_equal(groups, np.arange(n_h) // (n_h // n_kv)):
            raise _fail(f.path, f"kv_group: {groups.tolist()} is not a grouping of consecutive heads (expected "
                                "0, ..., 0, 1, ..., 1, ... in equal groups)")
    name = str(f.path)
    samples = [SampleInfo(name, i if many else None, n_l, n_h, n_q, n_k) for i in range(n_s)]
    optional = tuple(k for k in ("tokens", "allowed", "kv_group") if k in f.arrays or
                     (k == "tokens" and f.token_text is not None))
    return samples, tuple(found), optional


def _layer_mask(h: _Header) -> bool:
    """Whether a rank-3 mask is (layer, query, key) in a file of several samples: where its
    dimensions are named so (otherwise it is (sample, query, key))."""
    return len(h.shape) == 3 and h.dims is not None and h.dims[0] == "layer"


def _signature(path: Path) -> tuple:
    """What `describe`'s cache is keyed by: the path, size and modification time of every file
    the source is read from (`source_files`; a zarr store's own files), nothing else below a
    directory (a source at `/` lists only `/`'s entries). Empty where the source is unreadable:
    `describe` then names the problem."""
    try:
        entries = source_files(path)
    except ValueError:
        return ()
    out = []
    for e in entries:
        for p in sorted(e.rglob("*")) if e.is_dir() else [e]:
            if p.is_file():
                st = p.stat()
                out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _os_problem(path: Path, exc: OSError) -> AttentionFileError:
    """An operating-system error on the source (permission, a name too long) as one line naming it."""
    return _fail(exc.filename or path, exc.strerror or str(exc))


def describe(path, quantity_in_file: str = "probs") -> AttentionFiles:
    """What the attention source `path` holds, from the files' headers (`AttentionFiles`): shapes,
    dtypes, ranks, tokens, masks and key/value groups checked, no tensor read.
    `quantity_in_file`: the quantity of a `.npy` file's one array (probs or scores)."""
    if quantity_in_file not in QUANTITIES:
        raise ValueError(f"quantity_in_file: {quantity_in_file!r}; allowed: {', '.join(QUANTITIES)}")
    p = Path(path)
    try:
        return _describe(str(p), quantity_in_file, _signature(p))
    except OSError as exc:
        raise _os_problem(p, exc) from None


@lru_cache(maxsize=16)
def _describe(path: str, quantity_in_file: str, signature: tuple) -> AttentionFiles:
    files = source_files(path)
    samples, opened, quantities, optional = [], {}, None, None
    for file in files:
        f = _open(file, quantity_in_file)
        got, found, opt = _check_file(f, quantity_in_file)
        if quantities is None:
            quantities, optional = found, opt
        elif found != quantities:
            raise _fail(file, f"holds {', '.join(found)}, the first file {files[0]} {', '.join(quantities)}; every "
                              "file must hold the same quantities")
        first = samples[0] if samples else got[0]
        if (got[0].n_layers, got[0].n_heads) != (first.n_layers, first.n_heads):
            raise _fail(file, f"{got[0].n_layers} layers x {got[0].n_heads} heads, {first.file} has "
                              f"{first.n_layers} x {first.n_heads}; every sample must have the same layers and heads")
        opened[str(file)] = f
        samples += got
    return AttentionFiles(str(path), tuple(str(f) for f in files), tuple(samples), quantities, optional, opened)


def check_values(source: AttentionFiles) -> None:
    """NaN or inf in `probs` or `scores`, or a negative probability, is an `AttentionFileError`
    naming the file, the quantity and where; read a block of at most about 64 MB at a time."""
    for name, f in source.opened.items():
        for q in source.quantities:
            h = f.arrays[q]
            itemsize = 4 if h.dtype == "bf16" else h.dtype.itemsize
            n_lead = 1
            while n_lead < len(h.shape) - 2 and np.prod(h.shape[n_lead:], dtype=np.int64) * itemsize > _BLOCK_BYTES:
                n_lead += 1
            for lead, block in f.blocks(q, n_lead):
                block = _bf16(block) if h.dtype == "bf16" and block.dtype == np.uint16 else block
                bad = None if np.isfinite(block).all() else "NaN or inf"
                if bad is None and q == "probs" and (block < 0).any():
                    bad = "a negative probability"
                if bad:
                    at = np.argwhere(~np.isfinite(block) if bad == "NaN or inf" else block < 0)[0]
                    index = (*lead, *at.tolist())
                    dims = _DIMS[-len(h.shape):]
                    where = ", ".join(f"{d} {i}" for d, i in zip(dims, index))
                    raise _fail(name, f"{q} has {bad} at {where}")


@lru_cache(maxsize=16)
def _checked(path: str, quantity_in_file: str, signature: tuple) -> AttentionFiles:
    source = _describe(path, quantity_in_file, signature)
    check_values(source)
    return source


def checked(path, quantity_in_file: str = "probs") -> AttentionFiles:
    """`describe` and `check_values` of the source `path`, remembered for this process while its
    files are unchanged (the config checks, the rules and the extract job ask several times)."""
    describe(path, quantity_in_file)
    p = Path(path)
    try:
        return _checked(str(p), quantity_in_file, _signature(p))
    except OSError as exc:
        raise _os_problem(p, exc) from None


# -- one sample -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AttentionSample:
    """One sample of a source: `probs` and `scores` (layer, head, query, key) float arrays (scores
    None where the files hold none), `tokens` (query,) integer ids, their `token_text` (None:
    none), `allowed` (query, key) or (layer, query, key) bool (None: nothing masked),
    `n_kv_heads` (None: one per query head) and the `file` it comes from."""

    probs: np.ndarray
    scores: np.ndarray | None
    tokens: np.ndarray
    token_text: list | None
    allowed: np.ndarray | None
    n_kv_heads: int | None
    file: str


def masked_softmax(scores: np.ndarray, allowed=None) -> np.ndarray:
    """Softmax over keys of scores (..., query, key) in float64, 0 where `allowed` (broadcast) is
    False; a row with no allowed key is all 0."""
    z = np.asarray(scores, dtype=np.float64)
    if allowed is not None:
        z = np.where(allowed, z, -np.inf)
    top = z.max(axis=-1, keepdims=True)
    e = np.exp(z - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def read_sample(source: AttentionFiles, index: int) -> AttentionSample:
    """Sample `index` of the source (`describe`). Without `probs` in the files they are the
    masked softmax of the scores over the keys (`masked_softmax`)."""
    if not 0 <= index < len(source.samples):
        raise IndexError(f"sample {index}: the source {source.path} holds {len(source.samples)} samples")
    info = source.samples[index]
    f = source.opened[info.file]
    lead = () if info.index is None else (info.index,)

    def per_sample(name, rank):
        h = f.arrays[name]
        return f.read(name, lead) if len(h.shape) == rank + 1 and lead else f.read(name)

    scores = f.read("scores", lead) if "scores" in source.quantities else None
    allowed = None
    if "allowed" in f.arrays:
        h = f.arrays["allowed"]
        shared = len(h.shape) == 2 or not lead or _layer_mask(h)
        allowed = f.read("allowed", () if shared else lead) != 0
    probs = f.read("probs", lead) if "probs" in source.quantities else masked_softmax(
        scores, None if allowed is None else (allowed if allowed.ndim == 2 else allowed[:, None]))
    text = f.token_text
    if text is not None and info.index is not None and text and isinstance(text[0], list):
        text = text[info.index]
    tokens = np.arange(info.n_query)
    if "tokens" in f.arrays:
        t = per_sample("tokens", 1)
        if _code(t.dtype) in "US":
            text = [str(x) for x in t.astype(str)]
        else:
            tokens = t.astype(np.int64)
    n_kv = None
    if "kv_group" in f.arrays:
        n_kv = int(f.read("kv_group").max()) + 1
    return AttentionSample(probs, scores, tokens, None if text is None else list(text), allowed, n_kv, info.file)
