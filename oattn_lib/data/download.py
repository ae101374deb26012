"""Downloads of the paper's datasets, checksummed and atomic.

`download` fetches a URL with pooch (`pooch.retrieve`): the body streams to a temporary
file next to the destination, its checksum is verified, and only then is it moved into
place, so an interrupted or corrupt download never leaves a file that looks complete.
`fetch_wikitext103` and `fetch_cifar10` download the public archives and unpack them with
pooch's processors (`pooch.Unzip`, `pooch.Untar`) into the layout `load_wikitext` and
`load_cifar10` read. Nothing in the library downloads implicitly; the workflow's download
rules call these.
"""
from __future__ import annotations

import ftplib
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Sequence
from urllib.parse import urlsplit

import pooch
import requests

__all__ = ["download", "fetch_wikitext103", "fetch_cifar10", "WIKITEXT103_URLS",
           "WIKITEXT103_MD5", "CIFAR10_URL", "CIFAR10_MD5"]

# The original host (Salesforce's S3 bucket) has answered 403 since 2024; the second
# URL is the mirror kept by the dataset's author. The checksum is the same for both.
WIKITEXT103_URLS = ("https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
                    "https://wikitext.smerity.com/wikitext-103-v1.zip")
WIKITEXT103_MD5 = "9ddaacaf6af0710eda8c456decff7832"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"

_CHUNK = 1 << 20
# some mirrors refuse a library's default agent ("python-requests/x.y")
_USER_AGENT = "Mozilla/5.0 (compatible; oattn-data)"


