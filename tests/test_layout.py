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
