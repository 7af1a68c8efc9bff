"""Inspect's `bash_session` tool, natively on the provider
(`orchestrator.integrations.inspect.bash_session`): a shell on a terminal that keeps its
state, answers at its prompt, is read again, interrupted, restarted; bounded in what it holds
and in how long a call takes, with a hostile shell on the other side; a real `inspect eval`
that uses it; and nothing of Inspect's tools put into the sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.tool import ToolError
from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR

from orchestrator.backends.container.inventory import list_projects
from orchestrator.errors import NoTerminal
from orchestrator.integrations import inspect_session
from orchestrator.integrations.inspect import OrchestratorSandbox, bash_session
from orchestrator.integrations.inspect_session import MARK, clean, interact
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE
from tests.inspect.conftest import passing_eval

WITHIN = 60.0


def env_file(folder: Path) -> str:
    path = folder / "env.yaml"
    path.write_text(f"version: 1\nname: shell\nimage: {PYTHON_IMAGE}\nuser: '1000:1000'\n")
    return str(path)


@contextlib.asynccontextmanager
async def sample(folder: Path) -> AsyncIterator[OrchestratorSandbox]:
    """A sample's main sandbox; at the end, its cleanup, and nothing of it left."""
    config = env_file(folder)
    envs = await OrchestratorSandbox.sample_init("t", config, {"word": "hi"})
    box = envs["default"]
    assert isinstance(box, OrchestratorSandbox)
    ident = box.runtime.info().id
    try:
        yield box
    finally:
        await OrchestratorSandbox.sample_cleanup("t", config, envs, interrupted=False)
        await OrchestratorSandbox.task_cleanup("t", config, cleanup=True)
    assert [p.name for p in list_projects() if p.name == ident] == []


def run(folder: Path, scenario: Callable[[OrchestratorSandbox], Awaitable[None]]) -> None:
    async def main() -> None:
        async with sample(folder) as box:
            await asyncio.wait_for(scenario(box), 4 * WITHIN)

    asyncio.run(main())


def prompt_of(answer: str) -> str:
    """The prompt an answer ends with (its last line)."""
    return answer.rsplit("\n", 1)[-1]


