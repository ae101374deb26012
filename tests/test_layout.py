"""The library's layout rules, read from its source: no private name crosses a module."""
import ast
import re
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "oattn_lib"


def private_imports(path: Path) -> list[str]:
    """`from <oattn_lib module> import _name` anywhere in `path` (function-local imports too)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("oattn_lib")):
            bad += [f"{path.relative_to(LIB.parent)}:{node.lineno} imports {a.name} from "
                    f"{'.' * node.level}{node.module or ''}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def test_no_module_imports_a_private_name_of_another():
    bad = [b for p in sorted(LIB.rglob("*.py")) for b in private_imports(p)]
    assert bad == [], "make these public or move them where they belong:\n" + "\n".join(bad)


def test_the_check_sees_function_local_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "oattn_lib"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n    from .x import _hidden, public, __version__\n    return _hidden\n")
    monkeypatch.setattr(__import__(__name__), "LIB", pkg)
    assert private_imports(pkg / "m.py") == ["oattn_lib/m.py:2 imports _hidden from .x"]


# -- kinds of model: only their adapters tell them apart -----------------------------------------
ROOT = LIB.parent
KIND_READERS = ("oattn_lib", "scripts", "workflow/rules", "Snakefile")
KIND_TESTS = {"==", "!=", "in"}


def _ends_in_kind(toks: list) -> bool:
    """Whether a primary expression's tokens end in `kind`: `kind`, `x.kind`, `x["kind"]`, `x.get("kind")`."""
    s = [t.string for t in toks]
    return (s[-1:] == ["kind"] or (len(s) >= 3 and s[-3] in ("[", "(") and s[-2] in ('"kind"', "'kind'")
                                   and s[-1] in ("]", ")")))


def _primary_after(toks: list, i: int) -> list:
    """The tokens of the primary expression (a name and its trailers) that starts at toks[i]."""
    import tokenize

    if i >= len(toks) or toks[i].type != tokenize.NAME:
        return []
    j, depth = i + 1, 0
    while j < len(toks):
        t = toks[j].string
        if depth:
            depth += t in "([{" and len(t) == 1
            depth -= t in ")]}" and len(t) == 1
        elif t in ("(", "["):
            depth = 1
        elif t == "." and j + 1 < len(toks) and toks[j + 1].type == tokenize.NAME:
            j += 1
        else:
            break
        j += 1
    return toks[i:j]


def _loop_target(toks: list, i: int) -> bool:
    """Whether `in` at toks[i] is a for loop's (`for name, kind in ...`), not a test."""
    for t in reversed(toks[:i]):
        if t.string == "for":
            return True
        if t.string in ("if", "elif", "while", "and", "or", "not", "return", "lambda", "assert", "=", "==",
                        "(", "[", "{", ":", "else", "yield") or t.type == 4:  # 4: NEWLINE
            return False
    return False


def kind_tests(path: Path) -> list[str]:
    """`kind == x`, `x != m["kind"]`, `m.get("kind") in (...)` and the like in `path` (Python or
    Snakemake; comments and strings do not count)."""
    import io
    import tokenize

    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)]
    bad = []
    for i, t in enumerate(toks):
        op = t.string
        if op not in KIND_TESTS or t.type not in (tokenize.OP, tokenize.NAME):
            continue
        if op == "in" and _loop_target(toks, i):
            continue
        j = i - 1 if i and toks[i - 1].string != "not" else i - 2  # `not in`
        left = toks[:j + 1]
        right = _primary_after(toks, i + 1)
        if (left and _ends_in_kind(left)) or (right and _ends_in_kind(right)):
            bad.append(f"{path.relative_to(ROOT)}:{t.start[0]} tests a model's kind: {t.line.strip()}")
    return bad


def source_files(names) -> list[Path]:
    """The Python and Snakemake files of `names` (files, or folders read whole) under ROOT."""
    files = []
    for name in names:
        p = ROOT / name
        files += [p] if p.is_file() else [f for pat in ("*.py", "*.smk", "Snakefile") for f in sorted(p.rglob(pat))]
    return [f for f in files if "__pycache__" not in f.parts]


def kind_readers() -> list[Path]:
    return [f for f in source_files(KIND_READERS) if not f.is_relative_to(LIB / "models")]


def test_only_the_model_kind_adapters_test_a_kind():
    bad = [b for p in kind_readers() for b in kind_tests(p)]
    assert bad == [], ("ask the model's adapter (oattn_lib.models.adapter(model_cfg)) instead; a new kind is "
                       "one module in oattn_lib/models/kinds:\n" + "\n".join(bad))


