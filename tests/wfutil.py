"""Running the real workflow from tests: a tiny config, snakemake in a temporary directory."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from oattn_lib.plan import rule_stage

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

# The one tiny config (workflow/presets/test.yaml, also the SLURM CI's), run in a temporary
# directory with its results under results/ there.
TINY = {**yaml.safe_load((REPO / "workflow" / "presets" / "test.yaml").read_text()), "results": "results"}


# CPU-seconds of the commands run_snakemake ran in processes forked from the command server:
# not this process's children, so resource.RUSAGE_CHILDREN misses them until the server, which
# waited for them, is itself reaped (stop_server); [forked, of which in RUSAGE_CHILDREN since]
FORKED_CPU = [0.0, 0.0]


def forked_cpu_unreaped() -> float:
    """CPU of the forked commands that this process's RUSAGE_CHILDREN does not hold yet."""
    return FORKED_CPU[0] - FORKED_CPU[1]


class _Server:
    """This process's Snakemake command server (tests/snakemake_server.py), started on first use
    and again if it died."""
    proc: subprocess.Popen | None = None
    outdir: str | None = None
    pending = b""

    @classmethod
    def get(cls) -> subprocess.Popen:
        if cls.proc is None or cls.proc.poll() is not None:
            cls.outdir = tempfile.mkdtemp(prefix="oattn-snakemake-")
            cls.pending = b""
            cls.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("snakemake_server.py"))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, cwd=REPO)
            atexit.register(cls.stop)
        return cls.proc

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None and cls.proc.poll() is None:
            cls.proc.stdin.close()
            cls.proc.wait(timeout=60)
            FORKED_CPU[1] = FORKED_CPU[0]  # the server's children came with it
        if cls.outdir:
            shutil.rmtree(cls.outdir, ignore_errors=True)
        cls.proc = cls.outdir = None


def stop_server() -> None:
    """End this process's command server, if one runs (it is reaped: its CPU is a child's)."""
    _Server.stop()


def _reply(server: subprocess.Popen, deadline: float | None) -> dict | None:
    """The server's next reply line, or None when `deadline` (time.monotonic) passes first.
    Read from the pipe's descriptor, with the bytes after the line kept for the next call (a
    buffered reader would hold a line that select cannot see)."""
    fd = server.stdout.fileno()
    while b"\n" not in _Server.pending:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], wait)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            raise RuntimeError("the Snakemake command server ended (tests/snakemake_server.py)")
        _Server.pending += chunk
    line, _Server.pending = _Server.pending.split(b"\n", 1)
    return json.loads(line)


def run_snakemake(args: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`python -m snakemake ARGS` in `cwd` with this process's environment, as subprocess.run
    with capture_output and text would run it (TimeoutExpired after `timeout` s, the command and
    its jobs killed), in a process forked from the command server, which has imported Snakemake
    already. Its CPU time goes to FORKED_CPU (tests/cpu_budget.py counts it with this process's).
    OATTN_TEST_FORK=0 runs each command with subprocess instead."""
    argv = SNAKEMAKE + [str(a) for a in args]
    if os.environ.get("OATTN_TEST_FORK", "1") == "0":
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    server = _Server.get()
    out = Path(tempfile.mkstemp(dir=_Server.outdir, suffix=".out")[1])
    err = Path(tempfile.mkstemp(dir=_Server.outdir, suffix=".err")[1])
    try:
        server.stdin.write((json.dumps({"args": argv[3:], "cwd": str(Path(cwd).absolute()), "env": dict(os.environ),
                                        "stdout": str(out), "stderr": str(err)}) + "\n").encode())
        pid = _reply(server, None)["pid"]
        reply = _reply(server, time.monotonic() + timeout)
        timed_out = reply is None
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            reply = _reply(server, None)
        FORKED_CPU[0] += reply["cpu_s"]
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, reply["rc"], stdout, stderr)
    finally:
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)


# CPU-seconds of commands run in the background (a thread's subprocess), by the part they are
# counted under (tests/cpu_budget.py), and the lock held while one is reaped and counted: its
# CPU enters resource.RUSAGE_CHILDREN at that moment, under whichever test is running
BACKGROUND_CPU: dict[str, float] = {}
CPU_LOCK = threading.Lock()
BACKGROUND_PROCS: set[subprocess.Popen] = set()


def stop_background() -> None:
    """Kill the background commands still running (a session that ends before its build does)
    with their jobs: a build left unfinished is started again by the next session."""
    for proc in list(BACKGROUND_PROCS):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _run_in_background(argv: list[str], part: str, timeout: float) -> subprocess.CompletedProcess:
    """`argv` as subprocess.run with capture_output and text runs it, for a thread that runs
    beside the tests: its CPU goes to BACKGROUND_CPU[part], counted once it is reaped."""
    with tempfile.TemporaryDirectory(prefix="oattn-background-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, start_new_session=True)
        BACKGROUND_PROCS.add(proc)
        deadline = time.monotonic() + timeout
        while True:
            with CPU_LOCK:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    BACKGROUND_CPU[part] = BACKGROUND_CPU.get(part, 0.0) + usage.ru_utime + usage.ru_stime
                    break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.2)
        BACKGROUND_PROCS.discard(proc)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())


def snakemake(workdir: Path, config: dict, *args: str, check: bool = True,
              background: str | None = None) -> subprocess.CompletedProcess:
    """The workflow with `config` in `workdir` (run_snakemake); `background`: run by a thread
    beside the tests, as a subprocess whose CPU is counted under that part's name."""
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    args = ["-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--configfile", str(cfg), "--cores", "2",
            *args]
    if background:
        proc = _run_in_background(SNAKEMAKE + args, background, timeout=1800)
    else:
        proc = run_snakemake(args, cwd=Path.cwd(), timeout=1800)
    if check and proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    block = text.split("Job stats:")[-1]
    jobs = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def by_stage(jobs: dict[str, int]) -> dict[str, int]:
    """Planned jobs per stage: a batch job of a model's samples (rule `<stage>_batch_<model>`,
    config jobs.batch_max_entries) counts for its stage, as each per-sample job does; the
    explorer's plan and sample jobs (explorer_plan, explorer_samples) count for the explorer, and
    a sample's replicates (stability_sample) for stability."""
    out: dict[str, int] = {}
    for rule, n in jobs.items():
        stage = rule_stage(rule)
        stage = {"explorer_plan": "explorer", "explorer_samples": "explorer",
                 "stability_sample": "stability"}.get(stage, stage)
        out[stage] = out.get(stage, 0) + n
    return out


def reordered(value):
    """`value` with every mapping's keys in reverse order: the same config, written otherwise."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value
