"""A job's start-up: what each stage imports, and numba kernels compiled once before the jobs.

Every stage job is a fresh Python process, so what a stage imports is paid by every job:
torch's import alone takes about 2 s. The stages that only read and sum stored arrays
(entropy, tables, summary, text data, the explorer's pages) must not import torch or numba;
none of the analysis stages may import transformers, torchvision, matplotlib or plotly.
Checked in fresh subprocesses (this test process has imported everything).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
MODEL_OR_PLOTS = {"transformers", "torchvision", "matplotlib", "plotly", "sentence_transformers"}
ENGINE = {"torch", "numba"}


def _fresh(code: str, env: dict | None = None) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object as its last line."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _loaded_by_import(*modules: str) -> set[str]:
    """The heavy libraries loaded by importing `modules` together in a fresh interpreter (if none
    of them loads one together, none does alone)."""
    names = sorted(MODEL_OR_PLOTS | ENGINE)
    imports = "; ".join(f"import {m}" for m in modules)
    return set(_fresh(f"import sys, json; {imports}; print(json.dumps([m for m in {names!r} if m in sys.modules]))"))


def test_reading_stages_and_the_job_set_up_import_neither_torch_nor_numba():
    # runtime (setup_logging) runs in every job before its stage
    assert _loaded_by_import("oattn_lib.runtime", *(f"oattn_lib.stages.{s}" for s in
                                                     ("entropy", "tables", "summary", "data", "explorer",
                                                      "explorer_samples"))) == set()


def test_analysis_stages_import_no_model_or_plotting_library():
    stages = ("organize", "decompose", "entropy", "tables", "extract", "kernels")
    assert not _loaded_by_import(*(f"oattn_lib.stages.{s}" for s in stages)) & MODEL_OR_PLOTS


def test_importing_the_library_leaves_the_environment_alone():
    """A notebook that imports oattn_lib keeps its own environment: every module of the library
    imported, no variable set or changed (the Snakefile sets the jobs' OMP_WAIT_POLICY, not the
    library). torch's inductor records its cache folder when imported: not ours, allowed."""
    changed = _fresh(
        "import importlib, json, os, pkgutil\n"
        "os.environ.pop('OMP_WAIT_POLICY', None)\n"  # as a notebook has it (conftest sets it here)
        "before = dict(os.environ)\n"
        "import oattn_lib\n"
        "for m in pkgutil.walk_packages(oattn_lib.__path__, 'oattn_lib.'):\n"
        "    importlib.import_module(m.name)\n"
        "after = dict(os.environ)\n"
        "print(json.dumps(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))))")
    assert [k for k in changed if not k.startswith("TORCHINDUCTOR_")] == []


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory):
    """Two samples of a tiny causal model organized and decomposed by the stages."""
    from oattn_lib.stages.decompose import decompose_samples
    from oattn_lib.stages.kernels import _tiny_sample
    from oattn_lib.stages.organize import organize_samples

    root = tmp_path_factory.mktemp("tiny")
    att = [root / f"attention{i}.zarr" / "zarr.json" for i in range(2)]
    for i, p in enumerate(att):
        _tiny_sample(p.parent, n=10 + i, seed=i)
    org = [root / f"organized{i}.zarr" / "zarr.json" for i in range(2)]
    dec = [root / f"decomposed{i}.zarr" / "zarr.json" for i in range(2)]
    organize_samples(att, org, "probs", params={"n_iters": 1})
    # every coefficient kept, for the comparison below
    decompose_samples(att, org, dec, "probs", figure_heads=[[0, 0]], questionnaire2d_iters=1, random_tree_seeds=1,
                      keep_coefficients=True)
    return root, org, dec


def test_entropy_and_tables_run_without_torch(decomposed, tmp_path):
    """Not only imported: run on real decomposed stores, entropy and tables load neither torch
    nor numba (nor scikit-learn, a second of imports for the head tree's Rand index), and give
    what the torch path gives."""
    import xarray as xr

    _, org, dec = decomposed
    out = tmp_path / "entropy.zarr" / "zarr.json"
    names = sorted(MODEL_OR_PLOTS | ENGINE | {"sklearn"})
    code = f"""
import sys, json
from oattn_lib.stages.entropy import entropy
from oattn_lib.stages.tables import tables
entropy({[str(p) for p in dec]!r}, {str(out)!r}, 8, 8)
t = {str(tmp_path)!r}
tables({str(out)!r}, t + '/t1.csv', t + '/t1.md', t + '/t2.csv', t + '/t2.md', fraction=0.5, model_name='tiny',
       organized_stores={[str(p) for p in org]!r}, out_head_tree_csv=t + '/ht.csv')
print(json.dumps([m for m in {names!r} if m in sys.modules]))
"""
    assert _fresh(code) == []
    # the same sums in torch over every coefficient (the stage reads the kept coarsest ones and
    # the level sums)
    import torch

    from oattn_lib.entropy import coarse_l1, l1_over_l2

    got = xr.open_zarr(out.parent, consolidated=False)
    for i, path in enumerate(dec):
        ds = xr.open_zarr(path.parent, consolidated=False)
        c2 = torch.from_numpy(ds["bihaar"].values)
        want = coarse_l1(c2, [ds["support_q"].values, ds["support_k"].values],
                         [ds["level_q"].values, ds["level_k"].values], 8)
        np.testing.assert_allclose(got["head_entropy"].values[i].ravel(), want, rtol=1e-12)
        np.testing.assert_allclose(got["head_sparsity"].values[i].ravel(), l1_over_l2(c2, (0, 1)).numpy(),
                                   rtol=1e-12)