def test_the_kind_check_sees_every_form_and_not_loops_or_text(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    f = tmp_path / "m.smk"
    f.write_text('if kind == "txl":\n    pass\n'
                 'x = [m for m in ms if m["kind"] in ("txl", "hf")]\n'
                 'y = "hf" != model.get("kind")\n'
                 'z = layout.kind not in {"vit"}\n'
                 'def f(wildcards):\n    return ANALYSED[wildcards.model]["kind"] == "hf"\n'
                 'for name, kind in kinds.items():\n    pass\n'
                 '# a comment: kind == "txl"\n'
                 's = "kind == txl"\n'
                 'order = np.argsort(a, kind="stable")\n'
                 'rule all:\n    input:\n        f"{R}/x",\n')
    assert [b.split()[0] for b in kind_tests(f)] == [f"m.smk:{i}" for i in (1, 3, 4, 5, 7)]


# -- no import cycles between the library's modules -----------------------------------------------
def _module_name(path: Path, lib: Path) -> str:
    parts = list(path.relative_to(lib.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(lib: Path) -> dict[str, set[str]]:
    """{module: the library modules it imports anywhere (function-local imports too)}. `from P
    import name` is an edge to the module P.name where there is one, else to P itself; importing
    a module's parent packages is not counted (a package's __init__ importing its modules is
    the normal direction)."""
    modules = {_module_name(p, lib): p for p in lib.rglob("*.py") if "__pycache__" not in p.parts}
    top = lib.name
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if src.split(".")[0] != top:
                    continue
                subs = {f"{src}.{a.name}" for a in node.names} & modules.keys()
                edges |= subs or ({src} & modules.keys())
                if len(subs) < len(node.names) and src in modules:
                    edges.add(src)
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_library_modules_import_each_other():
    # a cycle means neither module can be read, tested or reused without the other (config and
    # softmax_free did: the experiment's model check now lives in config, Figure 8 in plots)
    cycles = import_cycles(module_imports(LIB))
    assert cycles == [], "modules that import each other, directly or through others: " + str(cycles)


def test_the_cycle_check_sees_local_relative_and_package_imports(tmp_path):
    pkg = tmp_path / "oattn_lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")  # the package imports its module: fine
    (pkg / "a.py").write_text("def f():\n    from .sub import g\n    return g\n")
    (pkg / "sub" / "b.py").write_text("from .. import c\ndef g():\n    return c\n")
    (pkg / "c.py").write_text("import oattn_lib.sub.b\n")
    graph = module_imports(pkg)
    assert graph["oattn_lib.a"] == {"oattn_lib.sub"} and graph["oattn_lib.sub.b"] == {"oattn_lib.c"}
    assert import_cycles(graph) == [["oattn_lib.c", "oattn_lib.sub.b"]]
    (pkg / "c.py").write_text("")
    assert import_cycles(module_imports(pkg)) == []


# -- no measured figures in comments and docstrings ------------------------------------------------
# A timing, a speed-up or a measured size in a comment goes stale with the next optimisation: it
# belongs to a benchmark's recorded output (bench/*.csv, shown on the docs' Measurements page), and
# the comment says what the code does and why, naming the benchmark that measures it. Sizes that
# follow from shapes ("270 heads at 1024 tokens are 1.1 GB"), constants ("blocks of 64 MiB") and
# rules ("every 0.5 s for its first 15 s") say nothing measured and pass.
FIGURE_READERS = ("oattn_lib", "scripts", "envs", "workflow", "Snakefile")

_NUM = r"\d+(?:[.,]\d+)?(?:\s?(?:-|–|to)\s?\d+(?:\.\d+)?)?"
_TIME = rf"\b{_NUM}\s?(?:s|ms|µs|us|ns|min|mins|minutes?|seconds?|hours?)\b"
_SIZE = rf"\b{_NUM}\s?(?:[kKMGT]i?B)\b"
# shapes of a measurement on their own: a speed-up, an approximate or compared time, a rate, a
# share of the run time, a machine named as where something ran
FIGURE_SHAPE = re.compile(
    rf"\b{_NUM}\s?(?:x|×|-fold|times)\s+(?:faster|slower|quicker|less\s+time|more\s+time|as\s+fast|as\s+slow)"
    rf"|\b(?:about|around|roughly|nearly|~)\s?{_TIME}"                             # about 13 s
    rf"|{_TIME}\s+(?:late|early|faster|slower|per|each|a\s+pass|instead)\b"         # 4.1 s per window
    rf"|\b(?:instead\s+of|against|versus|vs\.?|from|->|→)\s*(?:{_TIME}|{_SIZE})"   # instead of 31 s
    rf"|\b(?:missed|lost|freed|used)\s+(?:up\s+to\s+|about\s+)?{_SIZE}"           # missed up to 1.2 GB
    rf"|\b{_NUM}\s?%\s+of\s+(?:\S+\s+){{0,2}}(?:time|CPU|run\s?time|wall)"          # 70% of its time
    r"|\d\S*\s+\S+\s+per\s+(?:core-)?second\b"                                     # abs-diffs per second
    r"|\bon\s+(?:a|an|the|this|one)\s+(?:\d+-core\s+)?(?:AMD\s+|Intel\s+)?(?:EPYC|Xeon|Zen\s?\d)\b",
    re.IGNORECASE)
# words that make a time or size on the same line a measurement rather than a rule or a shape
_MEASURED = (r"\b(?:measured|took|takes|taking|spent|spends|saved|saves|costs?|peak(?:s|ed)?\s+(?:at|of)"
             r"|of\s+CPU|CPU-s(?:econds)?|wall|RSS|on\s+(?:one|a\s+single|\d+)\s+(?:threads?|cores?)"
             r"|on\s+(?:a|an|the|this)\s+\S*\s*(?:machine|cores?|EPYC|Xeon|GPU|H100))\b")
MEASURED_FIGURE = re.compile(rf"{FIGURE_SHAPE.pattern}|(?=.*{_MEASURED}).*(?:{_TIME}|{_SIZE})", re.IGNORECASE)


def comment_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every comment and docstring line of `path`: for Python, its comments
    (`tokenize`) and every string standing alone as a statement (`ast`: module, class and function
    docstrings, and those under a constant); for a Snakemake file, its lines that start with #."""
    import io
    import tokenize

    text = path.read_text()
    if path.suffix != ".py":
        return [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.lstrip().startswith("#")]
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out += [(node.value.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return sorted(out)


def measured_figures(path: Path) -> list[str]:
    """`file:line: text` for each comment or docstring line of `path` that quotes a measured figure,
    or starts one that the next line ends ("about 20" then "times faster")."""
    lines = comment_lines(path)
    bad = []
    for k, (n, line) in enumerate(lines):
        nxt = lines[k + 1][1].strip().lstrip("#") if k + 1 < len(lines) and lines[k + 1][0] == n + 1 else ""
        if MEASURED_FIGURE.search(line) or (nxt and not FIGURE_SHAPE.search(nxt)
                                            and FIGURE_SHAPE.search(line.strip() + " " + nxt.strip())):
            bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return bad


def figure_readers() -> list[Path]:
    return source_files(FIGURE_READERS)


def test_no_comment_or_docstring_quotes_a_measured_figure():
    bad = [b for p in figure_readers() for b in measured_figures(p)]
    assert bad == [], ("say what the code does and why, and name the benchmark that measures it; the figure "
                       "belongs to its recorded output (bench/*.csv):\n" + "\n".join(bad))


def test_the_figure_check_sees_timings_and_speedups_not_shapes_or_rules(tmp_path, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    f = tmp_path / "m.py"
    f.write_text('"""A module.\n\nmeasured: 3.2x faster than the loop.\n"""\n'          # 3
                 "x = 1  # 17.9 s of CPU on the default run\n"                              # 5
                 "# transformers dequantises it (about 13 s for 30 layers)\n"              # 6
                 'LIMIT = 2 << 30\n"""Bytes: the job peaks at 1.6 GB, so it asks 2.1 GB."""\n'  # 8
                 "# the training started 60 s late\n"                                       # 9
                 "# numpy's check is 10 times faster than torch's\n"                        # 10
                 "# chunks of 64 MiB; a 2 GB limit the user sets\n"
                 "# 270 heads at 1024 tokens are 1.1 GB\n"
                 "# Snakemake samples a job every 0.5 s for its first 15 s\n"
                 's = "17.9 s of CPU, measured"\n'
                 "def f():\n    '''Took 4.1 s per window on a 2-core machine.'''\n"       # 16
                 "# the same numbers, about 20\n# times faster\n"                          # 17
                 "# 10 ms instead of 110 ms; 2.3e10 abs-diffs per core-second\n"            # 19
                 "# run on a 2-core AMD EPYC\n")                                            # 20
    assert [b.split(":")[1] for b in measured_figures(f)] == ["3", "5", "6", "8", "9", "10", "16", "17", "19", "20"]
    smk = tmp_path / "r.smk"
    smk.write_text('# measured: 17.9 s of CPU\nrule a:\n    shell: "sleep 3  # took 3 s"\n# every 30 s\n')
    assert measured_figures(smk) == ["r.smk:1: # measured: 17.9 s of CPU"]