def _check_digest(value, name: str, length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(f"[0-9a-fA-F]{{{length}}}", value):
        raise ValueError(f"{name}: expected {length} hexadecimal digits, got {value!r}")
    return value.lower()


def _name(alg: str) -> str:
    return {"sha256": "SHA-256", "md5": "MD5"}[alg]


def _mismatches(path: Path, known: dict[str, str]) -> dict[str, str]:
    """The checksums of `path` that are not their `known` value (algorithm -> hex digest),
    each as a description."""
    out = {}
    for alg, want in known.items():
        got = pooch.file_hash(str(path), alg=alg)
        if got != want:
            out[alg] = f"{_name(alg)} {got}, expected {want}"
    return out


def _downloader(url: str, timeout: float, known: dict[str, str]):
    """pooch's downloader for `url`'s scheme (http, https or ftp; None for any other), with a
    progress bar, which then checks every checksum `known` (algorithm -> hex digest) of the
    temporary file: pooch verifies one before it moves a download into place, and a file
    failing any must not be moved. A mismatch is a ValueError, as pooch's own check raises."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        inner = pooch.HTTPDownloader(progressbar=True, chunk_size=_CHUNK, timeout=timeout,
                                     headers={"User-Agent": _USER_AGENT})
    elif scheme == "ftp":
        inner = pooch.FTPDownloader(progressbar=True, chunk_size=_CHUNK, timeout=timeout)
    else:
        return None

    def fetch(url, output_file, pup):
        inner(url, output_file, pup)
        bad = _mismatches(Path(output_file), known)
        if bad:
            raise ValueError(f"the download has {'; '.join(bad.values())}")

    return fetch


def download(url: str, dest: str | os.PathLike, sha256: str | None = None,
             md5: str | None = None, timeout: float = 60.0) -> Path:
    """Download `url` to `dest` and verify its checksum(s).

    Skipped when `dest` already exists and matches the given checksums (or when no
    checksum is given). Otherwise `pooch.retrieve` streams the body (http, https or ftp,
    with a progress bar on stderr) to a temporary file in dest's directory, which is
    checked, then moved over `dest`: `dest` is either absent or complete.

    Parameters
    ----------
    url : str
        Where to download from: an http, https or ftp URL.
    dest : str or PathLike
        The file to write (its directory is created).
    sha256, md5 : str, optional
        The expected checksums, hexadecimal; every one given must match.
    timeout : float
        Seconds to wait for the server to answer.

    Returns
    -------
    Path
        `dest`.

    Raises
    ------
    ValueError
        `url`, `dest` or a checksum is malformed.
    RuntimeError
        The transfer failed or the download does not match a checksum; the message names
        the URL and the destination, and nothing is left behind.
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"url: expected a non-empty str, got {url!r}")
    known = {alg: v for alg, v in (("sha256", _check_digest(sha256, "sha256", 64)),
                                    ("md5", _check_digest(md5, "md5", 32))) if v is not None}
    dest = Path(dest)
    if dest.is_dir():
        raise ValueError(f"dest: {str(dest)!r} is a directory; pass the path of the file to write")
    if dest.is_file() and not known:
        return dest
    manual = (f"Download it by other means and place it at {str(dest)!r}"
              + "".join(f" (its {_name(alg)} must be {v})" for alg, v in known.items()) + ".")
    # pooch verifies one checksum (the first given) and keeps an existing file that matches it
    primary = next(iter(known.items()), None)
    if dest.is_file():
        bad = _mismatches(dest, known)
        if not bad:
            return dest
        if primary[0] not in bad:
            raise RuntimeError(f"checksum mismatch for {str(dest)!r}: its {_name(primary[0])} matches but it has "
                               f"{'; '.join(bad.values())}: the checksums given disagree. {manual}")
        # an existing file with the wrong checksum is replaced by a fresh download

    downloader = _downloader(url, timeout, known)
    if downloader is None:
        raise RuntimeError(f"download of {url!r} to {str(dest)!r} failed: unsupported URL scheme "
                           f"{urlsplit(url).scheme or '(none)'!r} (http, https or ftp). {manual}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        pooch.retrieve(url, known_hash=None if primary is None else f"{primary[0]}:{primary[1]}",
                       fname=dest.name, path=dest.parent, downloader=downloader)
    except (requests.RequestException, OSError, *ftplib.all_errors) as exc:
        # before ValueError: some of requests' errors (a malformed URL) are ValueErrors too
        raise RuntimeError(f"download of {url!r} to {str(dest)!r} failed: {exc}. {manual}") from exc
    except ValueError as exc:  # pooch: a checksum does not match; the download was deleted
        raise RuntimeError(f"checksum mismatch for {url!r}: {exc}; it was discarded and "
                           f"{str(dest)!r} was not written. The file may be corrupt or changed "
                           f"upstream. {manual}") from exc
    return dest


def _check_member(name: str, archive: Path, top: str) -> None:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != top:
        raise RuntimeError(f"{str(archive)!r}: refusing to extract member {name!r}: every member "
                           f"must lie under {top}/; the archive is not the expected release")


def _install_tree(staging: Path, root: Path, top: str) -> None:
    """Move staging/top into root/top, file by file with os.replace."""
    src, dst = staging / top, root / top
    if not src.is_dir():
        raise RuntimeError(f"the archive holds no {top}/ directory; it is not the expected release")
    if not dst.exists():
        os.replace(src, dst)
        return
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            os.replace(path, target)


def _fetch(urls: Sequence[str], archive: Path, md5: str | None) -> None:
    if isinstance(urls, str):
        urls = (urls,)
    errors = []
    for url in urls:
        try:
            download(url, archive, md5=md5)
            return
        except RuntimeError as exc:
            errors.append(str(exc))
    raise RuntimeError("every source failed:\n  " + "\n  ".join(errors))