@pytest.mark.docker
def test_a_shell_keeps_its_state_and_answers_at_its_prompt(tmp_path: Path) -> None:
    async def scenario(box: OrchestratorSandbox) -> None:
        async def say(action: Any, text: str | None = None, **kw: Any) -> str:
            return await interact(box, action, text, **kw)

        first = await say("read")
        prompt = prompt_of(first)
        assert prompt.endswith("$ ") and first == prompt
        assert await say("type_submit", "x=41") == prompt
        assert await say("type_submit", "echo $((x+1)) $SAMPLE_METADATA_WORD") == (
            f"42 hi\n{prompt}"
        )
        # typed in two parts; a line left open gets the continuation prompt
        assert await say("type", "echo ty", wait_for_output=1) == ""
        assert await say("type_submit", "ped") == f"typed\n{prompt}"
        assert await say("type_submit", "echo 'open") == "> "
        assert await say("type_submit", "shut'") == f"open\nshut\n{prompt}"
        # several lines: answered once the shell read them all (not at the first prompt);
        # (idle is raised past the loop's pauses, which a loaded machine stretched past the
        # default 0.5 s once: what is tested is that the answer waits for the last line)
        loop = "for i in 1 2; do\n sleep 0.3; echo $i\ndone\necho end"
        assert await say("type_submit", loop, idle=10) == f"> > 1\n2\n{prompt}end\n{prompt}"
        heredoc = "cat > /tmp/f <<'X'\none\nX\nwc -l < /tmp/f"
        assert await say("type_submit", heredoc) == f"> > {prompt}1\n{prompt}"
        # typed while a command runs: answered after what it typed ran too
        assert await say("type_submit", "sleep 1", wait_for_output=0.2) == ""
        assert await say("type_submit", "echo queued") == f"{prompt}queued\n{prompt}"
        # what the model reads: escapes gone, an OSC never ended not eating the rest, line
        # ends single, a character cut between two reads whole, input not UTF-8 typed
        said = await say("type_submit", r"printf '\033]0;\033[1mbold\033[0m\r\nx\n'")
        assert said == f"0;bold\nx\n{prompt}"
        assert await say("type_submit", r"printf '\303'; sleep 1; printf '\251\n'") == ""
        assert await say("read") == f"\u00e9\n{prompt}"
        assert await say("type_submit", "echo \ud800") == f"?\n{prompt}"
        # a command slower than wait_for_output: nothing yet, then read
        assert await say("type_submit", "sleep 2; echo later", wait_for_output=1) == ""
        assert await say("read") == f"later\n{prompt}"
        # Ctrl-C reaches what runs; the shell lives on
        assert await say("type_submit", "sleep 600", wait_for_output=1) == ""
        assert (await say("interrupt")).endswith(prompt)
        assert await say("type_submit", "echo $?") == f"130\n{prompt}"
        # a program's own prompt (no mark): answered once it is quiet
        assert (await say("type_submit", "python3 -q")).endswith(">>> ")
        assert await say("type_submit", "6*7") == "42\n>>> "
        assert await say("type_submit", "exit()") == prompt
        # instances are shells of their own
        assert (await say("type_submit", "echo ${x:-unset}", instance="b")).startswith(
            f"{prompt}unset\n"
        )
        # restart: a new shell, its state gone
        assert await say("restart") == inspect_session.RESTARTED
        assert await say("type_submit", "echo ${x:-unset}") == f"{prompt}unset\n{prompt}"
        # the shell exited: said so, and restart gives a new one
        await say("type_submit", "exit")
        with pytest.raises(ToolError, match="restart"):
            await say("type_submit", "echo gone")
        await say("restart")
        assert (await say("type_submit", "id -u")).endswith(f"1000\n{prompt}")
        # nothing of Inspect's tools was put into the sandbox
        found = await box.exec(["sh", "-c", f"ls -d {SANDBOX_TOOLS_DIR} 2>/dev/null; true"])
        assert found.stdout == ""
        shells = list(box.shells.values())
        assert len(shells) == 2

    run(tmp_path, scenario)


@pytest.mark.docker
def test_a_flooding_shell_holds_at_most_its_limit_and_says_what_it_left_out(
    tmp_path: Path,
) -> None:
    limit = 64 * 1024

    async def scenario(box: OrchestratorSandbox) -> None:
        prompt = prompt_of(await interact(box, "read", None, limit=limit))
        # past 4,096 bytes a call answers at once
        assert "flood\nflood\n" in await interact(box, "type_submit", "yes flood", limit=limit)
        [shell] = box.shells.values()
        # the terminal floods on between calls: what is held never passes the limit
        for _ in range(20):
            await asyncio.sleep(0.1)
            assert len(shell.data) <= limit
        assert shell.dropped > 0
        answer = await interact(box, "read", None, limit=limit)
        notice, tail = answer.split("\n", 1)
        assert notice.startswith("[the shell's output passed 65536 bytes: ")
        assert len(tail) <= limit and set(tail.split("\n")[1:-1]) == {"flood"}
        # Ctrl-C stops it; what it printed before is read to the shell's prompt
        # (by time, not by count: each read answers once it holds 4,096 bytes, and what was
        # in flight when `yes` stopped, up to the executor's window, took more than 50 reads
        # to drain on a loaded CI machine once)
        answer = await interact(box, "interrupt", None, limit=limit)
        deadline = asyncio.get_running_loop().time() + WITHIN
        while not answer.endswith(prompt) and asyncio.get_running_loop().time() < deadline:
            answer = await interact(box, "read", None, limit=limit, wait_for_output=1)
        assert answer.endswith(prompt)
        assert await interact(box, "type_submit", "echo calm", limit=limit) == f"calm\n{prompt}"

    run(tmp_path, scenario)


