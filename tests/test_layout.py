"""The library's layout rules, read from its source: no private name crosses a module."""
import ast
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


def kind_readers() -> list[Path]:
    files = []
    for name in KIND_READERS:
        p = ROOT / name
        files += [p] if p.is_file() else sorted(p.rglob("*.py")) + sorted(p.rglob("*.smk"))
    return [f for f in files if not f.is_relative_to(LIB / "models")]


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