def _checked_members(archive: Path, top: str) -> None:
    """Refuse an archive with a member outside top/ or, in a tar, one that is not a regular
    file or directory (a link or a device): pooch's `Untar` filters members only from
    Python 3.12 on."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                _check_member(name, archive, top)
        return
    with tarfile.open(archive, "r:*") as tf:
        for member in tf.getmembers():
            _check_member(member.name, archive, top)
            if not (member.isfile() or member.isdir()):
                raise RuntimeError(f"{str(archive)!r}: refusing to extract {member.name!r}, which "
                                   "is not a regular file or directory")


def _unpack(archive: Path, root: Path, top: str) -> None:
    """Unpack `archive` (zip or tar) with pooch's processor into a staging directory beside
    it, then move its top/ into root/top: an interrupted extraction leaves nothing that
    looks complete at root/top."""
    processor = pooch.Unzip if archive.name.endswith(".zip") else pooch.Untar
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".extract-"))
    try:
        try:
            _checked_members(archive, top)
            # a processor is called as pooch.retrieve would after a download
            processor(extract_dir=str(staging))(str(archive), "download", None)
        except (zipfile.BadZipFile, tarfile.TarError) as exc:
            raise RuntimeError(f"{str(archive)!r} could not be extracted ({exc}); delete it and "
                               "fetch again") from exc
        _install_tree(staging, root, top)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_wikitext103(root: str | os.PathLike, urls: Sequence[str] = WIKITEXT103_URLS,
                      md5: str | None = WIKITEXT103_MD5) -> Path:
    """Download and unzip WikiText-103 (word level, v1) into ``root/wikitext-103``.

    Tries `urls` in order (the original release, then its author's mirror), verifying
    the archive's MD5, keeps the archive at ``root/wikitext-103-v1.zip`` and extracts
    the tokens files safely (every member must lie under wikitext-103/). Does nothing
    when the three ``wiki.*.tokens`` files are already there.

    Parameters
    ----------
    root : str or PathLike
        The data directory (the config's data_root).
    urls : sequence of str
        Sources of the archive, tried in order.
    md5 : str, optional
        The archive's MD5.

    Returns
    -------
    Path
        ``root/wikitext-103``.

    Raises
    ------
    RuntimeError
        Every source failed, or the archive is not the expected release.
    """
    from .text import WIKITEXT_FILES

    root = Path(root)
    target = root / "wikitext-103"
    if all((target / f).is_file() for f in WIKITEXT_FILES.values()):
        return target
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "wikitext-103-v1.zip"
    _fetch(urls, archive, md5)
    _unpack(archive, root, "wikitext-103")
    missing = [f for f in WIKITEXT_FILES.values() if not (target / f).is_file()]
    if missing:
        raise RuntimeError(f"{str(archive)!r} did not contain wikitext-103/{missing[0]}; it is not "
                           "the word-level WikiText-103 release (wikitext-103-v1.zip)")
    return target


def fetch_cifar10(root: str | os.PathLike, urls: Sequence[str] = (CIFAR10_URL,),
                  md5: str | None = CIFAR10_MD5) -> Path:
    """Download and untar CIFAR-10 (python version) into ``root/cifar-10-batches-py``.

    Verifies the archive's MD5, keeps it at ``root/cifar-10-python.tar.gz`` and
    extracts regular files and directories only, every one under cifar-10-batches-py/
    (no absolute paths, links or special files). Does nothing when the six batches are
    already there.

    Parameters
    ----------
    root : str or PathLike
        The data directory (the config's data_root).
    urls : sequence of str
        Sources of the archive, tried in order.
    md5 : str, optional
        The archive's MD5.

    Returns
    -------
    Path
        ``root/cifar-10-batches-py``.

    Raises
    ------
    RuntimeError
        Every source failed, or the archive is not the expected release.
    """
    root = Path(root)
    target = root / "cifar-10-batches-py"
    batches = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    if all((target / b).is_file() for b in batches):
        return target
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "cifar-10-python.tar.gz"
    _fetch(urls, archive, md5)
    _unpack(archive, root, "cifar-10-batches-py")
    missing = [b for b in batches if not (target / b).is_file()]
    if missing:
        raise RuntimeError(f"{str(archive)!r} did not contain cifar-10-batches-py/{missing[0]}; it "
                           "is not the CIFAR-10 python release")
    return target
