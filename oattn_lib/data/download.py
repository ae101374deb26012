"""Downloads of the paper's datasets, checksummed and atomic.

`download` streams a URL to a temporary file next to the destination, verifies its
checksum, then renames it into place: an interrupted or corrupt download never leaves
a file that looks complete. `fetch_wikitext103` and `fetch_cifar10` download and
extract the public archives into the layout `load_wikitext` and `load_cifar10` read.
Nothing in the library downloads implicitly; the workflow's download rules call these.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Sequence

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
# some mirrors refuse urllib's default "Python-urllib/x.y" agent
_USER_AGENT = "Mozilla/5.0 (compatible; oattn-data/0.1)"


def _check_digest(value, name: str, length: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(f"[0-9a-fA-F]{{{length}}}", value):
        raise ValueError(f"{name}: expected {length} hexadecimal digits, got {value!r}")
    return value.lower()


def _digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def _mismatch(sha_got: str, md5_got: str, sha256: str | None, md5: str | None) -> str | None:
    """A description of the first checksum that does not match, or None."""
    if sha256 is not None and sha_got != sha256:
        return f"SHA-256 {sha_got}, expected {sha256}"
    if md5 is not None and md5_got != md5:
        return f"MD5 {md5_got}, expected {md5}"
    return None


def download(url: str, dest: str | os.PathLike, sha256: str | None = None,
             md5: str | None = None, timeout: float = 60.0) -> Path:
    """Download `url` to `dest` and verify its checksum(s); return `dest` as a Path.

    Skipped when `dest` already exists and matches the given checksums (or when no
    checksum is given). The body is streamed to a temporary file in dest's directory,
    checked, then renamed over `dest` (os.replace), so `dest` is either absent or
    complete. Raises RuntimeError naming the URL and the destination when the transfer
    fails or the checksum does not match; nothing is left behind in either case.
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"url: expected a non-empty str, got {url!r}")
    sha256 = _check_digest(sha256, "sha256", 64)
    md5 = _check_digest(md5, "md5", 32)
    dest = Path(dest)
    if dest.is_dir():
        raise ValueError(f"dest: {str(dest)!r} is a directory; pass the path of the file to write")

    if dest.is_file():
        if sha256 is None and md5 is None:
            return dest
        if _mismatch(*_digests(dest), sha256, md5) is None:
            return dest
        # an existing file with the wrong checksum is replaced by a fresh download

    manual = (f"Download it by other means and place it at {str(dest)!r}"
              + (f" (its SHA-256 must be {sha256})" if sha256 else "")
              + (f" (its MD5 must be {md5})" if md5 else "") + ".")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        sha, dig_md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out:
            try:
                request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
                with urllib.request.urlopen(request, timeout=timeout) as resp:
                    while chunk := resp.read(_CHUNK):
                        out.write(chunk)
                        sha.update(chunk)
                        dig_md5.update(chunk)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                # URLError/HTTPError/timeouts are OSErrors; ValueError: malformed URL
                raise RuntimeError(f"download of {url!r} to {str(dest)!r} failed: {exc}. "
                                   f"{manual}") from exc
        bad = _mismatch(sha.hexdigest(), dig_md5.hexdigest(), sha256, md5)
        if bad is not None:
            raise RuntimeError(f"checksum mismatch for {url!r}: the download has {bad}; it was "
                               f"discarded and {str(dest)!r} was not written. The file may be "
                               f"corrupt or changed upstream. {manual}")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
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


def fetch_wikitext103(root: str | os.PathLike, urls: Sequence[str] = WIKITEXT103_URLS,
                      md5: str | None = WIKITEXT103_MD5) -> Path:
    """Download and unzip WikiText-103 (word level, v1) into ``root/wikitext-103``.

    Tries `urls` in order (the original release, then its author's mirror), verifying
    the archive's MD5, keeps the archive at ``root/wikitext-103-v1.zip`` and extracts
    the tokens files safely (every member must lie under wikitext-103/). Does nothing
    when the three ``wiki.*.tokens`` files are already there. Returns the directory.
    """
    from .text import WIKITEXT_FILES

    root = Path(root)
    target = root / "wikitext-103"
    if all((target / f).is_file() for f in WIKITEXT_FILES.values()):
        return target
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "wikitext-103-v1.zip"
    _fetch(urls, archive, md5)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".extract-"))
    try:
        try:
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    _check_member(name, archive, "wikitext-103")
                zf.extractall(staging)
        except zipfile.BadZipFile as exc:
            raise RuntimeError(f"{str(archive)!r} is not a zip archive ({exc}); delete it and "
                               "fetch again") from exc
        _install_tree(staging, root, "wikitext-103")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    missing = [f for f in WIKITEXT_FILES.values() if not (target / f).is_file()]
    if missing:
        raise RuntimeError(f"{str(archive)!r} did not contain wikitext-103/{missing[0]}; it is not "
                           "the word-level WikiText-103 release (wikitext-103-v1.zip)")
    return target


def fetch_cifar10(root: str | os.PathLike, urls: Sequence[str] = (CIFAR10_URL,),
                  md5: str | None = CIFAR10_MD5) -> Path:
    """Download and untar CIFAR-10 (python version) into ``root/cifar-10-batches-py``.

    Verifies the archive's MD5, keeps it at ``root/cifar-10-python.tar.gz`` and
    extracts with tarfile's "data" filter (no absolute paths, links out of the tree or
    special files; every member must lie under cifar-10-batches-py/). Does nothing when
    the six batches are already there. Returns the directory.
    """
    root = Path(root)
    target = root / "cifar-10-batches-py"
    batches = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    if all((target / b).is_file() for b in batches):
        return target
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "cifar-10-python.tar.gz"
    _fetch(urls, archive, md5)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".extract-"))
    try:
        try:
            with tarfile.open(archive, "r:*") as tf:
                members = tf.getmembers()
                for member in members:
                    _check_member(member.name, archive, "cifar-10-batches-py")
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(staging, filter="data")
                else:  # Python < 3.11.4: no extraction filters; allow plain files and dirs only
                    bad = next((m.name for m in members if not (m.isfile() or m.isdir())), None)
                    if bad is not None:
                        raise RuntimeError(f"{str(archive)!r}: refusing to extract {bad!r}, which "
                                           "is not a regular file or directory")
                    tf.extractall(staging)
        except tarfile.TarError as exc:
            raise RuntimeError(f"{str(archive)!r} could not be extracted ({exc}); delete it and "
                               "fetch again") from exc
        _install_tree(staging, root, "cifar-10-batches-py")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    missing = [b for b in batches if not (target / b).is_file()]
    if missing:
        raise RuntimeError(f"{str(archive)!r} did not contain cifar-10-batches-py/{missing[0]}; it "
                           "is not the CIFAR-10 python release")
    return target
