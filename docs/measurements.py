"""The measurements page: the benchmarks' recorded outputs, read at each build of the site.

The benchmarks under bench/ are scripts that print numbers; some record them: a CSV whose
rows are the history of a measurement (bench/fresh_clone.csv, bench/resources.csv, ...), and
bench/budget.yaml, the CPU budgets CI holds. `render` turns those files and the scripts'
headers (what each measures, how to run it again) into markdown; the site's hook
(docs/hooks.py) builds the page measurements.md from it. No figure on the page is typed by
hand: a new row recorded in a CSV is on the page at the next build.
"""
from __future__ import annotations

import ast
import csv
import functools
import re
from pathlib import Path

import yaml

# libyaml's parser where PyYAML has it (the pure-Python one is several times slower)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


# -- the scripts' headers ------------------------------------------------------------------
def header(path: Path) -> str:
    """The header of a benchmark script: a Python module's docstring, a shell script's first
    block of comments (after the #! line)."""
    return _header(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _header(path: Path, mtime_ns: int) -> str:
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text)) or ""
    lines = []
    for line in text.splitlines():
        if line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines).strip()


def _prose(text: str) -> str:
    """`text` as markdown prose: outside code spans, the characters markdown would read as
    emphasis or HTML are escaped."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("*", r"\*").replace("<", "&lt;").replace("_", r"\_")
                   for p in parts)


def header_markdown(text: str) -> str:
    """A script's header as markdown: runs of indented lines (the commands it shows) become
    code blocks, the other lines prose."""
    out, run = [], []

    def flush():
        # commands follow a blank line or a colon; other indented lines continue a list item
        before = out[-1].rstrip() if out else ""
        if run and _COMMAND.match(run[0]) and (not before or before.endswith(":")):
            out.extend(["", "```bash", *(line.strip() for line in run), "```", ""])
        else:  # indented prose: a list item's continuation
            out.extend(_prose(line) for line in run)
        run.clear()

    for line in text.splitlines():
        if line.startswith("  ") and line.strip():
            run.append(line)
        else:
            flush()
            out.append(_prose(line))
    flush()
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def summary(text: str) -> str:
    """The first sentence of a header."""
    first = " ".join(text.split("\n\n")[0].split())
    m = re.match(r"(.+?[.:])(\s|$)", first)
    return (m.group(1) if m else first).rstrip(":.") + "."


# an indented line of a header that runs something
_COMMAND = re.compile(r"\s+(\S*python\S* |bench/|\.venv/|make |[A-Z_]+=\S+ |bash |snakemake )")


def commands(text: str) -> list[str]:
    """The commands a header shows (its indented lines that run something)."""
    return [line.strip() for line in text.splitlines() if line.startswith("  ") and _COMMAND.match(line)]


def recorders(name: str, bench: Path = BENCH) -> list[Path]:
    """The benchmark scripts whose header names the record `name` (bench/<name>)."""
    return [p for p in sorted(bench.iterdir()) if p.suffix in (".py", ".sh") and f"bench/{name}" in header(p)]


# -- the records ---------------------------------------------------------------------------------
def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def minutes(seconds: str | float) -> str:
    """Seconds as "9 min 24 s" (whole seconds, rounded down)."""
    s = int(float(seconds))
    return f"{s // 60} min {s % 60:02d} s"


def latest_fresh_clone(rows: list[dict]) -> dict[str, dict]:
    """{command: its latest row measured on a fresh clone (note "fresh clone...", a total)}."""
    out = {}
    for row in rows:
        if row.get("note", "").startswith("fresh clone") and row.get("total_s"):
            out[row["command"]] = row
    return out


def _cell(value) -> str:
    return str(value if value is not None else "").replace("|", r"\|").replace("\n", " ")


def table(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or list(rows[0]) if rows else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else "" for line in text.splitlines())


def history(rows: list[dict], what: str) -> str:
    """Every row, in a block the reader opens."""
    return f'??? note "{what}: {len(rows)} rows, oldest first"\n\n' + _indent(table(rows)) + "\n"


def fresh_clone_section(path: Path) -> str:
    rows = read_csv(path)
    latest = latest_fresh_clone(rows)
    shown = [{"command": f"`make {c}`" if c in ("run", "test") else c, "total": minutes(r["total_s"]),
              "set-up (s)": r["setup_s"], "command (s)": r["command_s"], "date": r["date"], "commit": r["commit"],
              "cores": r["cores"], "CPU": r["cpu"], "note": r["note"]} for c, r in latest.items()]
    return ("### Latest figure of each command\n\n"
            "The latest row of each command measured on a fresh clone (set-up included in the total):\n\n"
            + table(shown) + "\n\n" + history(rows, "Every measurement"))


def csv_section(path: Path) -> str:
    rows = read_csv(path)
    if not rows:
        return "No rows recorded yet.\n"
    cols = list(rows[0])
    keys = [c for c in ("source", "model", "rule") if c in cols]
    text = f"{len(rows)} rows"
    if keys:
        groups = {tuple(r[k] for k in keys) for r in rows}
        text += f" of {len(groups)} ({', '.join(keys)}) combinations"
    return text + ".\n\n" + history(rows, "The record")


def budget_section(path: Path) -> str:
    budget = yaml.load(path.read_text(), Loader=_LOADER)  # noqa: S506 (a safe loader)
    out = []
    for name, what in (("run", "`make run`: CPU-seconds per stage"), ("test", "`make test`: CPU-seconds per test "
                                                                             "module and fixture")):
        if name not in budget:
            continue
        b = budget[name]
        parts = sorted(b.get("parts", {}).items(), key=lambda kv: -kv[1])
        out.append(f"### {what}\n\nTotal {b['total_cpu_s']} CPU-seconds (reference workload "
                   f"{b['reference_cpu_s']} s; tolerance {b['tolerance']:.0%}, a part's "
                   f"{b['part_tolerance']:.0%} and {b['part_min_s']} s).\n\n"
                   + history([{"part": f"`{k}`", "CPU-seconds": v} for k, v in parts], "The parts"))
    return "\n".join(out)


INTRO = """\
# Measurements

