"""The rules of the house (docs/architecture.md), checked on the source: which folder may
import which. A backend lives in one room; code outside it asks through the protocol."""

from __future__ import annotations

import ast
import functools
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
BACKENDS = ("local", "container", "docker", "swarm")
PUBLIC = ("top", "leaf", "spec", "testing")
"""What cli/, integrations/ and testing/ may import (besides their own modules): the public
names, the errors, the file's models and the conformance kit."""


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every orchestrator module a file imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("orchestrator")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {node.module} if node.module.startswith("orchestrator") else set()
    return out


def _room(module: str) -> str:
    """The folder a module lives in: 'backends.docker', 'sandbox', 'cli', ... or 'leaf'."""
    parts = module.split(".")[1:]
    if not parts:
        return "top"
    if parts[0] == "backends" and len(parts) > 1:
        return "backends." + parts[1]
    rooms = ("sandbox", "services", "spec", "cli")
    return parts[0] if len(parts) > 1 or parts[0] in rooms else "leaf"


@functools.cache  # (the package's files, read and parsed once for every rule)
def _sources() -> list[tuple[str, set[str]]]:
    return [(_module(p), _imports(p)) for p in sorted(PACKAGE.rglob("*.py"))]


def _breaks(where: str, allowed: tuple[str, ...]) -> list[str]:
    out = []
    for module, imported in _sources():
        if _room(module) != where:
            continue
        for target in sorted(imported):
            room = _room(target)
            if room != where and not any(room == a or target == a for a in allowed):
                out.append(f"{module} imports {target}")
    return out


def test_spec_knows_no_protocol_and_no_backend() -> None:
    assert _breaks("spec", ("leaf", "top")) == []


def test_the_protocol_imports_no_backend_and_no_service() -> None:
    assert _breaks("sandbox", ("spec", "leaf", "top")) == []


def test_the_services_build_on_the_protocol_and_know_no_backend() -> None:
    assert _breaks("services", ("sandbox", "spec", "leaf", "top")) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backend_imports_no_other_backend(backend: str) -> None:
    shared = () if backend == "container" else ("backends.container",)
    assert _breaks(f"backends.{backend}", ("spec", "sandbox", "leaf", "top", *shared)) == []


NOT_YET: set[str] = set()
"""Known breaks, each with its reason: the list may only shrink."""


@pytest.mark.parametrize("room", ["cli", "integrations", "testing"])
def test_the_front_doors_use_public_names_only(room: str) -> None:
    breaks = _breaks(room, PUBLIC)
    assert [b for b in breaks if b not in NOT_YET] == []


def test_the_known_breaks_are_still_there() -> None:
    """A break fixed is taken off NOT_YET, so the list says what is true."""
    found = {b for room in ("cli", "integrations") for b in _breaks(room, PUBLIC)}
    assert sorted(NOT_YET - found) == []


def test_the_rules_see_a_break() -> None:
    """The checker itself can fail: a module of the protocol importing a backend is seen."""
    assert _room("orchestrator.backends.docker.runtime") == "backends.docker"
    assert _room("orchestrator.sandbox.base") == "sandbox"
    assert _room("orchestrator.errors") == "leaf"


@pytest.mark.parametrize(
    ("old", "name"),
    [("orchestrator.runtime", "spawn_runtime"), ("orchestrator.inspect", "OrchestratorSandbox")],
)
def test_moved_public_modules_still_import_and_say_where_to(old: str, name: str) -> None:
    import importlib
    import sys

    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert getattr(module, name) is not None
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), caught
