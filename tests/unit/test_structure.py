"""The shape of the code, measured from the code itself (the redesign's rules).

- no module of ``cluster/``, ``client/`` or ``tui/`` is over 700 lines;
- no import cycle between modules (``TYPE_CHECKING`` and function-level imports count);
- ``cluster/core`` imports no trio, anyio, socket, time, os or threading: it is pure;
- no module imports another module's private (``_``-prefixed) names;
- the largest class in ``cluster/core`` has at most 40 methods, counting those it
  inherits from other classes of ``cluster/core`` (mixins only cut a class to a length);
- no class in ``cluster/core`` is put together from several (no mixins: its parts are
  objects it holds).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "client", "tui")
MAX_LINES = 700
MAX_CORE_METHODS = 40
IO_MODULES = {"trio", "anyio", "socket", "time", "os", "threading"}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> list[tuple[str, str | None]]:
    """``(module imported, name imported from it or None)`` for every import."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            found += [(target, alias.name) for alias in node.names]
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module in MODULES:
        deps: set[str] = set()
        for target, name in imports(module):
            if name is not None and f"{target}.{name}" in MODULES:
                deps.add(f"{target}.{name}")
            elif target in MODULES:
                deps.add(target)
        deps.discard(module)
        edges[module] = deps
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_is_over_700_lines() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_no_io() -> None:
    bad = [
        (module, target)
        for module in MODULES
        if module.startswith("cluster.core")
        for target, _name in imports(module)
        if target.split(".")[0] in IO_MODULES
    ]
    assert bad == []


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [
        (module, target, name)
        for module in MODULES
        for target, name in imports(module)
        if name is not None
        and name.startswith("_")
        and not name.startswith("__")
        and target.split(".")[0] in PACKAGES
    ]
    assert bad == []


def core_classes() -> dict[str, ast.ClassDef]:
    """Every class of ``cluster/core`` by its bare name (the core's names are unique)."""
    return {
        node.name: node
        for module, tree in TREES.items()
        if module.startswith("cluster.core")
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def method_count(name: str, classes: dict[str, ast.ClassDef]) -> int:
    """The methods of a core class, with those it inherits from core classes."""
    node = classes[name]
    own = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
    inherited = sum(
        method_count(base.id, classes)
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in classes
    )
    return own + inherited


def test_the_largest_core_class_has_at_most_40_methods() -> None:
    classes = core_classes()
    sizes = {name: method_count(name, classes) for name in classes}
    assert max(sizes.values()) <= MAX_CORE_METHODS, sorted(sizes.items(), key=lambda i: i[1])[-3:]


def test_no_core_class_is_made_of_mixins() -> None:
    """A class with two bases or more (``Protocol`` aside) is mixins: its parts should
    be objects it holds and calls, each with its own state."""
    mixed = {
        name: [ast.unparse(base) for base in node.bases]
        for name, node in core_classes().items()
        if len([b for b in node.bases if ast.unparse(b) != "Protocol"]) > 1
    }
    assert mixed == {}


def test_no_two_test_modules_share_a_name() -> None:
    """Test folders are not packages: two ``test_x.py`` in two folders clash when one
    run collects both ("import file mismatch"), which a run of one folder does not show."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