What the project's benchmarks have measured, read from the files they record at each build
of this site: nothing here is typed by hand. The benchmarks are scripts under `bench/` that
print numbers (they are not tests); the ones below also keep a record, one row per
measurement, so that the history stays. Each section says what its script measures and how
to run it again, from the script's own header.
"""


def render(root: Path = ROOT) -> str:
    """The markdown of the measurements page, from the records and scripts under root/bench."""
    bench = root / "bench"
    out = [INTRO]
    recorded: set[Path] = set()
    records = sorted(bench.glob("*.csv"), key=lambda p: (p.name != "fresh_clone.csv", p.name))
    if (bench / "budget.yaml").exists():
        records.insert(1 if records and records[0].name == "fresh_clone.csv" else 0, bench / "budget.yaml")
    for path in records:
        scripts = recorders(path.name, bench)
        out.append(f"## `bench/{path.name}`\n")
        for script in scripts:
            if script in recorded:
                out.append(f"Recorded by `bench/{script.name}` (above).\n")
            else:
                out.append(f"Recorded by `bench/{script.name}`:\n\n" + _quote(header_markdown(header(script))) + "\n")
            recorded.add(script)
        if path.name == "fresh_clone.csv":
            out.append(fresh_clone_section(path))
        elif path.name == "budget.yaml":
            out.append(budget_section(path))
        else:
            out.append(csv_section(path))
    others = [p for p in sorted(bench.iterdir()) if p.suffix in (".py", ".sh") and p not in recorded]
    if others:
        out.append("## The other benchmarks\n\nThey print what they measure and keep no record; run them "
                   "again to measure on your machine.\n")
        for script in others:
            text = header(script)
            cmds = commands(text)
            out.append(f"### `bench/{script.name}`\n\n{_prose(summary(text))}\n"
                       + ("\n```bash\n" + "\n".join(cmds) + "\n```\n" if cmds else ""))
    return "\n".join(out).rstrip() + "\n"


def _quote(text: str) -> str:
    """`text` in a collapsible block that starts open (pymdownx.details)."""
    return '???+ info "What it measures, how to run it"\n\n' + _indent(text)
