"""CPU budgets of the default run and of the test suite, held by CI (bench/budget.yaml).

The default run (`make run`) and `make test` must each stay within 10 minutes on a fresh
2-core machine. bench/budget.yaml records what each costs in CPU-seconds, per stage (a rule,
summed over its models and samples) and per test module, as measured on a fresh clone; CI
measures again and fails when

- the total, divided by the machine's speed relative to the recording machine (the reference
  factor: a fixed pure-Python workload's CPU time, measured by this script beside the record and
  again beside the check), exceeds the recorded total by more than `tolerance`, or
- one part (a stage, a test module) exceeds its record by more than `part_tolerance` and by
  more than `part_min_s` seconds, after dividing by the machine factor: the larger of the
  median over the recorded parts of at least `part_min_s` of measured / recorded (held within
  0.5 to 2) and the reference factor below. A machine slower everywhere moves every part and the
  median with it; a stage that doubles moves alone, and fails on any machine. The median follows
  the numerical work most parts do, the reference workload the pure Python of the modules that
  plan Snakemake runs; the two move apart between machines, and a part is held to the slower.
  Parts under `part_min_s` are held by the total.
- a part appears that the record does not have and costs at least `part_min_s`: add it to
  bench/budget.yaml with a commit that says why. A smaller new part, and a recorded part that
  did not run, are notes, not failures.

The failures name the parts that grew most, largest growth first; a total over its budget names
the three parts that added most to it.

Two factors, because neither alone does both jobs. Machines differ (AVX-512 or not, clock,
caches), so an absolute CPU total fails on a slower machine for nothing. The parts' median
follows the machine, but also a change that slows every part alike; the reference workload
moves with the machine only, so it holds the total, and a change adding a quarter to every
part fails. Where the two factors disagree by more than
`tolerance` the check says so: the workload does not stand for the machine there, or most parts
grew.

CPU-seconds, not wall time: they vary less between machines and between runs. The default
run's come from its jobs' logs (`resources used: ... CPU c s`, written by `runtime.job_usage`
for the whole job, children included); the suite's from the per-process files the pytest plugin
tests/cpu_budget.py writes when OATTN_TEST_CPU_DIR is set (per module, CPU of the test process
and of the processes it waited for; a session fixture's build under `fixture:<name>`; each
process's start-up and collection, outside any test, under `session:collection`).

    python bench/budget.py run results              # check the default run's logs
    python bench/budget.py test CPU_DIR             # check a suite run with OATTN_TEST_CPU_DIR=CPU_DIR
    python bench/budget.py record run results       # write the measured breakdown into budget.yaml
    python bench/budget.py add test CPU_DIR         # add only the new parts, in the record's units
    python bench/budget.py record test CPU_DIR

Raising a budget is a commit that says why (what was added, what it costs).
"""
from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from oattn_lib.runtime import read_job_usage  # noqa: E402
from stages import rule_of  # noqa: E402

BUDGET = ROOT / "bench" / "budget.yaml"
DEFAULTS = {"tolerance": 0.25, "part_tolerance": 0.5, "part_min_s": 10.0}
# the reference workload's factor is held within these: a machine 3x slower than the recording
# one is a broken machine to report, not one to excuse
REFERENCE_CLAMP = (0.5, 2.5)
HEADER = """# CPU budgets, checked by CI with bench/budget.py (its docstring has the rules): the default
# run's CPU-seconds per stage (rule, summed over models and samples, from its jobs' logs) and the
# suite's per test module, per session fixture's build and for collection (tests/cpu_budget.py),
# measured on a fresh clone on 2 cores. CPU-seconds, not wall time: they vary less between
# machines and runs.
# tolerance (0.25): how far the total may exceed its record times the reference factor (a fixed
#   pure-Python workload's CPU, reference_cpu_s, measured beside the record and beside the check);
#   wide enough for the spread between runs, narrow enough that a change adding a quarter fails.
# part_tolerance (0.5) and part_min_s (10): how far one stage or module may exceed its record,
#   relative and in seconds, after dividing by the machine factor (the median part's measured /
#   recorded or the reference factor, the larger, so that a machine slower everywhere, in its
#   numerical or its pure-Python work, moves no part alone while a doubled part, +100%, still
#   fails with margin). One part is noisier than the sum (a few jobs; numba's
#   compilation; for a test module, which xdist worker builds a shared fixture), so its tolerance
#   is twice the total's; parts under 10 s are mostly start-up and are held by the total.
# Raising a budget is a commit that says why: python bench/budget.py record run|test PATH
"""


