"""The executor's wire format loads no `typing` at run time (orchestrator exec's start is
counted in milliseconds): its two tuples are made by collections there, and typed for type
checkers in an `if TYPE_CHECKING:` block. Both must say the same fields and defaults."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.backends.container.executor import wire

SOURCE = Path(wire.__file__).read_text()


def _typed(name: str) -> tuple[list[str], dict[str, object]]:
    """The fields and defaults of the typed class `name` (in the TYPE_CHECKING block)."""
    [cls] = [
        n for n in ast.walk(ast.parse(SOURCE)) if isinstance(n, ast.ClassDef) and n.name == name
    ]
    fields, defaults = [], {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields.append(node.target.id)
            if node.value is not None:
                defaults[node.target.id] = ast.literal_eval(node.value)
    return fields, defaults


def test_the_run_time_tuples_are_the_typed_ones() -> None:
    for made in (wire.Request, wire.Exit):
        fields, defaults = _typed(made.__name__)
        assert list(made._fields) == fields
        assert made._field_defaults == defaults


def test_a_request_goes_and_comes_back_whole() -> None:
    req = wire.Request(["true"], {"A": "1"}, "/w", "1000:1000", 2.5, True, tty=[80, 24])
    assert wire.decode_request(wire.encode_request(req)) == req
    end = wire.Exit(3, False, 0.5)
    assert wire.decode_exit(wire.encode_exit(end)) == end
