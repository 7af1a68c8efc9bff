"""Validation in one pass (issue 21, item 2): a file with mistakes of every stage (schema,
`{{static:NAME}}` placeholders, asset paths, the policy) gets all of them in one run, each at
file:line:column with its field and fix, sorted by position; `validate --json` says the same
for scripts; a hostile file (deep nesting, thousands of errors, an alias bomb, 10 MB) gets a
bounded answer quickly."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Policy, PolicyError, SpecError, backend_class, load_environment

CLI = [sys.executable, "-m", "orchestrator"]
IMAGE = "orchestrator-test/busybox:1"

FOUR_STAGES = f"""version: 1
name: four
image: {IMAGE}
imgae: typo
network: {{mode: host}}
cap_add: [SYS_ADMIN]
static_assets:
  - {{name: t, path: nothere, save_path: t}}
setup:
  commands: ["cat {{{{static:nope}}}}"]
resources: {{memory: lots}}
"""
"""Schema (4: unknown key; 11: bad memory), policy (5: host network; 6: a capability),
asset path (8), placeholder (10)."""
EXPECTED = [
    (4, "imgae", "unknown key"),
    (5, "network.mode", "host networking is not allowed"),
    (6, "cap_add", "SYS_ADMIN is not allowed"),
    (8, "static_assets.0.path", "asset path does not exist"),
    (10, "setup.commands.0", "{{static:nope}} names no static asset"),
    (11, "resources.memory", "should match pattern"),
]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_ALLOW")}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=120, env=env
    )


def write(folder: Path, text: str, name: str = "env.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def located(stderr: str) -> list[tuple[int, int, str, str]]:
    """(line, column, field, message) of each `file:line:col: field: message` line."""
    out = []
    for m in re.finditer(r"env\.yaml:(\d+):(\d+): (\S+): (.*)", stderr):
        out.append((int(m[1]), int(m[2]), m[3], m[4]))
    return out


@pytest.mark.parametrize("verb", ["validate", "render", "up", "run"])
def test_one_run_lists_every_stage_with_its_line(tmp_path: Path, verb: str) -> None:
    """Every command that reads a file says all its problems before it starts anything."""
    write(tmp_path, FOUR_STAGES)
    done = cli(verb, "env.yaml", *(["--", "true"] if verb == "run" else []), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    found = located(done.stderr)
    for line, field, message in EXPECTED:
        assert any(
            f_line == line and f_field == field and message in f_msg
            for f_line, _, f_field, f_msg in found
        ), (line, field, message, done.stderr)
    lines = [f[0] for f in found]
    assert lines == sorted(lines)  # by position
    assert done.stderr.count("fix:") >= len(EXPECTED)


def test_policy_errors_carry_line_and_column(tmp_path: Path) -> None:
    """A file whose only problems are the policy's: each at its own line and column."""
    text = f"""version: 1
name: pol
image: {IMAGE}
privileged: true
network:
  mode: host
services:
  db:
    image: {IMAGE}
    cap_add: [SYS_ADMIN]
"""
    path = write(tmp_path, text)
    done = cli("validate", "env.yaml", cwd=tmp_path)
    assert done.returncode == 2
    found = {(line, col, field) for line, col, field, _ in located(done.stderr)}
    assert {(4, 13, "privileged"), (6, 9, "network.mode"), (10, 5, "services.db.cap_add")} <= (
        found
    ), done.stderr
    # the library: the error raised by a load with the backend's check carries the list
    with pytest.raises(PolicyError) as caught:
        load_environment(path, check=_docker_check)
    assert all(i.line is not None and i.column is not None for i in caught.value.issues)
    assert [i.line for i in caught.value.issues] == [4, 6, 10]


def _docker_check(env: object) -> None:
    from orchestrator import Environment

    assert isinstance(env, Environment)
    policy = Policy()
    backend_class(env, policy=policy).check(env, policy)


def test_library_load_reports_every_stage_at_once(tmp_path: Path) -> None:
    """Without a backend check: the schema, the asset paths and the placeholders at once."""
    path = write(tmp_path, FOUR_STAGES)
    with pytest.raises(SpecError) as caught:
        load_environment(path)
    fields = [i.field for i in caught.value.issues]
    assert fields == ["imgae", "static_assets.0.path", "setup.commands.0", "resources.memory"]
    assert all(i.line for i in caught.value.issues)
    # and with the backend's check, the policy's problems join them, in file order
    with pytest.raises(SpecError) as caught:
        load_environment(path, check=_docker_check)
    assert [(i.line, i.field) for i in caught.value.issues] == [
        (line, field) for line, field, _ in EXPECTED
    ]


