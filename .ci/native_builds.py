#!/usr/bin/env python3
"""Fail when installing the project's requirements would compile native code.

A new user's `make run` must not need a compiler: every requirement installs from a wheel,
or from a source distribution holding only Python (snakemake's `connection_pool` ships as
one). This resolves each requirements file exactly as the Makefile installs it (pip's own
resolver, `--dry-run --report`, so the same index, constraints and platform), then opens
every source distribution the resolution picked and fails, naming the package and the
files, when it holds C/C++/CUDA/Fortran/Cython/Rust sources or uses a build backend that
compiles (scikit-build-core, maturin, meson-python, setuptools-rust, CMake).

    python .ci/native_builds.py requirements.txt --no-deps requirements-data.txt

Exit status 0: nothing to compile; 1: a native build, listed; 2: the resolution failed.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import PurePosixPath

NATIVE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".m", ".mm", ".f", ".f77", ".f90", ".f95",
                   ".for", ".pyx", ".pxd", ".rs", ".go", ".zig", ".asm", ".s"}
NATIVE_FILES = {"cmakelists.txt", "cargo.toml", "meson.build", "build.zig", "configure.ac", "makefile.am"}
NATIVE_BACKENDS = ("scikit_build_core", "skbuild", "maturin", "mesonpy", "setuptools_rust", "py_build_cmake",
                   "cmake_build_extension", "enscons")
# setup.py lines that declare compiled extensions (setuptools / distutils)
EXTENSION_CALL = re.compile(r"\b(Extension|ext_modules|cythonize|CMakeExtension|RustExtension|Pybind11Extension)\b")


def archive_members(data: bytes, name: str) -> dict[str, bytes | None]:
    """Member path -> contents for the small text files the check reads (pyproject.toml,
    setup.py), None for the others, of a .tar.gz/.tar.bz2/.tgz/.zip source distribution."""
    keep = {"pyproject.toml", "setup.py"}
    out: dict[str, bytes | None] = {}
    if name.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                if not info.is_dir():
                    base = PurePosixPath(info.filename).name
                    out[info.filename] = z.read(info) if base in keep else None
        return out
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
        for m in t.getmembers():
            if m.isfile():
                base = PurePosixPath(m.name).name
                f = t.extractfile(m) if base in keep else None
                out[m.name] = f.read() if f is not None else None
    return out


def native_reasons(members: dict[str, bytes | None]) -> list[str]:
    """Why a source distribution with these members would compile native code ([] if it would not)."""
    reasons = []
    sources = sorted(p for p in members
                     if PurePosixPath(p).suffix.lower() in NATIVE_SUFFIXES
                     or PurePosixPath(p).name.lower() in NATIVE_FILES)
    if sources:
        more = f" and {len(sources) - 5} more" if len(sources) > 5 else ""
        reasons.append(f"{len(sources)} native source/build files ({', '.join(sources[:5])}{more})")
    for path, text in members.items():
        if text is None:
            continue
        # only the distribution's own top-level files (a vendored project's setup.py is not the build)
        if len(PurePosixPath(path).parts) > 2:
            continue
        s = text.decode("utf-8", "replace")
        if path.endswith("pyproject.toml"):
            m = re.search(r"""build-backend\s*=\s*["']([^"']+)["']""", s)
            if m and m.group(1).split(".")[0] in NATIVE_BACKENDS:
                reasons.append(f"build backend {m.group(1)!r} ({path})")
        elif path.endswith("setup.py") and EXTENSION_CALL.search(s):
            reasons.append(f"setup.py declares compiled extensions ({EXTENSION_CALL.search(s).group(1)}, {path})")
    return reasons


def resolve(requirements: str, no_deps: bool, pip: list[str]) -> list[dict]:
    """pip's resolution of a requirements file, as it would be installed into a fresh environment."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", report,
               "-r", requirements] + (["--no-deps"] if no_deps else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            print(f"{requirements}: pip could not resolve it ({' '.join(cmd)})", file=sys.stderr)
            sys.exit(2)
        with open(report) as f:
            return json.load(f)["install"]


def fetch(info: dict) -> bytes:
    """The archive a resolution item points to, its hash checked."""
    url = info["download_info"]["url"]
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read()
    hashes = info["download_info"].get("archive_info", {}).get("hashes", {})
    if "sha256" in hashes and hashlib.sha256(data).hexdigest() != hashes["sha256"]:
        raise RuntimeError(f"{url}: sha256 does not match pip's report")
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requirements", nargs="*", help="requirements files resolved with their dependencies")
    ap.add_argument("--no-deps", action="append", default=[], metavar="FILE",
                    help="requirements files installed with --no-deps (as the Makefile does)")
    ap.add_argument("--pip", default=f"{sys.executable} -m pip", help="the pip command (default: this Python's)")
    args = ap.parse_args(argv)
    pip = args.pip.split()
    failed = []
    n_wheels = n_sdists = 0
    for path, no_deps in [(p, False) for p in args.requirements] + [(p, True) for p in args.no_deps]:
        for info in resolve(path, no_deps, pip):
            name, version = info["metadata"]["name"], info["metadata"]["version"]
            url = info["download_info"]["url"]
            if url.endswith(".whl"):
                n_wheels += 1
                continue
            n_sdists += 1
            fname = url.rsplit("/", 1)[-1]
            reasons = native_reasons(archive_members(fetch(info), fname))
            verdict = "; ".join(reasons) if reasons else "pure Python"
            print(f"{path}: {name} {version} is a source distribution ({fname}): {verdict}")
            if reasons:
                failed.append(f"{name} {version} (from {path})")
    if failed:
        print("FAILED: installing the requirements would compile native code for: " + ", ".join(failed)
              + ". Pin a version with a wheel for this platform, or install the package with --no-deps "
              "(requirements-data.txt) if the project never imports it.")
        return 1
    print(f"OK: {n_wheels} wheels, {n_sdists} pure-Python source distributions, nothing to compile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
