"""Snakemake behaviour the workflow relies on, shown on real Snakemake runs: two bugs of
Snakemake 9.10-9.16 that the pinned version (requirements.txt, the Snakefile's `min_version`) has
fixed, held here so that another pin cannot bring them back unnoticed; the workflow's own lifting
of the default job rate limit, whose timers cost a local run CPU; the suite's command server."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

# one job alone first (prepare), then three that each need every core
SNAKEFILE = """
rule final:
    input: expand("out{i}.txt", i=range(3))

rule prepare:
    output: "common.txt"
    threads: 2
    shell: "touch {output}"

rule work:
    input: "common.txt"
    output: "out{i}.txt"
    threads: 2
    shell: "python -c 'import time; print(time.time())' > {output}; sleep 1.5; python -c 'import time; print(time.time())' >> {output}"
"""


def test_jobs_needing_every_core_run_one_at_a_time(tmp_path):
    """Snakemake 9.10-9.16 started a job that was alone among the ready ones without reserving
    its cores (snakemake/snakemake#4026): here `prepare`, after which two `work` jobs of 2 threads
    each ran at once on 2 cores (7 jobs at once late in the LLM preset, 17 GB together)."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--scheduler", "greedy", "-q"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)
    runs = sorted(tuple(float(x) for x in (tmp_path / f"out{i}.txt").read_text().split()) for i in range(3))
    assert all(later[0] >= earlier[1] for earlier, later in zip(runs, runs[1:])), runs


def test_a_target_no_rule_makes_is_named_not_a_traceback(tmp_path):
    """A mistyped target of the real workflow: Snakemake's own "No rule to produce" message,
    naming it, and no AttributeError from formatting it (snakemake/snakemake#3644, up to 9.16)."""
    from wfutil import TINY, snakemake as run_snakemake

    model = TINY["models"][0]["name"]
    bad = f"results/{model}/organised/sample0.zarr/zarr.json"  # "organized" mistyped
    run = run_snakemake(tmp_path, TINY, "-n", bad, check=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"No rule to produce {bad}" in out, out[-3000:]
    assert "is_storage" not in out


# -- the suite's Snakemake commands (tests/wfutil.py run_snakemake, tests/snakemake_server.py) --
SERVED = """
import os
rule all:
    input: "env.txt", "where.txt"

rule env:
    output: "env.txt"
    shell: "echo $OATTN_SERVED_VALUE > {output}"

rule where:
    output: "where.txt"
    run:
        import sys
        with open(output[0], "w") as fh:
            print(os.getcwd(), sys.argv[0].endswith("__main__.py"), file=fh)

rule wait:
    output: "never.txt"
    shell: "echo $$ > pid.txt; sleep 300; touch {output}"
"""


def test_a_command_forked_from_the_server_is_the_command_run_as_a_subprocess(tmp_path, monkeypatch):
    """The suite's Snakemake commands run in processes forked from a server that imported
    Snakemake once: each in its own directory and this process's environment at the call, with
    Snakemake's exit status and its output as `python -m snakemake` gives them; a command past
    its timeout raises TimeoutExpired and its jobs are killed with it."""
    from wfutil import run_snakemake

    (tmp_path / "Snakefile").write_text(SERVED)
    runs = {}
    for fork in ("0", "1"):
        monkeypatch.setenv("OATTN_TEST_FORK", fork)
        monkeypatch.setenv("OATTN_SERVED_VALUE", f"value-{fork}")
        work = tmp_path / f"w{fork}"
        work.mkdir()
        (work / "Snakefile").write_text(SERVED)
        ok = run_snakemake(["--cores", "1", "-q"], cwd=work, timeout=120)
        bad = run_snakemake(["--cores", "1", "--no-such-option"], cwd=work, timeout=120)
        missing = run_snakemake(["--cores", "1", "nothing-makes-this.txt"], cwd=work, timeout=120)
        runs[fork] = (ok.returncode, (work / "env.txt").read_text(), (work / "where.txt").read_text().replace(str(work), "W"),
                      bad.returncode, bad.stderr.splitlines()[-1], missing.returncode,
                      "nothing-makes-this.txt" in missing.stdout + missing.stderr)
    assert runs["1"][:1] == (0,) and runs["1"][1] == "value-1\n"
    assert runs["1"][2:] == runs["0"][2:] and runs["0"][1] == "value-0\n"
    assert runs["1"][3] == 2 and "unrecognized arguments: --no-such-option" in runs["1"][4]
    work = tmp_path / "w1"
    with pytest.raises(subprocess.TimeoutExpired):
        run_snakemake(["--cores", "1", "never.txt"], cwd=work, timeout=3)
    pid = int((work / "pid.txt").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
            not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z":
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"


# a real run of the workflow up to its scheduler, which records its job rate limiter and runs nothing
LIMITER_PROBE = """
import sys
import snakemake.scheduling.job_scheduler as js
from snakemake.cli import main

def schedule(self):
    limiter = self.job_rate_limiter
    print("LIMITER", None if limiter is None else (limiter.max_jobs, limiter.timespan), flush=True)
    return True

js.JobScheduler.schedule = schedule
sys.argv = ["snakemake", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("given, kept", [(None, None), ("10/1s", (10, 1.0)), ("100/2m", (100, 120.0))])
def test_the_default_job_rate_limit_is_lifted_in_a_local_run(given, kept, tmp_path):
    """Snakemake's default --max-jobs-per-timespan (100/1s) re-arms a timer at every scheduler
    pass, one more chain per finished job (snakemake/snakemake#3744): the workflow's `onstart`
    lifts it for a local run, and keeps any other limit a user sets."""
    import yaml
    from wfutil import REPO, TINY

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(TINY))
    probe = tmp_path / "probe.py"
    probe.write_text(LIMITER_PROBE)
    args = [sys.executable, str(probe), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile",
            str(tmp_path / "config.yaml"), "--cores", "1", "results/kernels/numba.json"]
    if given:
        args += ["--max-jobs-per-timespan", given]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("LIMITER ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert lines == [f"LIMITER {kept}"]