def test_later_problems_point_at_the_files_own_entries(tmp_path: Path) -> None:
    """An invalid list item is taken out for the later checks: what they find in the items
    after it still names the file's index and line; a problem of a removed entry is not
    said twice."""
    text = f"""version: 1
name: Bad Name
image: {IMAGE}
mounts:
  - {{source: ./a}}
  - {{source: ./sub, target: /ok}}
  - {{source: /opt, target: /o}}
services:
  db:
    image: x
    build: {{context: .}}
    cap_add: [SYS_ADMIN]
  web.v2:
    image: y
    ports: [{{container: 99999}}]
    privileged: true
"""
    (tmp_path / "sub").mkdir()
    write(tmp_path, text)
    done = cli("validate", "env.yaml", cwd=tmp_path)
    assert done.returncode == 2
    found = {(line, field) for line, _, field, _ in located(done.stderr)}
    assert (2, "name") in found
    assert (5, "mounts.0.target") in found
    assert (7, "mounts.2.source") in found  # outside the roots: the file's index
    assert (9, "services.db") in found  # image and build
    assert (15, "services.web.v2.ports.0.container") in found
    assert (16, "services.web.v2.privileged") in found  # a dotted service name
    assert not any("SYS_ADMIN" in m for *_, m in located(done.stderr))  # db was refused whole


def test_validate_json_shape(tmp_path: Path) -> None:
    bad = write(tmp_path, FOUR_STAGES, "bad.yaml")
    good = write(tmp_path, f"version: 1\nname: good\nimage: {IMAGE}\n", "good.yaml")
    done = cli("validate", "--json", str(good), str(bad), cwd=tmp_path)
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert report["valid"] is False
    assert {f["file"]: f["valid"] for f in report["files"]} == {str(good): True, str(bad): False}
    assert len(report["issues"]) >= len(EXPECTED)
    for issue in report["issues"]:
        assert set(issue) == {"file", "line", "column", "field", "message", "fix"}
        assert issue["file"] == str(bad)
        assert isinstance(issue["line"], int) and isinstance(issue["column"], int)
    ok = cli("validate", "--json", str(good), cwd=tmp_path)
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["valid"] is True
    assert json.loads(ok.stdout)["issues"] == []


def _many_errors() -> str:
    lines = ["version: 1", "name: many", f"image: {IMAGE}", "mounts:"]
    i = 0
    while sum(map(len, lines)) < 120_000:
        lines.append(f"  - {{source: /opt/{i}, target: rel{i}, bogus: 1}}")
        i += 1
    return "\n".join(lines) + "\n"


def _alias_bomb() -> str:
    text = f"version: 1\nname: b\nimage: {IMAGE}\na: &a [" + ",".join(['"lol"'] * 9) + "]\n"
    prev = "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    return text


HOSTILE = {
    "deep nesting": (
        f"version: 1\nname: d\nimage: {IMAGE}\nenv: " + "[" * 30_000 + "]" * 30_000 + "\n",
        "nested more than",
    ),
    "thousands of errors": (_many_errors(), "more problems not listed"),
    "alias bomb": (_alias_bomb(), "expands to more than"),
    "10 MB": (
        f"version: 1\nname: big\nimage: {IMAGE}\ndescription: '" + "x" * 10_000_000 + "'\n",
        "over the limit",
    ),
}


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_gets_a_bounded_answer_quickly(tmp_path: Path, case: str) -> None:
    text, says = HOSTILE[case]
    write(tmp_path, text)
    began = _children_cpu()  # CPU time, not wall time: the machine may be busy
    done = cli("validate", "--json", "env.yaml", cwd=tmp_path)
    took = _children_cpu() - began
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    issues = json.loads(done.stdout)["issues"]
    assert 1 <= len(issues) <= 51  # MAX_ISSUES, and the count of the rest
    assert any(says in i["message"] for i in issues), issues[-3:]
    assert took < 8, f"{case}: {took:.1f} s of CPU"
    assert len(done.stdout) < 100_000