def reference_cpu_s(repeats: int = 3) -> float:
    """CPU-seconds of a fixed pure-Python workload (parse, compile and run 600 small functions,
    a JSON round trip; the kind of work the suite's imports, fingerprints and job start-ups do),
    the least of `repeats` tries: this machine's speed, to be divided by the recording machine's.
    Fixed text, so that it measures the machine and never the project's code."""
    src = "".join(f"def f{i}(a, b=2):\n    d = {{'k': a, 'v': [a * j + b for j in range({i % 50})]}}\n"
                  "    return sorted(d['v'], reverse=True)[:3]\n" for i in range(600))
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        for _ in range(5):
            tree = ast.parse(src)
            ast.dump(tree)
            ns: dict = {}
            exec(compile(tree, "<reference>", "exec"), ns)
            out = [ns[f"f{i}"](i) for i in range(600)]
            json.loads(json.dumps({str(i): v for i, v in enumerate(out)}))
        best = min(best, time.process_time() - t)
    return best


def run_parts(results: Path) -> dict[str, float]:
    """{stage: CPU-seconds} summed over the job logs under `results`/logs that end with the
    job's usage line: logs/<model>/<rule>[_sample<k>|_samples<a>-<b>|_part<k>].log, logs/<rule>.log;
    the stage is the rule, summed over models and samples (`stages.rule_of`)."""
    logs = Path(results) / "logs"
    parts: dict[str, float] = {}
    for log in sorted(logs.rglob("*.log")) if logs.is_dir() else ():
        usage = read_job_usage(log)
        if usage is not None:
            stage = rule_of(log.stem)
            parts[stage] = parts.get(stage, 0.0) + usage["cpu_s"]
    if not parts:
        raise SystemExit(f"{logs}: no job log with a 'resources used' line (run the workflow first)")
    return parts


def test_parts(cpu_dir: Path) -> dict[str, float]:
    """{test module or fixture:<name>: CPU-seconds} summed over the files the plugin wrote."""
    files = sorted(Path(cpu_dir).glob("*.json"))
    if not files:
        raise SystemExit(f"{cpu_dir}: no per-process CPU file (run pytest with OATTN_TEST_CPU_DIR={cpu_dir})")
    parts: dict[str, float] = {}
    for f in files:
        for name, s in json.loads(f.read_text())["modules"].items():
            parts[name] = parts.get(name, 0.0) + float(s)
    return parts


