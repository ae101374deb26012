"""The documentation site's machinery (mkdocs.yml, docs/hooks.py and the generators it calls).

Fast: no page is left out of the nav; the generated pages (the configuration reference, the
measurements) are made without mkdocs and say what their sources say; the committed reruns
cover every key of the schema and agree with what the workflow tests see Snakemake plan.
Slow (CI): the reruns measured again equal the committed ones; the notebook runs.
`make docs` builds the whole site strictly (CI's step after the tests).
"""
from __future__ import annotations

import ast
import csv
import functools
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))

import config_reference  # noqa: E402  (docs/config_reference.py)
import measurements  # noqa: E402  (docs/measurements.py)


def nav_pages(nav) -> list[str]:
    """The pages of mkdocs.yml's nav, in order (entries are paths or {title: path or list})."""
    out = []
    for entry in nav:
        if isinstance(entry, str):
            out.append(entry)
        else:
            for value in entry.values():
                out += [value] if isinstance(value, str) else nav_pages(value)
    return out


def constant(path: Path, name: str):
    """The literal a module assigns to `name`, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} defines no {name}")


def generated_pages() -> set[str]:
    """The pages docs/hooks.py adds at build time: its `PAGES` (it imports mkdocs, which the
    fast tier's environment does not have)."""
    return set(constant(DOCS / "hooks.py", "PAGES"))


class _Loader(yaml.SafeLoader):
    """A safe loader that reads a `!!python/name:` tag (an extension's option) as None."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def test_the_nav_lists_every_page_once():
    nav = nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)["nav"])  # noqa: S506
    assert len(nav) == len(set(nav)), f"listed twice: {sorted(p for p in nav if nav.count(p) > 1)}"
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    generated = generated_pages()
    assert not on_disk & generated, f"generated pages that are also files: {sorted(on_disk & generated)}"
    assert sorted(set(nav)) == sorted(on_disk | generated), (
        f"pages not in mkdocs.yml's nav: {sorted((on_disk | generated) - set(nav))}; "
        f"in the nav but no page: {sorted(set(nav) - on_disk - generated)}")


@functools.cache
def measurements_page() -> str:
    return measurements.render(ROOT)


def test_the_measurements_page_states_the_latest_fresh_clone_figure_of_each_command():
    """For each command of bench/fresh_clone.csv, its latest row measured on a fresh clone (its
    total, set-up included) is on the page, with its commit: a new measurement is on the site
    at the next build, and no figure there is typed by hand."""
    rows = list(csv.DictReader((ROOT / "bench" / "fresh_clone.csv").open()))
    page = measurements_page()
    latest_table = page.split("### Latest figure of each command")[1].split("???")[0]
    commands = {r["command"] for r in rows if r["note"].startswith("fresh clone") and r["total_s"]}
    assert {"run", "test"} <= commands
    for command in commands:
        latest = [r for r in rows if r["command"] == command and r["note"].startswith("fresh clone")
                  and r["total_s"]][-1]
        total = float(latest["total_s"])
        figure = f"{int(total // 60)} min {int(total) % 60:02d} s"
        line = next((ln for ln in latest_table.splitlines() if ln.startswith("| ")
                     and (f"`make {command}`" in ln or f"| {command} |" in ln)), "")
        assert figure in line and latest["commit"] in line, (command, figure, latest, line)


def test_the_measurements_page_shows_every_record_and_benchmark():
    page = measurements_page()
    for record in [*(ROOT / "bench").glob("*.csv"), ROOT / "bench" / "budget.yaml"]:
        assert f"## `bench/{record.name}`" in page
    for script in [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.sh")]:
        assert f"`bench/{script.name}`" in page, script.name


def test_the_reruns_cover_every_key_of_the_schema():
    """docs/reference/reruns.yaml has an entry for each leaf key of the schema, no other: a key
    added to the schema fails here until the reruns are measured again."""
    keys = [k.anchor for k in config_reference.leaf_keys(config_reference.load_schema())]
    assert len(keys) == len(set(keys)), "two keys of the schema share an anchor"
    recorded = config_reference.read_reruns()
    assert sorted(recorded) == sorted(keys), (
        f"not measured: {sorted(set(keys) - set(recorded))}; no such key: {sorted(set(recorded) - set(keys))}. "
        "Measure again: .venv/bin/python docs/config_reference.py")


def test_the_config_reference_has_every_key_with_its_default_and_reruns():
    schema = config_reference.load_schema()
    page = config_reference.render(schema, config_reference.read_reruns())
    for key in config_reference.leaf_keys(schema):
        block = page.split(f"{{#{key.anchor}}}\n", 1)[1].split("\n#### ", 1)[0]
        if "default" in key.node:
            assert f"default `{config_reference._flow(key.node['default'])}`" in block, key.anchor
        assert "**Reruns:**" in block and "not measured yet" not in block, key.anchor
    # a value the schema holds, and a measured rerun, as the page states them
    assert "`organize.n_iters` · integer ≥ 1 · default `3`" in page
    n_iters = page.split("{#organize.n_iters}")[1].split("**Reruns:**")[1].split("\n")[0]
    assert n_iters.startswith(" `masked_other`, `organize`") and "then what follows:" in n_iters


def test_every_key_of_the_config_reference_has_a_description():
    """Each key and section the reference renders says what it is: a key added to the schema
    without a `description` fails here (a kind's data, arch and train sections take theirs
    from their `$defs` entry)."""
    keys = config_reference.schema_keys(config_reference.load_schema())
    missing = [k.anchor for k in keys if not config_reference._description(k.node)]
    assert not missing, f"no description in oattn_lib/schemas/config.schema.yaml: {missing}"


def test_the_recorded_reruns_agree_with_what_the_workflow_tests_see_planned():
    """The stages the reruns say a change of organize.n_iters and of jobs.batch_max_entries
    plan are those a dry run on a finished run of the test config plans
    (tests/test_reruns.py, tests/test_workflow.py assert them on the real workflow)."""
    recorded = config_reference.read_reruns()

    def stages(anchor):
        return set(recorded[anchor]["reruns"]) | set(recorded[anchor]["then"])

    after_organize = constant(ROOT / "tests" / "test_reruns.py", "ANALYSIS_AFTER_ORGANIZE")
    assert stages("organize.n_iters") == {re.sub(r"_batch_\w+$", "", r) for r in after_organize} - {"all"}
    # one job per sample again: extract, organize, decompose and what reads them; never training
    batch = stages("jobs.batch_max_entries")
    assert {"extract", "organize", "decompose", "entropy", "explorer_plan", "explorer_samples"} <= batch
    assert "train" not in batch and "prepare_data" not in batch
    # explorer.max_samples 1: the pages and the 2-D organizations they show, nothing before
    assert stages("explorer.max_samples") == {"explorer_plan", "explorer_samples", "explorer", "explorer_index",
                                              "organize2d"}
    # cluster resources are no params: nothing reruns
    assert all(stages(k) == set() for k in recorded if k.startswith("resources."))


@pytest.mark.slow
def test_the_recorded_reruns_are_those_measured_now():
    """Guarded in the fast tier by test_the_reruns_cover_every_key_of_the_schema (the keys) and
    test_the_recorded_reruns_agree_with_what_the_workflow_tests_see_planned (three of them):
    here every key is measured again on the workflow as it is (about 2 minutes of CPU)."""
    import io

    measured = config_reference.measure_reruns(log=io.StringIO())
    recorded = config_reference.read_reruns()
    changed = {k: (recorded.get(k), v) for k, v in measured.items() if recorded.get(k) != v}
    assert not changed, ("the reruns changed (recorded, measured); run .venv/bin/python docs/config_reference.py:\n"
                         + "\n".join(f"{k}: {v}" for k, v in changed.items()))


CHECKS = """
import json
import numpy as np
print("CHECKS " + json.dumps({
    "n_samples": len(samples),
    "organized_is_permutation": bool(
        sorted(tree_q.order.tolist()) == list(range(raw.shape[0]))
        and sorted(tree_k.order.tolist()) == list(range(raw.shape[1]))
        and np.array_equal(np.sort(organized, axis=None), np.sort(raw, axis=None))),
    "organized_rows_are_raw_rows": bool(np.array_equal(np.sort(organized, axis=1),
                                                       np.sort(raw[tree_q.order], axis=1))),
    "grid_shape": list(grid.shape),
    "entropies_finite_positive": bool(np.isfinite(grid.values).all() and (grid.values > 0).all()),
    "sparsity_in_range": bool(((measures["head_sparsity"].values >= 1 - 1e-9)
                               & (measures["head_sparsity"].values ** 2 <= raw.size * (1 + 1e-9))).all()),
    "lowest_is_min": bool(float(grid.sel(layer=layer, head=head)) == float(grid.min())),
    "residuals_finite": bool(np.isfinite(residuals).all() and (residuals >= 0).all()),
    "jaccard_in_range": bool(((pairs >= 0) & (pairs <= 1)).all()),
    "sparsity_keys": sorted(sparsity),
    # analyze's stages and the step-by-step API agree on the organized prompt's head entropies
    "analysis_is_the_api": bool(np.allclose(
        analysis.heads[analysis.heads["sample"] == 1].set_index(["layer", "head"])["head_entropy"]
        .to_xarray().transpose("layer", "head").values, grid.values, rtol=1e-5)),
}))
"""


@pytest.mark.slow
def test_the_notebook_runs_and_its_results_hold(tmp_path):
    """examples/notebook.ipynb executes (as the site's build does; guarded in the fast tier by
    tests/test_api.py, which runs the same API on the same model) and its results have the
    properties they must: the organized head is the raw head permuted, every head's entropy is
    finite and positive, the l1/l2 ratios lie in [1, sqrt(entries)]. The notebook is committed
    without outputs."""
    import nbclient
    import nbformat

    path = ROOT / "examples" / "notebook.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    nb.cells.append(nbformat.v4.new_code_cell(CHECKS))
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    checks = json.loads(text.split("CHECKS ", 1)[1])
    assert checks["n_samples"] == 3
    assert checks["organized_is_permutation"] and checks["organized_rows_are_raw_rows"]
    assert checks["grid_shape"] == [6, 12]  # MiniLM: 6 layers x 12 heads
    assert checks["entropies_finite_positive"] and checks["sparsity_in_range"] and checks["lowest_is_min"]
    assert checks["residuals_finite"] and checks["jaccard_in_range"]
    assert checks["sparsity_keys"] == sorted(["organized", "balanced trees, token order", "random trees"])
    assert checks["analysis_is_the_api"]
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    # the entropy grid, the head raw and organized, the residuals per head, and analyze's `show`,
    # whose pyplot-free figure the notebook displays inline
    assert len(images) == 4
