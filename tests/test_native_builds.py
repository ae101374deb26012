""".ci/native_builds.py: CI fails when installing the requirements would compile native code.

The check itself resolves the requirements with pip (network, in CI); here its verdict on a
source distribution is tested on archives built in memory, in both formats pip meets.
"""
from __future__ import annotations

import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("native_builds", REPO / ".ci" / "native_builds.py")
nb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nb)

PURE = {"pkg-1.0/pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n',
        "pkg-1.0/setup.py": "from setuptools import setup\nsetup(name='pkg', packages=['pkg'])\n",
        "pkg-1.0/pkg/__init__.py": "x = 1\n", "pkg-1.0/README.md": "a C compiler is not needed\n",
        # a vendored project's own setup.py with extensions is not this distribution's build
        "pkg-1.0/vendor/other/setup.py": "from setuptools import Extension\n"}


def _archive(files: dict[str, str], kind: str) -> tuple[bytes, str]:
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w") as z:
            for name, text in files.items():
                z.writestr(name, text)
        return buf.getvalue(), "pkg-1.0.zip"
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue(), "pkg-1.0.tar.gz"


def _reasons(files, kind):
    return nb.native_reasons(nb.archive_members(*_archive(files, kind)))


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_a_pure_python_sdist_passes(kind):
    assert _reasons(PURE, kind) == []


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
@pytest.mark.parametrize("extra, why", [
    ({"pkg-1.0/src/fast.c": "int f(void) { return 1; }\n"}, "native source"),
    ({"pkg-1.0/src/fast.pyx": "def f(): pass\n"}, "native source"),
    ({"pkg-1.0/Cargo.toml": "[package]\n"}, "native source"),
    ({"pkg-1.0/vendor/llama.cpp/CMakeLists.txt": "project(x)\n"}, "native source"),
    ({"pkg-1.0/pyproject.toml": '[build-system]\nbuild-backend = "scikit_build_core.build"\n'}, "build backend"),
    ({"pkg-1.0/pyproject.toml": "[build-system]\nbuild-backend = 'maturin'\n"}, "build backend"),
    ({"pkg-1.0/setup.py": "from setuptools import setup, Extension\nsetup(ext_modules=[Extension('m', ['m.c'])])\n"},
     "compiled extensions"),
])
def test_an_sdist_that_compiles_is_named_with_the_reason(kind, extra, why):
    reasons = _reasons({**PURE, **extra}, kind)
    assert len(reasons) >= 1 and why in " ".join(reasons), reasons
    assert any(Path(name).name in " ".join(reasons) for name in extra), reasons
