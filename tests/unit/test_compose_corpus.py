"""The Compose corpus (tests/data/compose_corpus, from public agent and evaluation benchmarks):
every file loads, with every check `up` makes, without a traceback, and every one of its keys
is mapped, refused with a reason, or reported as ignored with one."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli.spec_cmds import checked
from orchestrator.errors import PolicyError, SpecError
from orchestrator.spec import compose
from orchestrator.spec.loader import migrated_yaml
from orchestrator.spec.yamltext import parse_yaml, plain_data

CORPUS = Path(__file__).parents[1] / "data" / "compose_corpus"
FILES = sorted(CORPUS.glob("*.yaml"))
FULLY_MAPPED_FLOOR = 14
"""Files whose every key is mapped (nothing ignored or refused): 14 of 43 with named volumes
mapped. A change that maps less fails here."""


def raw(path: Path) -> dict[str, object]:
    data = plain_data(parse_yaml(path.read_text(), str(path)), str(path))
    assert isinstance(data, dict)
    return data


def mapping(path: Path) -> compose.ComposeMapping:
    return compose.from_compose(raw(path), source=str(path), base_dir=path.parent.resolve())


def test_the_corpus_is_large_and_cited() -> None:
    assert len(FILES) >= 30
    readme = (CORPUS / "README.md").read_text()
    assert all(f.name in readme for f in FILES), "every file's source is cited"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_loads_or_says_why(path: Path) -> None:
    assert compose.looks_compose(raw(path))
    try:
        env, _ = checked(path)
    except SpecError as exc:  # refused: each problem placed and with a fix
        assert exc.issues
        for issue in exc.issues:  # the policy's refusals say the fix too
            assert issue.file == str(path) and issue.message
            assert issue.fix or not isinstance(exc, PolicyError), issue
            assert issue.line is not None or issue.field == "services", issue
        return
    assert env.compose_main is not None


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_key_meets_a_fate(path: Path) -> None:
    m = mapping(path)
    covered = {f.loc for f in m.fates}
    for key in compose.keys_of(raw(path)):
        assert any(key[: len(c)] == c or c[: len(key)] == key for c in covered), key
    for fate in m.fates:
        assert fate.status == "mapped" or fate.why, fate


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_migrate_prints_every_file(path: Path) -> None:
    text = migrated_yaml(path)
    assert text.startswith("# made from") and "\nversion: 1\n" in text


def test_the_share_fully_mapped() -> None:
    full = [p.name for p in FILES if all(f.status == "mapped" for f in mapping(p).fates)]
    print(f"fully mapped: {len(full)} of {len(FILES)}: {full}")
    assert len(full) >= FULLY_MAPPED_FLOOR


ODD_VALUES = [5, None, [], {}, "x", [1], {"a": 1}, True, -1, "a:b:c", [None], "${X", "'", "1-9"]
"""Values of the wrong shape, for any key (a task file is anyone's to write)."""


def _paths(node: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [at] if at else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*at, i))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(FILES) - 1),
    spots=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(ODD_VALUES)), max_size=2),
)
def test_a_mutated_corpus_file_is_a_spec_error_never_a_traceback(
    which: int, spots: list[tuple[int, object]]
) -> None:
    """The hostile review's mutation fuzzer, kept: any key of any corpus file given a value
    of the wrong shape loads, or is a SpecError naming it (the CLI's exit 2)."""
    import copy
    import io
    import tempfile

    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    doc = yaml.load(FILES[which].read_text())
    for index, value in spots:
        paths = _paths(doc)
        if not paths:
            break
        path = paths[index % len(paths)]
        node: Any = doc
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = copy.deepcopy(value)
    out = io.StringIO()
    yaml.dump(doc, out)
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "compose.yaml"
        target.write_text(out.getvalue())
        with contextlib.suppress(SpecError):
            checked(target)
