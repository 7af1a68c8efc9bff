"""What runs inside containers (the executor and the process core it imports, executor/
files.py FILES) runs on the image's own Python, from 3.7 up: its syntax is 3.7's, and what
it takes from `typing` at run time exists in 3.7 (`Protocol` arrived in 3.8: an import of
it made every sandbox with Python 3.7 fall back to plain `docker exec`)."""

from __future__ import annotations

import ast

import pytest

from orchestrator.backends.container.executor.files import FILES

NEWER_TYPING = {"Protocol", "Literal", "TypedDict", "Final", "final", "runtime_checkable"}
"""Names of `typing` that Python 3.7 does not have."""


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether `node` sits under an `if` (TYPE_CHECKING, a version check) or a `try`."""
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.If, ast.Try)):
            return True
    return False


@pytest.mark.parametrize("name", sorted(n for n in FILES if n.endswith(".py")))
def test_it_parses_and_imports_as_python_3_7_would(name: str) -> None:
    source = FILES[name].read_text()
    tree = ast.parse(source, filename=name, feature_version=(3, 7))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            newer = {alias.name for alias in node.names} & NEWER_TYPING
            assert not newer or _guarded(node, parents), f"{name}:{node.lineno}: {newer}"
