"""Reruns as a user meets them: the documentation's own commands, key order, code edits.

Every test works on a copy of the project (Snakefile, workflow/, scripts/, oattn_lib/,
README.md) holding the results of one completed run of the tiny config (`clean_run`), with
the tiny config as its `config.yaml` and the files the docs pages tell the reader to save
(their titled code blocks), so that the commands of the README and of every docs page run
exactly as typed.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr
import yaml
from doc_pages import code_blocks, doc_pages, titled_files, without_code_blocks

from wfutil import REPO, TINY, by_stage, planned_jobs, reordered, run_snakemake

pytestmark = pytest.mark.workflow

# txl and vit (tiny) analyse both samples in one job per stage (organize_batch_txl, ...), lm one
# job per sample (jobs.batch_max_entries in the test config), and its page is planned and its
# samples encoded by jobs of their own (explorer_plan, explorer_samples); txl's one replicated
# sample is its batch's stability_sample job, lm's two get one each
ANALYSIS_AFTER_ORGANIZE = {"organize_batch_txl": 1, "organize_batch_vit": 1, "organize": 2,
                           "decompose_batch_txl": 1, "decompose_batch_vit": 1, "decompose": 2, "entropy": 3,
                           "organize2d_batch_txl": 1, "organize2d_batch_vit": 1, "organize2d": 2, "stability_sample_batch_txl": 1,
                           "stability_sample": 2, "stability": 2, "tables": 3, "heads": 3, "figures": 3, "prune": 3, "explorer_plan": 1,
                           "explorer_samples": 2,
                           "explorer": 3, "explorer_index": 1, "summary": 1, "all": 1,
                           # txl analyses scores: its expansions again under the other masked rule
                           "masked_other_batch_txl": 1}
# theorem1 reads no organization (each head gets its own 2-D one), but runs the 2-D questionnaire
AFTER_QUESTIONNAIRE_EDIT = {**ANALYSIS_AFTER_ORGANIZE, "theorem1": 3}
# txl's own jobs from organize on (organize2d reads its decomposed figure heads), one each
MASKED_RULE_RERUNS = {"organize_batch_txl": 1, "decompose_batch_txl": 1, "entropy": 1, "organize2d_batch_txl": 1,
                      "stability_sample_batch_txl": 1, "stability": 1, "tables": 1, "heads": 1, "figures": 1, "prune": 1,
                      "explorer": 1,
                      "explorer_index": 1, "summary": 1, "all": 1,
                      # the claims' analysis under the other rule: now row_mean, a new one
                      "masked_other_batch_txl": 1}


@pytest.fixture(scope="module")
def project(clean_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    for name in ("Snakefile", "README.md"):
        shutil.copy2(REPO / name, root / name)
    for name in ("workflow", "scripts", "oattn_lib"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(clean_run / "results", root / "results")
    shutil.copytree(clean_run / ".snakemake", root / ".snakemake",
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    # the config clean_run ran with (other tests write theirs into its directory)
    (root / "config.yaml").write_text(yaml.safe_dump(TINY))
    # the files a page tells the reader to save (the tutorial's prompts and config), never over
    # one of the project's own
    for name, body in titled_files().items():
        if not (root / name).exists():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(body)
    return root


def run(project: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """A snakemake command line as a user types it, as a dry run, in `project`."""
    if argv[0] not in ("snakemake", ".venv/bin/snakemake"):
        raise ValueError(f"not a snakemake command: {argv}")
    argv = [sys.executable, "-m", "snakemake", *argv[1:]]
    if "-n" not in argv:
        argv.append("-n")
    return run_snakemake(argv[3:], cwd=project, timeout=600)


def dry_run(project: Path, *args: str) -> dict[str, int]:
    proc = run(project, ["snakemake", "--cores", "2", *args])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return planned_jobs(proc)


# -- the commands of the README and the docs pages --------------------------------------------
# the workflow's rules, read from the rule files (a page naming a rule that does not exist fails):
# `rule X:`, and a per-sample stage's rule made by the loop over `stage_rules("X", ...)`
RULES = {name for f in (REPO / "workflow" / "rules").glob("*.smk")
         for found in re.findall(r"^rule (\w+):|^for _rule in stage_rules\(\"(\w+)\"(?![^\n]*per_sample=False)",
                                 f.read_text(), re.M) for name in found if name}


def readme_commands(text: str) -> list[tuple[str, set[str] | None]]:
    """Every snakemake command a page shows (inline or in a code block), each with the rules
    the page says it reruns: `reruns a, b and c only` -> {a, b, c, all}; `plans nothing` ->
    empty; None where the page makes no such claim."""
    found, blocks, text = [], code_blocks(text, "bash"), without_code_blocks(text)
    for m in re.finditer(r"`((?:\.venv/bin/)?snakemake\b[^`\n]*)`", text):
        rest = text[m.end():m.end() + 400]
        claim_text = re.split(r"\n\s*\n|\n- |(?<=\.)\s", rest, maxsplit=1)[0]
        claim = None
        if re.search(r"\bplans\s+nothing\b", claim_text):
            claim = set()
        elif (r := re.search(r"\breruns\s+(.*?)\s+only\b", claim_text, re.S)):
            names = set(re.split(r",\s*|\s+and\s+", re.sub(r"\s+", " ", r.group(1)).strip()))
            unknown = names - RULES
            assert not unknown, f"a page claims reruns of unknown rules {unknown} after `{m.group(1)}`"
            claim = names | {"all"}
        found.append((m.group(1), claim))
    for _, _, block in blocks:
        for line in block.splitlines():
            cmd = line.split("#")[0].strip()
            if re.match(r"(\.venv/bin/)?snakemake\b", cmd):
                found.append((cmd, None))
    return found


def _dry_key(command: str) -> tuple[str, ...]:
    """A command as its dry run: shown with `-n` or without, it is one dry run."""
    return tuple(a for a in shlex.split(command) if a != "-n")


def doc_commands() -> list[tuple[str, set[str] | None]]:
    """The commands of the README and of every docs page, each dry run once (a command shown
    on two pages, or with and without `-n`, is one), with the claim a page makes about it."""
    found: dict[tuple[str, ...], tuple[str, set[str] | None]] = {}
    for page in doc_pages():
        for command, claim in readme_commands(page.read_text(encoding="utf-8")):
            shown, known = found.get(_dry_key(command), (command, None))
            assert None in (claim, known) or claim == known, f"`{command}`: two pages claim {claim} and {known}"
            # shown as the page that makes a claim about it shows it
            found[_dry_key(command)] = (shown, known) if claim is None else (command, claim)
    return list(found.values())


def test_doc_commands_are_found():
    cmds = doc_commands()
    text = " ".join(c for c, _ in cmds)
    for needle in ("entropy='{head_top_k: 100}'", "organize='{n_iters: 2}'", "softmax_free",
                   "--rerun-triggers mtime params input", "workflow/profiles/slurm", "workflow/presets/llm.yaml",
                   "workflow/presets/prompts.yaml", "workflow/presets/llm4k.yaml", "--configfile my-prompts.yaml"):
        assert needle in text
    claims = dict(cmds)
    assert claims["snakemake -n"] == set()
    assert sum(c is not None for _, c in cmds) >= 4
    # what the pages tell the reader to save is there for the commands that read it
    assert {"my-prompts.yaml", "my-prompts.txt"} <= set(titled_files())


@pytest.mark.parametrize("command, claim", doc_commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_doc_command_runs_and_plans_what_the_page_says(project, command, claim):
    proc = run(project, shlex.split(command))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command}` failed:\n{out[-4000:]}"
    assert "localrules directive specifies rules that are not present" not in out
    planned = planned_jobs(proc)
    if claim is not None:
        # the pages name stages: a model's one job for all its samples counts for its stage
        assert set(by_stage(planned)) == claim, f"`{command}` planned {planned}; the page says {sorted(claim)}"
    if "softmax_free" in shlex.split(command):
        # its own trainings and their analysis: never the workflow's models again
        assert planned.get("softmax_free_train", 0) > 0 and "train" not in planned
        models = set(re.findall(r"wildcards: model=([^,\s]+)", out))
        assert models and all(m.startswith("softmax_free/") for m in models), models
    if "workflow/presets/paper.yaml" in command:
        assert {"train", "extract", "organize", "decompose"} <= set(planned)
    if "workflow/presets/llm.yaml" in command:
        # one GGUF model, dequantised once, 10 samples of 1024 tokens, nothing trained
        assert planned.get("prepare_model") == 1 and "train" not in planned
        assert planned["extract"] == planned["organize"] == planned["decompose"] == 10
        assert "results/llm/smollm2/attention/sample9.zarr" in out
    if "workflow/presets/llm4k.yaml" in command:
        # SmolLM2 at 4096 tokens: 2 samples of 3 layers, no head ablation, the page in jobs of its own
        assert planned.get("prepare_model") == 1 and "prune" not in planned and "stability" not in planned
        assert planned["extract"] == planned["organize"] == planned["decompose"] == 2
        assert planned.get("explorer_plan") == 1 and planned.get("explorer_samples") == 2
        assert "results/llm4k/smollm2/attention/sample1.zarr" in out
    if "workflow/presets/prompts.yaml" in command:
        # SmolLM2 on the project's prompts: the first 24 are the samples, prune holds out the others
        stages = by_stage(planned)
        assert planned.get("prepare_model") == 1 and planned.get("prune") == 1
        assert stages["extract"] == stages["organize"] == stages["decompose"] == 24
        assert "results/prompts/smollm2-prompts/attention/sample23.zarr" in out
    if "my-prompts.yaml" in command:
        # the tutorial: its 8 prompts (n_samples: all), each stage one job, the ablation on probes.txt
        stages = by_stage(planned)
        assert planned.get("prepare_model") == 1 and planned.get("prune") == 1 and "train" not in planned
        assert stages["extract"] == stages["organize"] == stages["decompose"] == 8
        assert "results/my-prompts/my-prompts/attention/sample7.zarr" in out


def test_changed_n_iters_reruns_organize_and_after_never_training(project):
    jobs = dry_run(project, "--config", "organize={n_iters: 2}")
    assert jobs == ANALYSIS_AFTER_ORGANIZE


def test_fewer_samples_on_the_pages_rebuild_the_pages_only(project):
    """explorer.max_samples 1 (of 2): the pages are planned and built again, with one sample
    part for lm; nothing before them reruns. lm's 2-D organizations are not made again (sample 0's
    exist); the small models' organize2d jobs are, as their inputs changed (seconds)."""
    jobs = dry_run(project, "--config", "explorer={max_samples: 1}")
    assert jobs == {"explorer_plan": 1, "explorer_samples": 1, "explorer": 3, "explorer_index": 1, "all": 1,
                    "organize2d_batch_txl": 1, "organize2d_batch_vit": 1}, jobs


