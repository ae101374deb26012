"""`pip install .` gives a working library: the wheel carries every file the library reads
at run time (the config schema; the explorer page's app.js and page.css), so an installed `oattn_lib`, with no clone beside it,
validates and completes a config.

The wheel is built from a copy of the source (a build in the working tree would leave
`build/` there and could pick up stale files from it) and installed into a temporary
environment made without pip, which reaches this environment's dependencies through a
`.pth` path line. The `.pth` files inside that directory (among them the editable install's
finder, which maps `oattn_lib` to the repository) are not processed, so the only
`oattn_lib` the child interpreter can import is the wheel's; the test checks that it did.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# the schema as the workflow sees it, read independently of the library
WORKFLOW_SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
PACKAGE_SCHEMA = REPO / "oattn_lib" / "schemas" / "config.schema.yaml"
# what the build reads: the top-level files (pyproject.toml, README.md, LICENSE) and these
SOURCE_DIRS = ("oattn_lib", "workflow")

CHILD = """
import json, sys
import oattn_lib
from oattn_lib.config import SCHEMA, complete_model
model = complete_model({"name": "t", "kind": "txl", "arch": {"n_layer": 2}}, entropy={"head_top_k": 16})
print(json.dumps({"file": oattn_lib.__file__, "schema": str(SCHEMA), "model": model,
                  "editable": sorted(m for m in sys.modules if m.startswith("__editable__"))}))
"""


def _run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _copy_source(dest: Path) -> Path:
    dest.mkdir()
    for p in REPO.iterdir():
        if p.is_file() or p.is_symlink():
            shutil.copy2(p, dest / p.name, follow_symlinks=False)
    for name in SOURCE_DIRS:
        shutil.copytree(REPO / name, dest / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def test_the_workflow_schema_is_a_link_to_the_package_schema():
    # one file, two names: an editor that saves by renaming would replace the link with a copy
    assert WORKFLOW_SCHEMA.is_symlink(), f"{WORKFLOW_SCHEMA} must stay a link to {PACKAGE_SCHEMA}"
    assert not Path(os.readlink(WORKFLOW_SCHEMA)).is_absolute()  # a clone anywhere resolves it
    assert WORKFLOW_SCHEMA.resolve() == PACKAGE_SCHEMA.resolve() and PACKAGE_SCHEMA.is_file()
    assert not PACKAGE_SCHEMA.is_symlink()


@pytest.mark.packaging
def test_wheel_installs_a_library_that_completes_a_config(tmp_path):
    pytest.importorskip("setuptools", minversion="77", reason="building the wheel offline needs setuptools>=77 "
                        "in this environment (pyproject's build-system)")
    src = _copy_source(tmp_path / "src")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", dist, src])
    (wheel,) = dist.glob("oattn-*.whl")

    # the wheel holds the schema's contents (not a link) and the licence
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert zf.read("oattn_lib/schemas/config.schema.yaml") == WORKFLOW_SCHEMA.read_bytes()
        # the explorer page's script and style sheet, which the page builder reads at run time
        for asset in ("oattn_lib/explorer/app.js", "oattn_lib/explorer/page.css"):
            assert zf.read(asset) == (REPO / asset).read_bytes(), asset
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names

    env = tmp_path / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", env])
    python = env / "bin" / "python"
    site = Path(_run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (site / "oattn_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
          "--target", site, wheel])

    elsewhere = tmp_path / "elsewhere"  # a working directory outside the repository
    elsewhere.mkdir()
    # -I: no PYTHONPATH, no user site, no working directory on sys.path
    out = json.loads(_run([python, "-I", "-c", CHILD], cwd=elsewhere).strip().splitlines()[-1])

    # (a) the wheel's library ran, not the repository's
    lib = Path(out["file"]).resolve()
    assert lib.is_relative_to(site.resolve()), lib
    assert not lib.is_relative_to(REPO), lib
    assert out["editable"] == []
    schema = Path(out["schema"])
    assert schema.is_relative_to(site.resolve()) and schema.is_file() and not schema.is_symlink()

    # (b) the schema's defaults were filled in around the keys given
    defs = yaml.safe_load(WORKFLOW_SCHEMA.read_text())["$defs"]
    model = out["model"]
    assert model["arch"]["n_layer"] == 2
    for section, ref, keys in (("extract", "extract", ("n_samples", "max_length", "dtype", "quantity")),
                               ("arch", "txl_arch", ("n_head", "d_model", "tgt_len")),
                               ("train", "txl_train", ("steps", "lr")),
                               ("data", "text_data", ("corpus", "max_size"))):
        for key in keys:
            assert model[section][key] == defs[ref]["properties"][key]["default"], (section, key)


def _declared_dependencies(extras: bool = False) -> dict[str, "object"]:
    """pyproject's dependencies by distribution name; `extras`: its optional extras' too."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    if extras:
        lines += [r for group in project.get("optional-dependencies", {}).values() for r in group]
    reqs = [Requirement(r) for r in lines]
    return {r.name.lower().replace("_", "-"): r for r in reqs}


