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


def test_an_exit_report_of_the_wrong_shape_is_refused() -> None:
    """A stand-in executor's report: each field of the wrong type is a ValueError (the link
    then ends it), never an Outcome that fails later."""
    import json

    import pytest

    good = {"exit_code": 0, "timed_out": False, "elapsed": 0.1}
    for key, bad in [
        ("exit_code", "x"),
        ("exit_code", True),
        ("timed_out", 1),
        ("elapsed", "1"),
        ("elapsed", None),
        ("oom_killed", "no"),
        ("unavailable", 3),
    ]:
        with pytest.raises((ValueError, TypeError)):
            wire.decode_exit(json.dumps({**good, key: bad}).encode())
    with pytest.raises((ValueError, TypeError)):
        wire.decode_exit(json.dumps({**good, "extra": 1}).encode())
    assert wire.decode_exit(json.dumps(good).encode()) == wire.Exit(0, False, 0.1)