# -- the same config in another form -----------------------------------------------------------
def test_reordered_keys_and_rewritten_numbers_plan_nothing(project, tmp_path):
    cfg = reordered(yaml.safe_load((project / "config.yaml").read_text()))
    text = yaml.safe_dump(cfg, sort_keys=False)
    assert "lr: 0.005" in text and "lr: 0.003" in text
    # the same numbers written another way: a float in exponent form, a string YAML 1.1 leaves unparsed
    text = text.replace("lr: 0.005", "lr: 5.0e-3").replace("lr: 0.003", "lr: 3e-3")
    (tmp_path / "reordered.yaml").write_text(text)
    assert yaml.safe_load(text)["models"][1]["train"]["lr"] == "3e-3"
    assert dry_run(project, "--configfile", str(tmp_path / "reordered.yaml")) == {}


# -- code edits ------------------------------------------------------------------------------
class Edit:
    """Edit a file of the project copy; undo restores it byte for byte."""

    def __init__(self, path: Path):
        self.path, self.original = path, path.read_text()

    def replace(self, old: str, new: str) -> None:
        text = self.path.read_text()
        assert old in text, f"{old!r} not in {self.path}"
        self.path.write_text(text.replace(old, new, 1))

    def undo(self) -> None:
        self.path.write_text(self.original)