def compare(record: dict, measured: dict[str, float], reference: float | None = None
            ) -> tuple[list[str], list[str], dict[str, float], list[tuple]]:
    """`measured` ({part: CPU-seconds}) against a section of the budget.

    `reference` is `reference_cpu_s()` on the measuring machine; with the section's own
    (measured beside the record) it gives the factor the total is judged with. Without either,
    the total is judged as recorded, absolute, and a note says so.

    Returns
    -------
    failures : list of str
        Sentences, the total's first, then the parts largest growth first.
    notes : list of str
        New parts under `part_min_s`, recorded parts that did not run, a reference factor
        that disagrees with the parts' median.
    factors : dict
        "parts": the parts' median factor; "reference": the reference workload's, the total
        was judged with (1.0 where there is none); "part": the larger of the two, each part
        was judged with.
    rows : list of (part, recorded or None, measured or None, measured / recorded / part factor)
        Every part, largest growth (measured - recorded x part factor) first; the ratio is NaN where
        the part is new or did not run, or was recorded as 0.
    """
    rules = {k: float(record.get(k, v)) for k, v in DEFAULTS.items()}
    recorded = {k: float(v) for k, v in record.get("parts", {}).items()}
    floor = rules["part_min_s"]
    ratios = [measured[k] / v for k, v in recorded.items() if v >= floor and k in measured]
    factor = min(2.0, max(0.5, statistics.median(ratios))) if ratios else 1.0
    notes: list[str] = []
    recorded_ref = record.get("reference_cpu_s")
    if reference and recorded_ref:
        ref = min(REFERENCE_CLAMP[1], max(REFERENCE_CLAMP[0], reference / float(recorded_ref)))
        if ratios and not 1 / (1 + rules["tolerance"]) <= factor / ref <= 1 + rules["tolerance"]:
            notes.append(f"the parts' median factor {factor:.2f} and the reference workload's {ref:.2f} disagree: "
                         "most parts grew or shrank, or the workload does not stand for this machine")
    else:
        ref = 1.0
        notes.append("no reference workload on " + ("record" if reference else "this check")
                     + ": the total is judged as recorded, on any machine (bench/budget.py record)")
    # A part is judged against the slower of the two readings of the machine: the parts' median
    # follows the numerical work (BLAS, numba, torch), which most parts are; the reference
    # workload follows pure Python, which the Snakemake-planning modules are. The two move apart
    # between machines (AVX-512 or not, clock), and a part that grew by both readings grew.
    part_factor = max(factor, ref)
    grown, rows = [], []
    for part in sorted(set(recorded) | set(measured)):
        rec, got = recorded.get(part), measured.get(part)
        if rec is None:
            rows.append((part, None, got, float("nan")))
            if got >= floor:
                grown.append((got, f"{part}: {got:.0f} s of CPU, not in the budget (add it to bench/budget.yaml "
                                   "with a commit that says why: bench/budget.py record)"))
            else:
                notes.append(f"{part}: new, {got:.1f} s of CPU (under {floor:g} s: held by the total; "
                                 "record it with the next budget commit)")
            continue
        if got is None:
            rows.append((part, rec, None, float("nan")))
            notes.append(f"{part}: recorded ({rec:.1f} s) but did not run")
            continue
        rows.append((part, rec, got, got / (rec * part_factor) if rec > 0 else float("nan")))
        if got > rec * part_factor * (1 + rules["part_tolerance"]) and got - rec * part_factor > floor:
            grown.append((got - rec * part_factor,
                          f"{part}: {got:.0f} s of CPU against {rec:.0f} s recorded ({got / rec:.2f}x; "
                          f"{got / (rec * part_factor):.2f}x after the machine factor {part_factor:.2f})"
                          if rec > 0 else
                          f"{part}: {got:.0f} s of CPU against 0 s recorded"))
    rows.sort(key=lambda r: -((r[2] or 0.0) - (r[1] or 0.0) * part_factor))
    failures = []
    total, budget = sum(measured.values()), float(record["total_cpu_s"])
    if total > budget * ref * (1 + rules["tolerance"]):
        added = sorted(((measured.get(k, 0.0) - recorded.get(k, 0.0) * ref, k)
                        for k in set(recorded) | set(measured)), reverse=True)[:3]
        failures.append(f"total {total:.0f} s of CPU exceeds the budget {budget:.0f} s x the reference factor "
                        f"{ref:.2f} by more than {rules['tolerance']:.0%} (added most: "
                        + ", ".join(f"{k} {d:+.0f} s" for d, k in added) + ")")
    failures += [sentence for _, sentence in sorted(grown, key=lambda g: -g[0])]
    return failures, notes, {"parts": factor, "reference": ref, "part": part_factor}, rows


def check(what: str, measured: dict[str, float], budget_path: Path = BUDGET, reference: float | None = None) -> int:
    """Print `measured` against the `what` section (run, test) of the budget as a table, largest
    growth first, and the failures; 1 where there are any, else 0. `reference`: this machine's
    `reference_cpu_s()`, measured here when not given."""
    budget = yaml.safe_load(budget_path.read_text())
    if what not in (budget or {}):
        raise SystemExit(f"{budget_path}: no `{what}` section (bench/budget.py record {what} ...)")
    if reference is None:
        reference = reference_cpu_s()
    failures, notes, factors, rows = compare(budget[what], measured, reference)
    factor = factors["parts"]
    print(f"{what}: {sum(measured.values()):.0f} s of CPU against {float(budget[what]['total_cpu_s']):.0f} s "
          f"budgeted; machine factor {factor:.2f} (the parts' median), reference factor {factors['reference']:.2f} "
          f"(a fixed workload, {reference:.2f} s here); parts judged with {factors['part']:.2f}")
    print(f"| {'stage' if what == 'run' else 'test module'} | recorded (s) | measured (s) | ratio / factor |")
    print("|---|---|---|---|")

    def cell(v):
        return "-" if v is None else f"{v:.1f}"

    for part, rec, got, ratio in rows:
        shown = "new" if rec is None else "-" if ratio != ratio else f"{ratio:.2f}"
        print(f"| {part} | {cell(rec)} | {cell(got)} | {shown} |")
    if notes:
        print("\nnotes:\n  " + "\n  ".join(notes))
    if failures:
        print(f"\nover the {what} budget (bench/budget.yaml):\n  " + "\n  ".join(failures))
        return 1
    return 0