@pytest.mark.docker
def test_a_hostile_shell_cannot_hold_a_call_past_its_timeout(tmp_path: Path) -> None:
    async def scenario(box: OrchestratorSandbox) -> None:
        prompt = prompt_of(await interact(box, "read", None))
        # it prints the prompt mark itself: that read ends early, the rest comes next
        mark = "".join(f"\\{c:03o}" for c in MARK)
        early = await interact(box, "type_submit", f"printf '{mark}'; sleep 1; echo after")
        assert "after" not in early and "\x1b" not in early
        assert await interact(box, "read", None) == f"after\n{prompt}"
        # it reads none of what is typed: the call ends at its timeout all the same
        await interact(box, "type_submit", "sleep 600", wait_for_output=1)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(TimeoutError):
            await interact(box, "type", "z" * 2_000_000, timeout=3)
        assert loop.time() - began < WITHIN
        # the shell is still there, and answers once what runs is stopped
        await interact(box, "interrupt", None, timeout=WITHIN)
        await interact(box, "read", None, timeout=WITHIN, wait_for_output=1)
        assert await interact(box, "type_submit", "echo alive") == f"alive\n{prompt}"

    run(tmp_path, scenario)


@pytest.mark.docker
def test_a_sandbox_without_a_terminal_goes_to_inspects_tool(tmp_path: Path) -> None:
    """No python3 in the image (commands by plain `docker exec`, no terminal): a shell is
    refused before anything runs (the tool then leaves the call to Inspect's own), and a
    restart never says it started one."""
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: plain\nimage: {BUSYBOX_IMAGE}\nuser: '1000:1000'\n")

    async def main() -> None:
        envs = await OrchestratorSandbox.sample_init("t", str(path), {})
        box = envs["default"]
        assert isinstance(box, OrchestratorSandbox)
        try:
            for action in ("read", "restart"):  # (refused before anything ran)
                with pytest.raises(NoTerminal):
                    await interact(box, action, None)
            assert box.shells == {}
        finally:
            await OrchestratorSandbox.sample_cleanup("t", str(path), envs, interrupted=False)
            await OrchestratorSandbox.task_cleanup("t", str(path), cleanup=True)

    asyncio.run(main())


@pytest.mark.docker
def test_what_a_hostile_shell_prints_is_neither_held_back_nor_miscounted(
    tmp_path: Path,
) -> None:
    """An escape never ended is held for one answer at most and never grows; an OSC opened
    in a REPL does not hide its answers; a silent command and a cancelled call leave the
    count of prompts, and the output, whole."""

    async def scenario(box: OrchestratorSandbox) -> None:
        prompt = prompt_of(await interact(box, "read", None))
        [shell] = box.shells.values()
        # a CSI that never ends, its parameters flooding: shown as text, never held long
        flood = "(printf '\\033['; head -c 300000 /dev/zero | tr '\\0' ';'; sleep 1; echo)"
        said = await interact(box, "type_submit", flood)
        seen = said.count(";")
        while not said.endswith(prompt):
            assert len(shell.held) <= 4096
            said = await interact(box, "read", None)
            seen += said.count(";")
        assert seen == 300000
        # an OSC opened in a REPL: what the REPL prints after it still comes
        await interact(box, "type_submit", "python3 -q")
        await interact(box, "type_submit", "print('\\x1b]')")
        assert "42" in await interact(box, "type_submit", "print(6*7)")
        assert (await interact(box, "type_submit", "exit()")).endswith(prompt)
        # a command silent past the wait: the next call still waits for its own output
        assert await interact(box, "type_submit", "sleep 2", wait_for_output=0.5) == ""
        said = await interact(box, "type_submit", "sleep 0.2; echo own-output")
        assert "own-output" in said and said.endswith(prompt)
        # calls given up while the output is read: none of it is lost
        got = await interact(
            box, "type_submit", "head -c 300000 /dev/zero | tr '\\0' q; echo; echo END"
        )
        # (given up for 5 s, then read whole: under load, calls given up at 20 ms read
        # a few hundred bytes a second, and a minute of them did not reach the end)
        deadline = time.monotonic() + 5
        while not got.endswith(prompt) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                got += await interact(box, "read", None, timeout=0.02, wait_for_output=1)
        deadline = time.monotonic() + 60
        while not got.endswith(prompt) and time.monotonic() < deadline:
            got += await interact(box, "read", None)
        assert got.count("q") == 300000 and "END" in got

    run(tmp_path, scenario)


