"""An Inspect task that names a Compose file (issue 23) runs on Inspect's own docker sandbox
and on ours with no other change, and with the same results: `x-default` on a service not
named default, service names as sandbox names, sample metadata interpolated into the file,
a healthchecked sidecar, files, working folders and users.

This engine (20.10) is older than the 24.0.6 Inspect's docker sandbox asks for: the task
bypasses that version check when it runs on Inspect's sandbox, and changes nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids
from tests.inspect.conftest import WEB_COMMAND, passing_eval

pytestmark = pytest.mark.docker

COMPOSE = f"""\
services:
  web:
    image: {BUSYBOX_IMAGE}
    x-local: true
    init: true
    command: {WEB_COMMAND}
    healthcheck:
      test: [CMD, wget, -q, -O-, "http://127.0.0.1:8080/"]
      interval: 200ms
  box:
    image: {PYTHON_IMAGE}
    x-default: true
    x-local: true
    init: true
    command: tail -f /dev/null
    working_dir: /root
    environment:
      WORD: ${{SAMPLE_METADATA_WORD:-unset}}
      FIXED: fixed
    depends_on:
      web:
        condition: service_healthy
"""

TASK = """\
import os

if os.environ["TEST_SANDBOX"] == "docker":  # this engine (20.10) is older than Inspect asks
    from inspect_ai.util._sandbox.docker import prereqs

    async def accept(*args, **kwargs):
        return None

    prereqs.validate_docker_engine = accept

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

FETCH = "import urllib.request as u; print(u.urlopen('http://web:8080/').read().decode().strip())"


@solver
def probe():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box = sandbox()
        seen = [
            await box.exec(["sh", "-c", "echo $WORD $FIXED; pwd; id -u"]),
            await box.exec(["python3", "-c", FETCH], timeout=30),
            await sandbox("web").exec(["sh", "-c", "id -u; cat /tmp/www/index.html"]),
            await sandbox("box").exec(["sh", "-c", "exit 3"]),
            await box.exec(["sh", "-c", "echo out; echo err >&2"]),
            await box.exec(["cat", "/no/such/file"]),
        ]
        await box.write_file("answer.txt", "written\\n")
        text = await box.read_file("answer.txt")
        lines = [[r.returncode, r.stdout, r.stderr if r.returncode else ""] for r in seen]
        state.metadata["seen"] = {"runs": lines, "file": text, "names": sorted(state.metadata)}
        return state
    return solve


@scorer(metrics=[accuracy()])
def check():
    async def score(state: TaskState, target: Target) -> Score:
        seen = state.metadata["seen"]
        first = seen["runs"][0][1]
        ok = first == state.metadata["word"] + " fixed\\n/root\\n0\\n"
        import json
        return Score(value=CORRECT if ok else INCORRECT, explanation=json.dumps(seen))
    return score


@task
def probe_task():
    return Task(
        dataset=[
            Sample(input="hi", target="x", id=w, metadata={"word": w}) for w in ("alpha", "beta")
        ],
        solver=probe(),
        scorer=check(),
        sandbox=(os.environ["TEST_SANDBOX"], "compose.yaml"),
    )
"""


def results(folder: Path) -> dict[str, object]:
    from inspect_ai.log import list_eval_logs, read_eval_log

    [info] = list_eval_logs(str(folder / "logs"))
    log = read_eval_log(info)
    return {
        str(s.id): json.loads(s.scores["check"].explanation or "null")
        for s in log.samples or []
        if s.scores
    }


def test_a_compose_task_gives_the_same_results_on_both_sandboxes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = {}
    before = labelled_ids()
    for provider in ("docker", "orchestrator"):
        folder = tmp_path / provider
        folder.mkdir()
        (folder / "compose.yaml").write_text(COMPOSE)
        (folder / "task.py").write_text(TASK)
        monkeypatch.setenv("TEST_SANDBOX", provider)
        passing_eval(folder)
        got[provider] = results(folder)
    assert labelled_ids() <= before
    assert set(got["docker"]) == {"alpha", "beta"}
    assert got["orchestrator"] == got["docker"]
