"""The package's imports form no circle (docs/architecture.md, "Rules of the house"), read off
the source with `ast`: every import a module runs (at its top or inside a function) points
one way, so no function-local import is there to break a circle; and no module imports
another's private name (`from x import _name`): what crosses a module is public and says so.
Imports under `if TYPE_CHECKING:` name types only and never run: they may point anywhere."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


@dataclass(frozen=True)
class Edge:
    """One import that runs: `source` imports `target` (at line `line`), from a function's
    body when `local`."""

    source: str
    target: str
    line: int
    local: bool


def _sources() -> dict[str, str]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path.read_text()
    return out


def _is_type_checking(node: ast.If) -> bool:
    return ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports(
    module: str, tree: ast.AST, modules: Mapping[str, str], *, local: bool = False
) -> list[tuple[str, str, int, bool]]:
    """(target module, name imported or "", line, local) of each import that runs."""
    out: list[tuple[str, str, int, bool]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            out += [i for n in node.orelse for i in _imports(module, n, modules, local=local)]
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno, local) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                if whole in modules:
                    out.append((whole, "", node.lineno, local))
                elif node.module in modules:
                    out.append((node.module, alias.name, node.lineno, local))
        inner = local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        out += _imports(module, node, modules, local=inner) if not _leaf(node) else []
    return out


def _leaf(node: ast.AST) -> bool:
    return isinstance(node, ast.Import | ast.ImportFrom)


def graph(sources: Mapping[str, str]) -> tuple[list[Edge], list[str]]:
    """The imports that run between `sources`' modules, and each `from x import _name` of
    another module's private name."""
    edges, private = [], []
    for module, text in sources.items():
        for target, name, line, local in _imports(module, ast.parse(text), sources):
            if target != module:
                edges.append(Edge(module, target, line, local))
            if name.startswith("_") and not name.startswith("__") and target != module:
                private.append(f"{module}:{line} imports {target}.{name}")
    return edges, private


def cycle(edges: list[Edge]) -> list[str]:
    """One circle of imports, as the modules along it (first again at the end); [] if none."""
    ahead: dict[str, list[str]] = {}
    for edge in edges:
        ahead.setdefault(edge.source, []).append(edge.target)
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for target in sorted(ahead.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = walk(target, [*path, target])
                if found:
                    return found
        state[module] = 2
        return []

    for start in sorted(ahead):
        if start not in state:
            found = walk(start, [start])
            if found:
                return found
    return []


def reaches(edges: list[Edge], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module not in seen:
            seen.add(module)
            todo += [e.target for e in edges if e.source == module]
    return False


# ----- the package ---------------------------------------------------------------------------
def test_the_package_imports_in_no_circle() -> None:
    edges, _ = graph(_sources())
    assert cycle(edges) == []


def test_no_function_local_import_stands_where_one_at_the_top_would_close_a_circle() -> None:
    """A local import is only ever laziness (a heavy module loaded when first needed)."""
    edges, _ = graph(_sources())
    breakers = [
        f"{e.source}:{e.line} imports {e.target} inside a function, and {e.target} imports "
        f"{e.source}"
        for e in edges
        if e.local and reaches([x for x in edges if x is not e], e.target, e.source)
    ]
    assert breakers == []


def test_no_module_imports_another_ones_private_name() -> None:
    _, private = graph(_sources())
    assert private == []


def test_the_protocol_is_a_leaf_the_services_stand_on() -> None:
    """sandbox/ runs no import of services/, which import sandbox/ (the room rules are in
    test_house_rules.py; this is the direction the split is for)."""
    edges, _ = graph(_sources())
    up = [
        e for e in edges if e.source.startswith("orchestrator.sandbox") and ".services" in e.target
    ]
    assert up == []
    assert any(
        e.target.startswith("orchestrator.sandbox") for e in edges if ".services." in e.source
    )


# ----- the checker can fail ------------------------------------------------------------------
FAKE = {
    "orchestrator.a": "from orchestrator.b import thing\n",
    "orchestrator.b": "def f():\n    from orchestrator.a import other\n",
    "orchestrator.c": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orchestrator.d import T\n"
    ),
    "orchestrator.d": "from orchestrator.c import _hidden\n",
}


def test_the_checker_sees_a_circle_closed_inside_a_function_and_a_private_import() -> None:
    edges, private = graph(FAKE)
    assert cycle(edges) == ["orchestrator.a", "orchestrator.b", "orchestrator.a"]
    local = [e for e in edges if e.local]
    assert [(e.source, e.target) for e in local] == [("orchestrator.b", "orchestrator.a")]
    assert reaches(edges, "orchestrator.a", "orchestrator.b")
    assert private == ["orchestrator.d:1 imports orchestrator.c._hidden"]


def test_the_checker_lets_types_point_back() -> None:
    """c imports d for a type only, and d imports c: no circle that runs."""
    edges, _ = graph({k: v for k, v in FAKE.items() if k in ("orchestrator.c", "orchestrator.d")})
    assert cycle(edges) == []
