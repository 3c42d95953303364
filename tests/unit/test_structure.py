"""The shape a newcomer relies on, checked on the source itself: the server's functions stay
short enough to read at once, and the scheduler keeps no state of its own between calls
(its caches are objects the caller owns and passes in)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "shoal"
LONGEST_SERVER_FUNCTION = 80  # lines, its decorators left out
MUTATORS = {"append", "add", "update", "setdefault", "clear", "pop", "popitem", "extend", "insert", "remove",
            "discard", "move_to_end"}
MEMOISERS = {"cache", "lru_cache", "functools.cache", "functools.lru_cache"}


def shown(path: Path) -> str:
    return str(path.relative_to(SRC.parent)) if path.is_relative_to(SRC.parent) else str(path)


def functions(root: Path):
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield shown(path), node


def long_functions(root: Path, limit: int) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node in functions(root) if node.end_lineno - node.lineno + 1 >= limit]


def module_state(root: Path) -> list[str]:
    """Module-level names a function of the module writes to (``global``, item assignment or a
    mutating method), and memoised functions: state that outlives one call."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            where = f"{shown(path)}:{fn.lineno} {fn.name}"
            found += [f"{where} memoised" for d in fn.decorator_list
                      if ast.unparse(d.func if isinstance(d, ast.Call) else d) in MEMOISERS]
            local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            for node in ast.walk(fn):
                if isinstance(node, ast.Global):
                    found.append(f"{where} global {', '.join(node.names)}")
                elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store) \
                        and isinstance(node.value, ast.Name) and node.value.id in names - local:
                    found.append(f"{where} writes {node.value.id}")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name) \
                        and node.func.value.id in names - local:
                    found.append(f"{where} changes {node.func.value.id}")
    return found


def test_no_function_of_the_server_is_as_long_as_80_lines():
    assert long_functions(SRC / "server", LONGEST_SERVER_FUNCTION) == []


def test_the_scheduler_keeps_no_state_between_calls():
    assert module_state(SRC / "sched") == []
    assert module_state(SRC / "model") == []


@pytest.mark.parametrize("source, expected", [
    ("CACHE = {}\ndef f(k):\n    CACHE[k] = 1\n", "writes CACHE"),
    ("SEEN = []\ndef f(k):\n    SEEN.append(k)\n", "changes SEEN"),
    ("N = 0\ndef f():\n    global N\n    N += 1\n", "global N"),
    ("import functools\n@functools.lru_cache(maxsize=None)\ndef f(k):\n    return k\n", "memoised"),
])
def test_the_checks_find_what_they_look_for(tmp_path, source, expected):
    (tmp_path / "m.py").write_text(source)
    assert [f for f in module_state(tmp_path) if expected in f], source
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * 80)
    assert long_functions(tmp_path, LONGEST_SERVER_FUNCTION)