def test_editing_the_questionnaire_reruns_organize_and_after_and_undoing_it_nothing(project):
    edit = Edit(project / "oattn_lib" / "questionnaire.py")
    try:
        # a real change to the code organize runs (a dead store is still a different program)
        edit.replace("@announces_kernels\ndef questionnaire3d(", "_EDITED = True\n\n\n@announces_kernels\ndef questionnaire3d(")
        assert dry_run(project) == AFTER_QUESTIONNAIRE_EDIT
        # the opt-out the docs document
        assert dry_run(project, "--rerun-triggers", "mtime", "params", "input") == {}
    finally:
        edit.undo()
    assert dry_run(project) == {}


def test_editing_a_kernel_module_recompiles_and_reruns_organize_and_after(project):
    """emd.py defines numba kernels: the kernels rule reruns, and with it everything that runs the
    kernels (with the kernels' output as an ancient() input Snakemake planned the kernels alone)."""
    edit = Edit(project / "oattn_lib" / "emd.py")
    try:
        edit.replace("\n_BLOCK = 16\n", "\n_BLOCK = 16\n_EDITED = True\n")
        assert dry_run(project) == {"kernels": 1, **AFTER_QUESTIONNAIRE_EDIT}
        assert dry_run(project, "--rerun-triggers", "mtime", "params", "input") == {}
    finally:
        edit.undo()
    assert dry_run(project) == {}


