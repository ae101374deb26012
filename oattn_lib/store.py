"""Labelled artifacts in zarr stores (docs/method.md §12): atomic writes, checked reads, provenance.

Every store is written to a temporary sibling directory and renamed into place, so a
crash never leaves a half-written store at the output path that a rerun would trust.
Reads load every variable eagerly and turn storage faults (a truncated or missing chunk,
NaN where none may be) into errors that name the store and the variable.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import xarray as xr

from . import __version__
from ._arrays import all_finite_array

__all__ = ["StoreError", "atomic_output", "atomic_path", "store_path", "write_store", "read_store",
           "load_variable", "provenance_attrs", "software_attrs", "code_commit", "git_commit",
           "file_sha256", "atomic_write_text", "atomic_write_parquet", "save_npz", "save_json",
           "load_npz"]


class StoreError(RuntimeError):
    """A stored artifact is missing, unreadable or invalid; the message names it."""


def atomic_path(path: str | os.PathLike) -> Path:
    """A fresh temporary sibling of `path` (same directory, so a rename is atomic).

    Its directory is created where missing.

    Parameters
    ----------
    path : str or PathLike
        The output the temporary stands in for.

    Returns
    -------
    Path
        ``.<name>.tmp-<random>`` beside `path`; nothing is created there.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")


def _replace(tmp: Path, path: Path) -> None:
    if path.exists() or path.is_symlink():
        trash = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, trash)
        os.replace(tmp, path)
        shutil.rmtree(trash, ignore_errors=True) if trash.is_dir() else trash.unlink()
    else:
        os.replace(tmp, path)


