"""Inspect evaluations at scale, small size (`bench/eval_scale.py` runs the full one): every
sample's commands run at once, with no call waiting on a thread limiter, and a warm pool
(`prewarm`) hands each sample an environment of its own, never used before.

The proof that no call waits on a thread: the task shrinks anyio's default thread limiter to
one token, then every sample's command waits in its sandbox until all the samples' commands
are running together (a rendezvous in a folder they share). A provider whose calls hold a
worker thread runs one command at a time, and the rendezvous never completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PYTHON_IMAGE, labelled_ids
from tests.inspect.conftest import passing_eval

pytestmark = pytest.mark.docker

SAMPLES = 6
COMMANDS = 20

ENV = f"""\
version: 1
name: inspect-scale
image: {PYTHON_IMAGE}
user: '1000:1000'
mounts: [{{source: shared, target: /shared}}]
"""

TASK = """\
import anyio.to_thread
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox
from orchestrator.integrations.inspect import OrchestratorSandbox, OrchestratorSandboxConfig

SAMPLES, COMMANDS, PREWARM = {samples}, {commands}, {prewarm}
MEET = (
    "touch /shared/$SAMPLE_METADATA_N; i=0; "
    "while [ $(ls /shared | wc -l) -lt {samples} ]; do "
    "i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.05; done"
)


@solver
def work():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        fresh = await sandbox().exec(["sh", "-c", "test ! -e used && touch used"])
        word = await sandbox().exec(["sh", "-c", "echo $SAMPLE_METADATA_N"])
        meet = await sandbox().exec(["sh", "-c", MEET], timeout=90)
        outs = [(await sandbox().exec(["echo", str(i)])).stdout for i in range(COMMANDS)]
        # handed out by the warm pool, not started here
        pooled = sandbox().as_type(OrchestratorSandbox).pool is not None
        state.metadata["got"] = [fresh.returncode, word.stdout, meet.returncode, outs, pooled]
        return state
    return solve


@scorer(metrics=[accuracy()])
def check():
    async def score(state: TaskState, target: Target) -> Score:
        want = [0, state.metadata["n"] + "\\n", 0, [f"{{i}}\\n" for i in range(COMMANDS)], True]
        got = state.metadata["got"]
        return Score(value=CORRECT if got == want else INCORRECT, explanation=repr(got))
    return score


@task
def scale():
    config = OrchestratorSandboxConfig(file="env.yaml", prewarm=PREWARM)
    return Task(
        dataset=[Sample(input="hi", metadata={{"n": str(n)}}) for n in range(SAMPLES)],
        solver=work(),
        scorer=check(),
        sandbox=("orchestrator", config if PREWARM else "env.yaml"),
    )
"""


def test_every_sample_runs_at_once_with_no_thread_limiter(tmp_path: Path) -> None:
    """Prewarmed (test_eval.py runs an eval whose samples start their own environments)."""
    prewarm = SAMPLES
    (tmp_path / "env.yaml").write_text(ENV)
    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)
    task = TASK.format(samples=SAMPLES, commands=COMMANDS, prewarm=prewarm)
    (tmp_path / "task.py").write_text(task)
    before = labelled_ids()
    passing_eval(tmp_path, "--max-samples", str(SAMPLES), "--max-sandboxes", str(SAMPLES))
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == [
        str(n) for n in range(SAMPLES)
    ]
    assert labelled_ids() <= before
