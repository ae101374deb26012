"""oattn from the user's own directory: the workflow as a Snakemake module of the user's workflow
(docs/how-to/own-directory.md), declared by hand or written by snakedeploy.

The user's directory holds only their Snakefile and config; every file of oattn's own (schema,
scripts, captions, prompts, library) is found from oattn's Snakefile, the results are written
where the user runs snakemake.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from wfutil import REPO, TINY, by_stage, planned_jobs, run_snakemake

pytestmark = pytest.mark.workflow

USER_SNAKEFILE = """\
configfile: "config/config.yaml"


module oattn:
    snakefile:
        {snakefile!r}
    config:
        config


use rule * from oattn{rename}
"""
# the README's `entropy: {head_top_k: 100}` change, made in the user's own config: the stages from
# the entropies on, never training, extraction or the expansions
ENTROPY_RERUNS = {"entropy", "masked_other", "organize2d", "stability", "tables", "heads", "figures", "prune", "explorer",
                  "explorer_index", "summary", "all"}


def user_project(root: Path, snakefile: Path, config: dict, rename: str = "") -> Path:
    """The user's directory: workflow/Snakefile declaring oattn as a module (snakedeploy's layout)
    and config/config.yaml, nothing else."""
    (root / "workflow").mkdir(parents=True)
    (root / "config").mkdir()
    (root / "workflow" / "Snakefile").write_text(USER_SNAKEFILE.format(snakefile=str(snakefile), rename=rename))
    (root / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def snakemake_in(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """snakemake as the user types it in their directory (their workflow/Snakefile found by
    Snakemake's own search), as a subprocess or a forked command."""
    return run_snakemake(["--cores", "2", *args], cwd=root, timeout=timeout)


def plan(root: Path, *args: str) -> dict[str, int]:
    proc = snakemake_in(root, "-n", *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return planned_jobs(proc)


def unprefixed(jobs: dict[str, int], prefix: str) -> dict[str, int]:
    assert all(rule.startswith(prefix) for rule in jobs), jobs
    return {rule[len(prefix):]: n for rule, n in jobs.items()}


def source_tree(dest: Path) -> Path:
    """A copy of the project's files as a clone has them (tracked and new, not ignored: no
    .venv, no results), committed to a repository of its own: a user's local clone of oattn."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if not (src.exists() or src.is_symlink()):  # deleted in the work tree, not yet committed
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(src.readlink())
        else:
            shutil.copy2(src, target)
    # a repository of its own, as a user's clone is (its ignored files, such as .venv, left out of
    # what a clone of it holds)
    git = ["git", "-c", "user.name=oattn", "-c", "user.email=oattn@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the working tree"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    return dest


@pytest.fixture(scope="module")
def module_project(clean_run, tmp_path_factory):
    """The user's directory, oattn a module from this repository, holding the results and
    Snakemake's records of the tiny run made from the clone (`clean_run`)."""
    root = user_project(tmp_path_factory.mktemp("analysis"), REPO / "workflow" / "Snakefile", TINY)
    shutil.copytree(clean_run / "results", root / "results")
    shutil.copytree(clean_run / ".snakemake", root / ".snakemake",
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    return root


def test_a_module_in_the_users_directory_plans_what_the_clone_planned(module_project):
    """The module computes every job's params, code fingerprints and inputs as the clone did: after
    the clone's run, nothing; after one change in the user's config, the stages it affects only,
    under the rule names the user gave them too."""
    assert plan(module_project) == {}
    config = module_project / "config" / "config.yaml"
    changed = {**TINY, "entropy": {**TINY.get("entropy", {}), "head_top_k": 100}}
    config.write_text(yaml.safe_dump(changed))
    try:
        assert set(by_stage(plan(module_project))) == ENTROPY_RERUNS
        snakefile = module_project / "workflow" / "Snakefile"
        snakefile.write_text(snakefile.read_text().replace("from oattn\n", "from oattn as oattn_*\n"))
        # with the code trigger off, each rule's recorded code is read under its prefixed name
        for args in ((), ("--rerun-triggers", "mtime", "params", "input")):
            assert set(by_stage(unprefixed(plan(module_project, *args), "oattn_"))) == ENTROPY_RERUNS
    finally:
        config.write_text(yaml.safe_dump(TINY))
        snakefile.write_text(snakefile.read_text().replace("from oattn as oattn_*\n", "from oattn\n"))


HOWTO = REPO / "docs" / "how-to" / "own-directory.md"
# the embedded default, as planned from an empty directory: its three models trained or prepared,
# analysed and reported
DEFAULT_PLAN = {"train": 2, "prepare_model": 1, "summary": 1, "explorer_index": 1, "all": 1}


def run_howto_block(index: int, tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The how-to's `index`-th bash block as typed, in `tmp_path` holding `oattn/` (a copy of the
    project, its `.venv` this environment): the lines before its last two (`cd my-analysis`, the
    run) in bash, then that run as a dry run in my-analysis/."""
    blocks = re.findall(r"```bash\n(.*?)```", HOWTO.read_text(), re.S)
    lines = blocks[index].strip().splitlines()
    assert lines[-2:] == ["cd my-analysis", "../oattn/.venv/bin/snakemake --cores 2"], lines[-2:]
    clone = source_tree(tmp_path / "oattn")
    (clone / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    setup = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines[:-2])], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-2000:]
    user = tmp_path / "my-analysis"
    return user, setup


def test_the_howto_by_hand_runs_from_a_directory_holding_nothing_of_oattn(tmp_path):
    """docs/how-to/own-directory.md's module declared by hand: planned from the user's directory,
    where oattn's schema, scripts and captions resolve from oattn's Snakefile; a bad key is still
    refused at start-up naming it; nothing but Snakemake's records is written before a run."""
    user, _ = run_howto_block(0, tmp_path)
    assert (user / "config" / "config.yaml").read_text() == (REPO / "config.yaml").read_text()
    jobs = by_stage(plan(user))
    assert DEFAULT_PLAN.items() <= jobs.items(), jobs
    assert sorted(p.name for p in user.iterdir()) == [".snakemake", "config", "workflow"]
    config = yaml.safe_load((user / "config" / "config.yaml").read_text())
    (user / "config" / "config.yaml").write_text(yaml.safe_dump({**config, "entropy": {"head_top_k": -1}}))
    proc = snakemake_in(user, "-n")
    assert proc.returncode != 0 and re.search(r"entropy\.head_top_k", proc.stdout + proc.stderr), proc.stderr[-2000:]


def test_the_howto_with_snakedeploy_deploys_the_catalog_layout(tmp_path):
    """`snakedeploy deploy-workflow` on a local clone, as the how-to types it: it finds the catalog's
    layout (workflow/Snakefile, config/config.yaml: the embedded default) and writes the module,
    whose path relative to the clone the how-to's one `sed` line makes point at it; the result plans
    what the module declared by hand plans."""
    user, setup = run_howto_block(1, tmp_path)
    assert "not found in traditional path" not in setup.stdout + setup.stderr
    assert (user / "config" / "config.yaml").read_text() == (REPO / "config.yaml").read_text()
    assert re.search(r'snakefile:\s*"\.\./\.\./oattn/workflow/Snakefile"', (user / "workflow" / "Snakefile").read_text())
    jobs = by_stage(plan(user))
    assert DEFAULT_PLAN.items() <= jobs.items(), jobs


@pytest.mark.slow
def test_the_tiny_config_runs_as_a_module_from_an_empty_directory(tmp_path):
    """The real run, from a user's empty directory, of a local copy of oattn that is not the
    library the environment has installed (guarded fast by
    test_a_module_in_the_users_directory_plans_what_the_clone_planned): every job runs the copy's
    own library, writes under the user's results/, and nothing inside the copy."""
    oattn = source_tree(tmp_path / "oattn")
    init = oattn / "oattn_lib" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "([^"]+)"', r'__version__ = "\1+copy"', init.read_text()))
    version = re.search(r'__version__ = "([^"]+)"', init.read_text()).group(1)
    root = user_project(tmp_path / "analysis", oattn / "workflow" / "Snakefile", TINY)
    proc = snakemake_in(root, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    assert (root / "results" / "summary.md").is_file()
    assert [p.name for p in (oattn / "results").iterdir()] == [".gitkeep"] and not (oattn / ".snakemake").exists()
    import zarr

    stores = sorted((root / "results").rglob("*.zarr"))
    assert stores
    versions = {str(s.relative_to(root)): zarr.open_group(s, mode="r", use_consolidated=False).attrs.get("oattn_version")
                for s in stores}
    assert set(versions.values()) == {version}, versions
    config = root / "config" / "config.yaml"
    config.write_text(yaml.safe_dump({**TINY, "entropy": {**TINY.get("entropy", {}), "head_top_k": 100}}))
    assert set(by_stage(plan(root))) == ENTROPY_RERUNS
