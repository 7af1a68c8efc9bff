"""Property-based: whatever YAML the loader is fed, only our SpecError escapes."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import SpecError, load_environment_text
from orchestrator.spec.models import EnvironmentV1

VALID = """version: 1
name: fuzz
image: img:1
workdir: /workspace
env: {A: "1"}
network: {mode: bridge, ports: [{container: 80}]}
resources: {memory: 64m, cpus: 1.0, pids: 10}
services: {db: {image: x, healthcheck: {test: [CMD, true]}}}
setup: {commands: [echo]}
"""

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
keys = st.one_of(st.sampled_from(sorted(EnvironmentV1.model_fields)), st.text(max_size=10))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=20,
)


def load(text: str) -> None:
    try:
        load_environment_text(text)
    except SpecError as exc:
        assert exc.issues and all(str(i) for i in exc.issues)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=string.printable, max_size=300))
def test_random_text(text: str) -> None:
    load(text)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(VALID) - 1), st.integers(0, 20), st.text(max_size=8))
def test_mutated_valid_file(pos: int, cut: int, insert: str) -> None:
    load(VALID[:pos] + insert + VALID[pos + cut :])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values, max_size=8))
def test_random_structures(data: dict[str, Any]) -> None:
    import io

    from ruamel.yaml import YAML

    out = io.StringIO()
    YAML(typ="safe", pure=True).dump({"version": 1, **data}, out)
    load(out.getvalue())