def _imported_distributions(top_level: bool = False) -> dict[str, set[str]]:
    """The distributions whose modules oattn_lib and scripts/ import (the standard library and
    oattn_lib left out): {distribution: the files importing it}; `top_level`: only the imports
    at a module's top level (unindented), which run when the module is imported. Import
    statements are read by their lines (a regular expression: parsing every module takes most
    of a second)."""
    import re

    # import names that are not their distribution's (importlib.metadata.packages_distributions
    # would find them, reading every installed distribution's file list)
    owners = {"sklearn": ["scikit-learn"], "yaml": ["PyYAML"]}
    statement = re.compile(("^" if top_level else r"^[ \t]*") + r"(?:import[ \t]+([A-Za-z_]\w*)[\w.]*(?=[ \t]*(?:$|,|#|as\b))|from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b)",
                           re.M)
    found: dict[str, set[str]] = {}
    for path in [*(REPO / "oattn_lib").rglob("*.py"), *(REPO / "scripts").glob("*.py")]:
        for top in {a or b for a, b in statement.findall(path.read_text())}:
            if top in sys.stdlib_module_names or top == "oattn_lib":
                continue
            for dist in owners.get(top, [top]):
                found.setdefault(dist.lower().replace("_", "-"), set()).add(str(path.relative_to(REPO)))
    return found


def test_every_import_is_a_declared_dependency_and_every_pin_lies_in_its_range():
    """`pip install` of the library brings what its code imports: every distribution imported by
    oattn_lib or a job script is in pyproject's dependencies or, imported inside the functions
    that need it, in one of its optional extras, and the versions tested together
    (requirements.txt's pins, else the installed one) satisfy the declared ranges."""
    import importlib.metadata
    import re

    required = _declared_dependencies()
    declared = _declared_dependencies(extras=True)
    missing = {d: sorted(files)[:3] for d, files in _imported_distributions().items() if d not in declared}
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"
    # a distribution of an optional extra only (`pip install 'oattn[lens]'`) is imported inside
    # the functions that need it, so that the library imports without it
    eager = {d: sorted(files)[:3] for d, files in _imported_distributions(top_level=True).items()
             if d not in required}
    assert not eager, f"imported at a module's top level but only in an optional extra: {eager}"
    pins = {}
    for line in ((REPO / "requirements.txt").read_text() + (REPO / "requirements-extras.txt").read_text()).splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.split("#")[0].strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    outside = {}
    for name, req in declared.items():
        version = pins.get(name) or importlib.metadata.version(name)
        if not req.specifier.contains(version, prereleases=True):
            outside[name] = f"{version} not in {req.specifier}"
    assert not outside, f"tested versions outside the declared ranges: {outside}"