def record(what: str, measured: dict[str, float], budget_path: Path = BUDGET, reference: float | None = None) -> None:
    """Rewrite the `what` section of the budget with `measured` and this machine's reference
    workload (measured here when not given), keeping its tolerances and the other section."""
    budget = yaml.safe_load(budget_path.read_text()) if budget_path.is_file() else {}
    budget = budget or {}
    old = budget.get(what, {})
    budget[what] = {**{k: old.get(k, v) for k, v in DEFAULTS.items()},
                    "total_cpu_s": round(sum(measured.values()), 1),
                    "reference_cpu_s": round(reference_cpu_s() if reference is None else reference, 3),
                    "parts": {k: round(v, 1) for k, v in sorted(measured.items())}}
    _write(budget, budget_path)
    print(f"{budget_path}: {what} recorded, {sum(measured.values()):.0f} s of CPU; commit it saying why")


def add_new_parts(what: str, measured: dict[str, float], budget_path: Path = BUDGET,
                  reference: float | None = None) -> dict[str, float]:
    """Add to the `what` section the parts `measured` has and the record lacks, in the recording
    machine's units: each divided by the factor the check judges parts with on this machine
    (`compare`), the total raised by their sum; the recorded parts, the reference workload and
    the tolerances stay. For a machine unlike the recording one (another CPU, no browser for the
    browser tests), where recording everything again would move every part. Returns the parts
    added."""
    budget = yaml.safe_load(budget_path.read_text())
    section = budget[what]
    _, _, factors, _ = compare(section, measured, reference_cpu_s() if reference is None else reference)
    new = {k: round(v / factors["part"], 1) for k, v in measured.items() if k not in section["parts"]}
    section["parts"] = dict(sorted({**section["parts"], **new}.items()))
    section["total_cpu_s"] = round(float(section["total_cpu_s"]) + sum(new.values()), 1)
    _write(budget, budget_path)
    print(f"{budget_path}: {what}: added {', '.join(f'{k} {v} s' for k, v in new.items()) or 'nothing'} "
          f"(measured / {factors['part']:.2f}); commit it saying why")
    return new


def _write(budget: dict, budget_path: Path) -> None:
    lines = [HEADER.rstrip("\n")]
    for section in ("run", "test"):
        if section not in budget:
            continue
        s = budget[section]
        lines += [f"{section}:", f"  total_cpu_s: {s['total_cpu_s']}"]
        if "reference_cpu_s" in s:
            lines.append(f"  reference_cpu_s: {s['reference_cpu_s']}")
        lines += [f"  {k}: {s[k]}" for k in DEFAULTS]
        lines.append("  parts:")
        lines += [f"    {json.dumps(k)}: {v}" for k, v in s["parts"].items()]
    tmp = budget_path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(budget_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("args", nargs="+", help="run RESULTS | test CPU_DIR, after nothing, `record` or `add`")
    ap.add_argument("--budget", type=Path, default=BUDGET)
    ns = ap.parse_args(argv)
    a = ns.args
    action = a[0] if a[0] in ("record", "add") else None
    if action:
        a = a[1:]
    if len(a) != 2 or a[0] not in ("run", "test"):
        ap.error("expected: [record | add] run RESULTS | [record | add] test CPU_DIR")
    measured = run_parts(Path(a[1])) if a[0] == "run" else test_parts(Path(a[1]))
    if action == "record":
        record(a[0], measured, ns.budget)
        return 0
    if action == "add":
        add_new_parts(a[0], measured, ns.budget)
        return 0
    return check(a[0], measured, ns.budget)


if __name__ == "__main__":
    sys.exit(main())