@pytest.mark.docker
def test_a_shell_starting_as_its_sample_ends_does_not_outlive_it(tmp_path: Path) -> None:
    async def scenario(box: OrchestratorSandbox) -> None:
        starting = asyncio.ensure_future(interact(box, "read", None))
        await asyncio.sleep(0)
        await inspect_session.close_shells(box)
        with pytest.raises(ToolError, match="ended"):
            await starting
        with pytest.raises(ToolError, match="ended"):
            await interact(box, "read", None)
        assert box.shells == {}

    run(tmp_path, scenario)


@pytest.mark.docker
def test_the_shells_end_with_their_sample(tmp_path: Path) -> None:
    shells: list[inspect_session.Shell] = []

    async def main() -> None:
        async with sample(tmp_path) as box:
            await interact(box, "type_submit", "sleep 600 &")
            shells.extend(box.shells.values())
        # after the sample: killed, its reader done, nothing left in the loop
        [shell] = shells
        assert shell.ended and shell.proc.ended and shell.pump.done()

    asyncio.run(main())


def test_what_the_model_reads_of_a_terminal() -> None:
    raw = "\x1b[1;32mok\x1b[0m\r\r\n\x1b]0;title\x07a\tb\x00\x7f\rc" + MARK.decode() + "$ "
    assert clean(raw) == "ok\na\tb\rc$ "
    assert clean("\x1b]0;no end, then SEEN") == "0;no end, then SEEN"


def test_arguments_are_checked_as_inspects_tool_checks_them() -> None:
    with pytest.raises(ValueError, match="at least 190"):
        bash_session(timeout=100, wait_for_output=10)
    tool = bash_session()

    async def call(**kw: Any) -> object:
        return await tool(**kw)

    for kw in ({"action": "type"}, {"action": "read", "input": "x"}):
        with pytest.raises(ToolError):
            asyncio.run(call(**kw))


TASK = """\
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

from orchestrator.integrations.inspect import bash_session
from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR


@solver
def drive():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        # the tool called as the model would call it (no generate(): the mock model's token
        # count would fetch a tokenizer from outside)
        shell = bash_session()
        said = [await shell(action="type_submit", input="n=$SAMPLE_METADATA_WORD")]
        said.append(await shell(action="type_submit", input="echo got-$n"))
        found = await sandbox().exec(["sh", "-c", f"ls -d {SANDBOX_TOOLS_DIR}; true"])
        state.metadata["said"] = said
        state.metadata["tools"] = found.stdout
        return state
    return solve


@scorer(metrics=[accuracy()])
def check():
    async def score(state: TaskState, target: Target) -> Score:
        said = state.metadata["said"]
        ok = said[1].startswith("got-" + state.metadata["word"] + "\\n")
        ok = ok and said[1].endswith("$ ") and state.metadata["tools"] == ""
        return Score(value=CORRECT if ok else INCORRECT, explanation=repr(state.metadata))
    return score


@task
def shell_task():
    samples = [Sample(input="x", metadata={"word": w}) for w in ("one", "two")]
    box = ("orchestrator", "env.yaml")
    return Task(dataset=samples, solver=drive(), scorer=check(), sandbox=box)
"""


@pytest.mark.docker
def test_a_real_eval_uses_the_native_bash_session(tmp_path: Path) -> None:
    env_file(tmp_path)
    (tmp_path / "task.py").write_text(TASK)
    log = passing_eval(tmp_path)
    assert len(log.samples or []) == 2