def test_editing_plots_reruns_the_figures_only(project):
    edit = Edit(project / "oattn_lib" / "plots" / "style.py")
    try:
        edit.replace("DPI = ", "_EDITED = True\nDPI = ")
        assert dry_run(project) == {"figures": 3, "prune": 3, "explorer": 3, "explorer_index": 1, "summary": 1,
                                    "all": 1}
    finally:
        edit.undo()
    assert dry_run(project) == {}


def test_editing_the_explorer_script_reruns_the_explorer_pages_only(project):
    """app.js is no Python module: the page module declares it as an asset, which the fingerprint
    hashes (a comment too: the page embeds the script verbatim)."""
    edit = Edit(project / "oattn_lib" / "explorer" / "app.js")
    try:
        edit.replace('"use strict";\n', '"use strict";\n// edited\n')
        assert dry_run(project) == {"explorer": 3, "explorer_index": 1, "all": 1}
    finally:
        edit.undo()
    assert dry_run(project) == {}


def test_comment_and_docstring_edits_rerun_nothing(project):
    edit = Edit(project / "oattn_lib" / "questionnaire.py")
    try:
        edit.replace("def questionnaire3d(", "# a comment a user adds\ndef questionnaire3d(")
        edit.replace('"""', '"""Reworded. ')
        assert dry_run(project) == {}
    finally:
        edit.undo()


# -- what the stores record ----------------------------------------------------------------------
def test_stores_record_their_code_and_hold_nothing_foreign(clean_run):
    from oattn_lib.fingerprint import code_fingerprint
    res = clean_run / "results"
    stores = sorted(res.glob("*/*/sample*.zarr")) + sorted(res.glob("*/entropy.zarr"))
    # every model's 4 per-sample stores of 2 samples and its entropy store, and the replicated
    # samples' stability stores (txl 1, lm 2)
    assert len(stores) == 3 * (4 * 2 + 1) + 3
    for path in stores:
        assert not (path / ".snakemake_timestamp").exists(), path
        # a user opens a store the docs' way without any warning (pytest turns zarr's into errors)
        ds = xr.open_zarr(path, consolidated=False)
        stage = {"attention": "extract", "organized": "organize", "decomposed": "decompose",
                 "organized2d": "organize2d", "stability": "stability_sample"}.get(
            path.parent.name, "entropy")
        expect = code_fingerprint(REPO / "scripts" / f"{stage}.py", REPO)
        assert ds.attrs["code"] == f"{stage}:{expect}", path
        assert "config" in ds.attrs


def test_the_masked_entries_rule_reruns_the_scores_model_from_organize_only(project, tmp_path):
    """extract.masked changes what the 3-D organization and the expansions of scores see: txl
    (scores, causal) is organized and decomposed again and everything after; vit and lm analyse
    probabilities (0 where masked, whatever the rule): nothing of theirs reruns; nothing is
    extracted again, and the Theorem 1 table (the masked softmax) stays."""
    cfg = yaml.safe_load((project / "config.yaml").read_text())
    cfg["models"][0]["extract"]["masked"] = "keep"
    (tmp_path / "keep.yaml").write_text(yaml.safe_dump(cfg))
    jobs = dry_run(project, "--configfile", str(tmp_path / "keep.yaml"))
    assert jobs == MASKED_RULE_RERUNS, jobs
    for name in (1, 2):
        cfg["models"][name]["extract"]["masked"] = "keep"
    (tmp_path / "keep.yaml").write_text(yaml.safe_dump(cfg))
    assert dry_run(project, "--configfile", str(tmp_path / "keep.yaml")) == MASKED_RULE_RERUNS
