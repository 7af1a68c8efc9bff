"""An Inspect task whose Compose file is locked (`orchestrator lock compose.yaml`) runs the
locked image on our provider after its tag moved: the lock is read wherever the file is."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE
from tests.inspect.conftest import passing_eval

pytestmark = pytest.mark.docker

TASK = """\
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox


@solver
def probe():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        found = await sandbox().exec(["sh", "-c", "command -v python3 || echo none"])
        state.metadata["python"] = found.stdout.strip()
        return state
    return solve


@scorer(metrics=[accuracy()])
def check():
    async def score(state: TaskState, target: Target) -> Score:
        ok = state.metadata["python"] == "none"  # the locked busybox, not the moved tag
        return Score(value=CORRECT if ok else INCORRECT, explanation=state.metadata["python"])
    return score


@task
def locked():
    return Task(
        dataset=[Sample(input="hi", target="x")],
        solver=probe(),
        scorer=check(),
        sandbox=("orchestrator", "compose.yaml"),
    )
"""


@pytest.fixture
def tag() -> Iterator[str]:
    name = f"orchestrator-test/lock-{uuid.uuid4().hex[:8]}:1"
    subprocess.run(["docker", "tag", BUSYBOX_IMAGE, name], check=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run(["docker", "image", "rm", name], capture_output=True, timeout=60)


def test_a_locked_compose_file_runs_its_locked_image_under_inspect(
    tmp_path: Path, tag: str
) -> None:
    compose = f"services:\n  default:\n    image: {tag}\n    command: tail -f /dev/null\n"
    (tmp_path / "compose.yaml").write_text(compose)
    (tmp_path / "task.py").write_text(TASK)
    locked = subprocess.run(
        [sys.executable, "-m", "orchestrator", "lock", "compose.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert locked.returncode == 0, locked.stderr
    assert (tmp_path / "compose.yaml.lock").is_file()
    subprocess.run(["docker", "tag", PYTHON_IMAGE, tag], check=True, timeout=60)
    passing_eval(tmp_path)
