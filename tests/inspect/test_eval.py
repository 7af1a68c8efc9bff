"""A real `inspect eval` with sandbox=("orchestrator", ...): Inspect's built-in mock model, a
solver that runs commands in "default" and in a sidecar, a scorer that reads a file back, and
sample metadata reaching the sandbox. It must pass, and leave nothing behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from inspect_ai.event import InfoEvent

from orchestrator.integrations.inspect import USAGE_SOURCE
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids
from tests.inspect.conftest import WEB_COMMAND, passing_eval

pytestmark = pytest.mark.docker

ENV = f"""\
version: 1
name: inspect-eval
image: {PYTHON_IMAGE}
user: '1000:1000'
setup: {{commands: ['echo "$SAMPLE_METADATA_WORD" > word.txt']}}
services:
  web:
    image: {BUSYBOX_IMAGE}
    command: {WEB_COMMAND}
    user: nobody
    healthcheck: {{test: [CMD, wget, -q, -O-, "http://127.0.0.1:8080/"], interval: 200ms}}
"""

TASK = """\
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

FETCH = "import urllib.request as u; print(u.urlopen('http://web:8080/').read().decode().strip())"


@solver
def probe():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        # no generate(): the mock model's token count would fetch a tokenizer from outside
        word = await sandbox().exec(["cat", "word.txt"])
        web = await sandbox().exec(["python3", "-c", FETCH], timeout=30)
        side = await sandbox("web").exec(["sh", "-c", "id -un; cat /tmp/www/index.html"])
        await sandbox().write_file("answer.txt", word.stdout + web.stdout + side.stdout)
        return state
    return solve


@scorer(metrics=[accuracy()])
def check():
    async def score(state: TaskState, target: Target) -> Score:
        text = await sandbox().read_file("answer.txt")
        want = state.metadata["word"] + "\\nhello from web\\nnobody\\nhello from web\\n"
        return Score(value=CORRECT if text == want else INCORRECT, explanation=repr(text))
    return score


@task
def probe_task():
    return Task(
        dataset=[Sample(input="hi", target="x", metadata={"word": w}) for w in ("alpha", "beta")],
        solver=probe(),
        scorer=check(),
        sandbox=("orchestrator", "env.yaml"),
    )
"""


def test_a_real_inspect_eval_with_a_sidecar_passes_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "env.yaml").write_text(ENV)
    (tmp_path / "task.py").write_text(TASK)
    before = labelled_ids()
    log = passing_eval(tmp_path)
    assert labelled_ids() <= before
    # each sample's usage is in its transcript: both services read, its commands counted
    for sample in log.samples or []:
        [event] = [
            e for e in sample.events if isinstance(e, InfoEvent) and e.source == USAGE_SOURCE
        ]
        usage = cast(dict[str, Any], event.data)
        assert isinstance(usage, dict) and usage["measured"] is True, usage
        assert set(usage["services"]) == {"main", "web"}, usage
        assert usage["services"]["main"]["commands"] >= 3  # setup, cat, python3, ...
        assert usage["services"]["web"]["commands"] >= 1  # (Inspect asks each for its user too)
        assert usage["total"]["cpu_seconds"] > 0 and usage["total"]["memory_peak_bytes"] > 0