def _remove_stale_temporaries(path: Path) -> None:
    """Temporaries of `path` left by a killed writer are garbage: never renamed, never trusted."""
    for old in path.parent.glob(f".{path.name}.tmp-*"):
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def _drain_zarr_io(timeout: float = 60.0) -> None:
    """Wait until zarr's IO event loop has finished every pending task.

    zarr 3 writes chunks as concurrent tasks on its own IO thread; when one write fails
    (disk full), the error reaches us while the other writes are still running and may
    recreate files and directories under a temporary we are about to remove. Only once
    they are done is removing the temporary final.
    """
    from zarr.core import sync as zsync

    loop = zsync.loop[0]
    if loop is None or not loop.is_running():
        return

    async def others_done() -> None:
        me = asyncio.current_task()
        while pending := [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
            await asyncio.wait(pending)

    asyncio.run_coroutine_threadsafe(others_done(), loop).result(timeout)


def _discard(tmp: Path) -> None:
    """Remove a failed write's temporary once no late zarr write can recreate any of it."""
    for _ in range(5):
        _drain_zarr_io()
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        if not tmp.exists():
            return


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    """A context manager giving a temporary sibling of `path` to write, renamed over `path` on success.

    On any failure the temporary is removed, so `path` only ever holds a complete output; the
    temporaries a killed writer left are removed first (docs/method.md §12). The one
    atomic-write mechanism of the project: stores, npz, json, text, PNG and checkpoints all go
    through it.

    The environment variable OATTN_FAULT_PAUSE_WRITE (seconds) pauses between writing the
    temporary and renaming it: a window for fault-injection tests to kill a job in the
    middle of a write.

    Parameters
    ----------
    path : str or PathLike
        The output: a file or a directory.

    Yields
    ------
    Path
        The temporary to write (`atomic_path`), a file or a directory.
    """
    path = Path(path)
    _remove_stale_temporaries(path)
    tmp = atomic_path(path)
    try:
        yield tmp
        pause = float(os.environ.get("OATTN_FAULT_PAUSE_WRITE", "0") or 0)
        if pause > 0:
            time.sleep(pause)
        _replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def store_path(path: str | os.PathLike) -> Path:
    """The store directory of `path`, which is the directory or its root `zarr.json`.

    The workflow names a store by its root `zarr.json` (a file output, so that Snakemake puts
    no timestamp marker inside the store).

    Parameters
    ----------
    path : str or PathLike
        A store directory, or its `zarr.json`.

    Returns
    -------
    Path
        The store directory.
    """
    path = Path(path)
    return path.parent if path.name == "zarr.json" else path


def write_store(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write `ds` as a zarr store at `path`, atomically (`atomic_output`).

    Parameters
    ----------
    ds : xarray.Dataset
        The labelled arrays and their attributes (`provenance_attrs`).
    path : str or PathLike
        The store directory or its zarr.json; a store already there is replaced.

    Returns
    -------
    Path
        The store directory.
    """
    path = store_path(path)
    with atomic_output(path) as tmp:
        ds.to_zarr(tmp, mode="w", consolidated=False)
    return path


def read_store(path: str | os.PathLike, require: tuple[str, ...] = (), finite: tuple[str, ...] = (),
               variables: tuple[str, ...] | None = None, lazy: bool = False) -> xr.Dataset:
    """Open a zarr store and load it; errors name the store and the variable at fault.

    Parameters
    ----------
    path : str or PathLike
        The store directory or its zarr.json.
    require : tuple of str, default ()
        Variables that must be present.
    finite : tuple of str, default ()
        Variables that must hold no NaN or inf.
    variables : tuple of str, optional
        Load only these data variables (and every coordinate, and those of `require` and
        `finite`); the others are left out: an attention store of a long sample of a real
        model holds gigabytes of scores and as much of probs. None: every variable.
    lazy : bool, default False
        Load nothing (the `finite` check is then not made); selecting one head reads that
        head's chunks only.

    Returns
    -------
    xarray.Dataset
        The store's variables with their dims and coords, loaded into memory unless `lazy`.

    Raises
    ------
    StoreError
        If the store does not exist or cannot be opened, a required variable is missing, a
        variable cannot be read or a `finite` one holds NaN or inf.
    """
    path = store_path(path)
    if not path.exists():
        raise StoreError(f"{path}: store does not exist")
    try:
        ds = xr.open_zarr(path, consolidated=False)
    except Exception as exc:
        raise StoreError(f"{path}: cannot open as a zarr store ({type(exc).__name__}: {exc}); "
                         "delete it so the workflow regenerates it") from exc
    for name in require:
        if name not in ds.variables:
            raise StoreError(f"{path}: variable {name!r} is missing (has {sorted(ds.data_vars)})")
    if variables is not None:
        ds = ds.drop_vars([v for v in ds.data_vars if v not in set(variables) | set(require) | set(finite)])
    if lazy:
        return ds
    for name, var in ds.variables.items():
        try:
            var.load()
        except Exception as exc:
            raise _unreadable(path, name, exc) from exc
    ds = ds.load()
    for name in finite:
        _require_finite(path, name, ds[name].values)
    return ds


def load_variable(ds: xr.Dataset, name: str, path, finite: bool = False) -> np.ndarray:
    """One variable of a lazily opened store (`read_store(..., lazy=True)`) as a numpy array.

    With `read_store`'s errors: unreadable chunks, and with `finite` NaN or inf, name the store
    and the variable.

    Parameters
    ----------
    ds : xarray.Dataset
        The store, opened by `read_store(path, lazy=True)`.
    name : str
        The variable.
    path : str or PathLike
        The store's path, for the errors.
    finite : bool, default False
        Require the values to hold no NaN or inf.

    Returns
    -------
    ndarray
        The variable's values, of its dims' shape.

    Raises
    ------
    StoreError
        If a chunk cannot be read, or (`finite`) a value is NaN or inf.
    """
    try:
        values = np.asarray(ds[name].values)
    except Exception as exc:
        raise _unreadable(store_path(path), name, exc) from exc
    if finite:
        _require_finite(store_path(path), name, values)
    return values


def _unreadable(path: Path, name: str, exc: Exception) -> StoreError:
    return StoreError(f"{path}: variable {name!r} is unreadable ({type(exc).__name__}: {exc}); "
                      "the store is corrupt, delete it so the workflow regenerates it")


def _require_finite(path: Path, name: str, values: np.ndarray) -> None:
    """NaN or inf is an error naming the store and the variable (checked a slab at a time)."""
    if not all_finite_array(values):
        raise StoreError(f"{path}: variable {name!r} contains NaN or inf")


def git_commit(root: str | os.PathLike) -> str | None:
    """The git commit checked out in the work tree whose top directory is `root`.

    "<sha>", with "-dirty" where tracked files have uncommitted changes; None where `root` is
    not the top of a work tree, git is missing or fails. One `git status` that writes nothing
    (not even the index's refreshed stat data, so it never contends with a git command running
    there).

    Parameters
    ----------
    root : str or PathLike
        The work tree's top directory (holding `.git`: a directory, or a file in a linked work tree).

    Returns
    -------
    str or None
        The commit, or None.
    """
    root = os.fspath(root)
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    # the repository is found from `root` alone, whatever the caller's git variables say
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    try:
        out = subprocess.run(["git", "-C", root, "status", "--porcelain=v2", "--branch", "--untracked-files=no"],
                             capture_output=True, text=True, env=env, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return None
    lines = out.splitlines()
    sha = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if sha is None or len(sha) not in (40, 64):  # no commit yet: "(initial)"
        return None
    dirty = any(line and not line.startswith("#") for line in lines)
    return sha + ("-dirty" if dirty else "")


@functools.cache
def code_commit() -> str | None:
    """The git commit of the library's code, computed once per process (docs/method.md §12.3).

    `git_commit` of the directory holding `oattn_lib`, where that is a clone's top directory.

    Never the commit of the current directory, which may be a user's own repository using the
    workflow as a module; None for an installed wheel, without git, or where git fails.

    Returns
    -------
    str or None
        "<sha>" or "<sha>-dirty", or None.
    """
    return git_commit(Path(__file__).resolve().parent.parent)


def software_attrs() -> dict:
    """What software produced an artifact: the library's version and commit.

    `oattn_version` (`oattn_lib.__version__`) and, where the library is a git work tree,
    `oattn_commit` (`code_commit`).

    Returns
    -------
    dict
        Strings by attribute name.
    """
    commit = code_commit()
    return {"oattn_version": __version__, **({"oattn_commit": commit} if commit else {})}


def provenance_attrs(config_slice: dict, checkpoint_hash: str | None = None, code: str | None = None,
                     **extra) -> dict:
    """Store attributes recording what produced an artifact (docs/method.md §12.3).

    Parameters
    ----------
    config_slice : dict
        The config the stage read, stored as JSON (`config`).
    checkpoint_hash : str, optional
        The SHA-256 of the model's checkpoint (`checkpoint_sha256`).
    code : str, optional
        The stage's code fingerprint (`oattn_lib.fingerprint`, as "<stage>:<hash>"; `code`).
    **extra
        Further attributes; anything but a str, int or float is stored as JSON.

    Returns
    -------
    dict
        The attributes, with `software_attrs` (the version of oattn and the commit of its code).
    """
    attrs = {"config": json.dumps(config_slice, sort_keys=True, default=str), **software_attrs()}
    if checkpoint_hash is not None:
        attrs["checkpoint_sha256"] = checkpoint_hash
    if code is not None:
        attrs["code"] = str(code)
    for key, value in extra.items():
        attrs[key] = value if isinstance(value, (str, int, float)) else json.dumps(value, default=str)
    return attrs


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read a block at a time (a checkpoint's, docs/method.md §12.3).

    Parameters
    ----------
    path : str or PathLike
        The file.

    Returns
    -------
    str
        The digest, 64 hexadecimal digits.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write a text file atomically (`atomic_output`).

    Parameters
    ----------
    path : str or PathLike
        The file.
    text : str
        Its contents.

    Returns
    -------
    Path
        `path`.
    """
    with atomic_output(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def atomic_write_parquet(df, path: str | os.PathLike) -> Path:
    """Write a pandas DataFrame as a parquet file atomically (pyarrow, without its index).

    Parameters
    ----------
    df : pandas.DataFrame
        The table.
    path : str or PathLike
        The file.

    Returns
    -------
    Path
        `path`.
    """
    with atomic_output(path) as tmp:
        df.to_parquet(tmp, index=False, engine="pyarrow")
    return Path(path)


def save_npz(path: str | os.PathLike, **arrays) -> None:
    """Write arrays to an .npz file atomically (read back with `load_npz`, no pickles).

    Parameters
    ----------
    path : str or PathLike
        The file.
    **arrays
        The arrays, by name (array_like, of any shape).
    """
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def save_json(path: str | os.PathLike, obj) -> None:
    """Write `obj` as indented, key-sorted JSON atomically (numpy scalars and arrays allowed).

    Parameters
    ----------
    path : str or PathLike
        The file.
    obj : object
        Anything JSON holds; numpy scalars become numbers, arrays lists, anything else its str.
    """
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def load_npz(path: str | os.PathLike) -> dict:
    """The arrays of an .npz file written by `save_npz`; errors name the file.

    Parameters
    ----------
    path : str or PathLike
        The file.

    Returns
    -------
    dict
        The arrays (ndarray) by name, loaded into memory.

    Raises
    ------
    StoreError
        If the file cannot be read (missing, truncated, or holding pickles).
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:
        raise StoreError(f"{path}: cannot read dataset file ({type(exc).__name__}: {exc}); "
                         "delete it so the workflow regenerates it") from exc
