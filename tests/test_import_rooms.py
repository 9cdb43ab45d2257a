"""One-way rooms: no import cycle inside a package (runtime imports, function-local ones included;
``if TYPE_CHECKING:`` blocks are annotations only and excluded). docs/design.md, "one-way dependencies"."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _runtime_imports(path: Path, package: str) -> set[str]:
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    mod_parts = path.relative_to(ROOT).with_suffix("").parts
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(mod_parts[:-node.level]) if path.name != "__init__.py" else list(mod_parts[:len(mod_parts) - node.level])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] == package)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts): p
               for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"}
    return {m: {n for n in _runtime_imports(p, package) if n in modules and n != m} for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


@pytest.mark.parametrize("package", ["precision_floor", "parity", "dsv4", "reference"])
def test_no_import_cycle(package):
    cycle = _cycle(_graph(package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_detector_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_floor_data_flows_one_way():
    g = _graph("precision_floor")
    assert "precision_floor.search" not in g["precision_floor.render"]
    assert "precision_floor.flips" not in g["precision_floor.render"]