def _fresh_merged(code: str, env: dict) -> tuple[list[str], dict]:
    """Run `code` in a fresh interpreter, stdout and stderr in one stream in the order written:
    the lines before its last, and the JSON object it prints last."""
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=REPO, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    assert proc.returncode == 0, proc.stdout[-4000:]
    lines = proc.stdout.strip().splitlines()
    return lines[:-1], json.loads(lines[-1])


def _notices(lines: list[str]) -> list[str]:
    """What kernel_notice printed to stderr (no logging configured, as in a notebook)."""
    return [line for line in lines if line.startswith("oattn: numba: ")]


def test_a_warm_up_started_while_another_runs_waits_for_it():
    """compile_kernels holds a lock on the kernels' cache directory (stages.kernels.cache_lock):
    a warm-up started while another process holds it says so, waits, and runs once it is free,
    so that two runs started together on a fresh machine compile each kernel once."""
    import time

    from oattn_lib.stages.kernels import cache_lock

    with cache_lock():
        proc = subprocess.Popen([sys.executable, "-m", "oattn_lib.stages.kernels"], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        said = []
        for line in proc.stdout:
            said.append(line)
            if "another process is compiling into" in line:
                break
        time.sleep(1.0)
        assert proc.poll() is None, "".join(said)  # still waiting while the lock is held
    rest = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0 and "kernels: waited" in rest and "kernel signatures compiled" in rest, rest


def test_kernels_compiled_once_are_loaded_by_later_jobs(tmp_path):
    """In an empty numba cache (a fresh machine), the first questionnaire of a process says
    before it compiles any kernel that it compiles them and how to do it ahead, and after it how
    many it compiled, on stderr where no logging is configured (a notebook); the first API call
    compiles the rest ahead with rule kernels' warm-up. A later process running organize and
    decompose on another sample (other sizes) compiles none and says nothing; a first call that
    compiles a signature the warm cache lacks says so after it, through the logger where one is
    configured. One compile of every kernel in all."""
    cache = str(tmp_path / "numba-cache")
    # what is compiled, cached, counted and said does not depend on LLVM's optimisation level;
    # at level 0 (a cache of its own, read by no job) compiling every kernel costs a third less
    env = {"NUMBA_CACHE_DIR": cache, "NUMBA_OPT": "0"}
    engine = """
import json
import numpy as np
from oattn_lib.kernel_notice import cached_dispatchers, missing_kernels
from oattn_lib.questionnaire import questionnaire2d
from oattn_lib.runtime import kernel_stats
missing, where = missing_kernels()
M = np.random.default_rng(0).random((20, 16))
questionnaire2d(M, n_iters=1)
questionnaire2d(M, n_iters=1)
print(json.dumps({"missing": missing, "where": where, "names": sorted(cached_dispatchers()), "stats": kernel_stats(),
                  "after": missing_kernels()[0]}))
"""
    # numba prints each machine code it writes to the cache ("[cache] data saved to ..."): the
    # notices come before the first and after the last
    out, a = _fresh_merged(engine, {**env, "NUMBA_DEBUG_CACHE": "1"})
    names = a["names"]
    assert len(names) >= 5 and a["missing"] == names and a["where"].startswith(cache)
    said = [i for i, line in enumerate(out) if line.startswith("oattn: numba: ")]
    saved = [i for i, line in enumerate(out) if line.startswith("[cache] data saved")]
    assert len(said) == 2 and saved and said[0] < saved[0] and saved[-1] < said[1], out  # once per process
    assert f"{len(names)} of {len(names)} are not in the cache at {a['where']}" in out[said[0]]
    assert "python -m oattn_lib.stages.kernels" in out[said[0]]
    compiled = sum(v["compiled"] for v in a["stats"].values())
    assert compiled == len(saved) and f"compiled {compiled} kernel signatures; questionnaire2d took " in out[said[1]]
    # the check finds exactly what was compiled; Haar's sweep (decompose) is not a questionnaire's
    assert a["after"] == sorted(set(names) - {k for k, v in a["stats"].items() if v["compiled"]})
    assert "sweep._haar_up" in a["after"]

    api = """
import json
import numpy as np
import xarray as xr
import oattn_lib
from oattn_lib.kernel_notice import missing_kernels
from oattn_lib.runtime import kernel_stats
x = xr.DataArray(np.random.default_rng(1).random((12, 12, 4)), dims=("query", "key", "unit"), name="probs")
oattn_lib.organize(x, n_iters=1, device="cpu")
oattn_lib.organize(x, n_iters=1, device="cpu")
print(json.dumps({"stats": kernel_stats(), "after": missing_kernels()[0]}))
"""
    out, b = _fresh_merged(api, env)
    said = _notices(out)
    assert len(said) == 2 and "compiling all the kernels first" in said[0], out
    assert f"{len(a['after'])} of {len(names)} are not in the cache" in said[0]
    compiled = sum(v["compiled"] for v in b["stats"].values())
    assert f"compiled {compiled} kernel signatures; organize took " in said[1]
    # the warm-up compiled what was missing and loaded what the questionnaire had compiled
    assert b["after"] == [] and sorted(b["stats"]) == names
    assert all(b["stats"][k]["compiled"] >= 1 for k in a["after"]), b["stats"]
    assert all(b["stats"][k]["loaded"] >= 1 for k in set(names) - set(a["after"])), b["stats"]
    assert all(v["cache"].startswith(cache) for v in b["stats"].values())

    later = f"""
import json
from oattn_lib.runtime import kernel_stats
from oattn_lib.stages.decompose import decompose
from oattn_lib.stages.organize import organize
from oattn_lib.stages.kernels import _tiny_sample
from pathlib import Path
t = Path({str(tmp_path)!r})
_tiny_sample(t / 'a.zarr', n=35, n_layer=3, n_head=2, seed=5)
organize(t / 'a.zarr/zarr.json', t / 'o.zarr/zarr.json', 'probs', params={{'n_iters': 2}})
decompose(t / 'a.zarr/zarr.json', t / 'o.zarr/zarr.json', t / 'd.zarr/zarr.json', 'probs', figure_heads=[[1, 1]],
          questionnaire2d_iters=2, random_tree_seeds=2)
print(json.dumps(kernel_stats()))
"""
    out, stats = _fresh_merged(later, env)
    assert sorted(stats) == names
    assert all(v["compiled"] == 0 and v["loaded"] >= 1 for v in stats.values()), stats
    assert _notices(out) == [], out  # the questionnaires' first calls found every kernel: silent

    new_signature = """
import json, logging
import numpy as np
from oattn_lib.kernel_notice import announces_kernels, missing_kernels
from oattn_lib.tree_kernels import _components
logging.basicConfig(level=logging.INFO, format="LOG %(name)s: %(message)s")

def ahead():
    raise AssertionError("compiled ahead with every kernel in the cache")

@announces_kernels(ahead=ahead)
def components32():  # float32: no entry point calls the kernel with it
    return _components(np.eye(3, dtype=np.float32))

missing = missing_kernels()[0]
components32()
components32()
print(json.dumps({"missing": missing}))
"""
    out, d = _fresh_merged(new_signature, env)
    said = [line for line in out if "numba: " in line]
    assert d["missing"] == [] and len(said) == 1, out
    assert said[0].startswith("LOG oattn: numba: components32 compiled 1 kernel signatures that were not in the cache")


def test_a_job_log_ends_with_what_the_whole_job_used(tmp_path):
    """The log's last line is the job's CPU time and peak resident memory, counted by the kernel
    over the whole job: a peak the job had freed by its end, CPU time in a thread, once however
    often logging is set up (Snakemake's benchmark samples would miss the first after 15 s)."""
    from oattn_lib.runtime import read_job_usage

    log = tmp_path / "logs" / "job.log"
    code = f"""
import threading, time
import numpy as np
from oattn_lib.runtime import setup_logging, job_usage
setup_logging({str(log)!r})
setup_logging({str(log)!r})
before = job_usage()["peak_rss_mb"]
a = np.ones(400 * 2 ** 20 // 8)   # 400 MB touched, then freed
del a

def spin():
    t = time.thread_time()
    while time.thread_time() - t < 0.6:
        pass

th = threading.Thread(target=spin)
th.start(); th.join()
import json; print(json.dumps({{"before": before}}))
"""
    before = _fresh(code)["before"]
    lines = log.read_text().splitlines()
    assert sum(" resources used: " in line for line in lines) == 1 and " resources used: " in lines[-1]
    usage = read_job_usage(log)
    assert usage["peak_rss_mb"] >= before + 390, (before, usage)
    assert usage["cpu_s"] >= 0.6 and usage["wall_s"] >= usage["cpu_s"] * 0.5
    assert read_job_usage(tmp_path / "no.log") is None
    (tmp_path / "old.log").write_text("2026-11-25 18:00:00,000 INFO oattn: start-up 2.5 s (loaded: none)\n")
    assert read_job_usage(tmp_path / "old.log") is None
