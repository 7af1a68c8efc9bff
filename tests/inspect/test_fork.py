"""`fork_sandboxes` in a real `inspect eval`: a solver copies its sample's gVisor sandbox,
which has no network, while a process in it holds a value in memory; each copy answers
with that value, from its own process, and takes its own writes. The copies go with the
sample: nothing is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PYTHON_IMAGE, labelled_ids
from tests.inspect.conftest import passing_eval

pytestmark = pytest.mark.docker

ENV = f"""\
version: 1
name: inspect-fork
image: {PYTHON_IMAGE}
isolation: gvisor
network: {{egress: none}}
"""

TASK = r'''
import asyncio

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

from orchestrator.integrations.inspect import fork_sandboxes

HOLDER = """
import os, signal, time
secret = os.urandom(8).hex()
def say(*_):
    open('/tmp/said.part', 'w').write(secret)
    os.rename('/tmp/said.part', '/tmp/said')
signal.signal(signal.SIGUSR1, say)
open('/tmp/holder.pid', 'w').write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


async def ask(box) -> str:
    await box.exec(["sh", "-c", "rm -f /tmp/said; kill -USR1 $(cat /tmp/holder.pid)"])
    for _ in range(200):
        got = await box.exec(["cat", "/tmp/said"])
        if got.success:
            return got.stdout
        await asyncio.sleep(0.05)
    return "no answer"


@solver
def fork_it():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await sandbox().write_file("holder.py", HOLDER)
        await sandbox().exec(["sh", "-c", "python3 holder.py >/dev/null 2>&1 &"])
        for _ in range(200):
            if (await sandbox().exec(["test", "-s", "/tmp/holder.pid"])).success:
                break
            await asyncio.sleep(0.05)
        mine = await ask(sandbox())
        copies = await fork_sandboxes(2)
        said = [mine]
        for n, copy in enumerate(copies):
            box = copy["default"]
            said.append(await ask(box))
            await box.write_file("own.txt", f"copy {n}")
            said.append(await box.read_file("own.txt"))
        state.metadata["said"] = said
        return state
    return solve


@scorer(metrics=[accuracy()])
def check():
    async def score(state: TaskState, target: Target) -> Score:
        said = state.metadata["said"]
        secret = said[0]
        ok = len(secret) == 16 and said[1:] == [secret, "copy 0", secret, "copy 1"]
        return Score(value=CORRECT if ok else INCORRECT, explanation=repr(said))
    return score


@task
def fork_task():
    return Task(
        dataset=[Sample(input="hi", target="x")],
        solver=fork_it(),
        scorer=check(),
        sandbox=("orchestrator", "env.yaml"),
    )
'''


def test_a_solver_forks_its_sandbox_with_memory_and_the_copies_go_with_the_sample(
    tmp_path: Path, sealed_engine: str
) -> None:
    (tmp_path / "env.yaml").write_text(ENV)
    (tmp_path / "task.py").write_text(TASK)
    before = labelled_ids()
    passing_eval(tmp_path)
    assert labelled_ids() <= before
