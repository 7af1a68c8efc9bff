"""Inspect's `bash_session` tool, natively on the process API: `bash_session()` from here in
place of `inspect_ai.tool.bash_session()` gives the model the same tool (its name, actions,
arguments and answers), run as a `bash -i` on a terminal of its own started by
`AsyncSandbox.start(tty=True)`. Inspect's own tool copies a helper program into the sandbox
on first use and runs it once per call (`docker exec` of a JSON-RPC client that talks to a
server it started there); this one puts nothing in the sandbox and writes to the shell's
terminal directly.

What the model sees is Inspect's: the shell's output since the last call, its escape
sequences and control characters removed, waiting for output up to `wait_for_output`
seconds, then until none came for `idle_timeout`, or returning at once past 4,096 bytes;
the last `max_output_bytes` kept, with a line saying how much was left out. One difference,
faster and never later: the shell's prompts end with marks (OSC 133;B, removed from what the
model reads), so a call also returns once the shell is back at a prompt for each line it
typed (a line the shell reads prints its prompt, or its continuation prompt, when done; a
shell busy with a command prints one more). Input a program reads instead (a REPL) is
answered by the idle wait, as Inspect's is. A program that prints a mark itself only ends
that one read early: what it prints after comes with the next call.

Bounds: one shell per (sandbox, instance), calls to it taking turns, killed with the sample
(and none started after); output read as it comes, at most `max_output_bytes` held (the
oldest dropped, as Inspect's does), so a shell flooding its terminal cannot grow this
process's memory (it costs this process the CPU to read it, where Inspect's tool spends the
sandbox's); each call ends within its `timeout` (TimeoutError, as Inspect's).

Where the sample's sandbox is not one of ours, cannot give its commands a terminal (no
python3 in the image: they go by plain `docker exec`), or Inspect runs on trio, the call
goes to Inspect's own tool unchanged."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import re
from typing import TYPE_CHECKING, Literal

from inspect_ai.tool import ToolError
from inspect_ai.util import SandboxEnvironmentLimits

from orchestrator.errors import ProcessEnded

if TYPE_CHECKING:
    from orchestrator.aio import AsyncProcess
    from orchestrator.integrations.inspect import OrchestratorSandbox

Action = Literal["type", "type_submit", "restart", "read", "interrupt"]
WAIT_FOR_OUTPUT = 30
"""Seconds a call waits for the first output (Inspect's default)."""
IDLE = 0.5
"""Seconds without new output after which a call returns what came (Inspect's)."""
TRANSPORT = 180
"""What Inspect's tool adds to `wait_for_output` for its default `timeout`."""
ENOUGH = 4096
"""Bytes after which a call returns without waiting for more (Inspect's)."""
OFF_LOOP = 64 * 1024
"""Output past which its cleaning runs in a thread (a 10 MiB answer takes half a second)."""
CLOSE_WAIT = 10.0
"""Longest a shell's close waits for it to have ended, once killed."""
RESTARTED = "shell restarted successfully"
EXITED = 'the shell has exited: start a new one with action "restart"'
MARK = b"\x1b]133;B\x07"
"""The mark the shell's prompt (PS1) ends with (OSC 133;B: where a prompt ends)."""
MARK2 = b"\x1b]133;B;k=s\x07"
"""The mark its continuation prompt (PS2) ends with (a secondary prompt's)."""
_MARKS = re.compile(re.escape(MARK) + b"|" + re.escape(MARK2))
_PS1_MARK = r"\[\e]133;B\a\]"
_PS2_MARK = r"\[\e]133;B;k=s\a\]"
_MARK_PROMPTS = "".join(
    f"case ${ps} in *'{mark}') ;; *) {ps}=\"${ps}\"'{mark}';; esac; "
    for ps, mark in (("PS1", _PS1_MARK), ("PS2", _PS2_MARK))
)
"""PROMPT_COMMAND: end both prompts with their marks, once, whatever the rc set them to."""
SHELL = ["/bin/bash", "-c", "stty -echo 2>/dev/null; exec /bin/bash -i"]
"""The shell, with its terminal's echo off (the model's input is not read back to it)."""
_ESCAPES = re.compile(
    r"\x1b\][^\x07\x1b\r\n]{0,4096}(?:\x07|\x1b\\)"  # OSC, ended on its line (a title, a mark)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves)
    r"|\x1b[ -/]*[0-~]"  # any other escape (an OSC never ended: its ESC ] alone)
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # control characters but tab, newline, return
)
_UNENDED = re.compile(r"\x1b(?:\][^\x07\x1b\r\n]{0,4096}|\[[0-?]{0,64}[ -/]{0,16}|[ -/]{0,16})?\Z")
"""An escape sequence cut off at the end of what came (a short one): kept for the next
answer, once."""
_NEWLINES = re.compile(r"\r+\n")
_LINE_ENDS = re.compile(rb"[\r\n]")


def clean(text: str) -> str:
    """What the model reads of terminal output: escape sequences and control characters
    removed, line ends as "\n"."""
    return _ESCAPES.sub("", _NEWLINES.sub("\n", text))


class Shell:
    """One `bash -i` on a terminal in a sandbox, its output read as it comes into a buffer
    of at most `limit` bytes (the oldest dropped, and counted)."""

    def __init__(self, proc: AsyncProcess) -> None:
        self.proc = proc
        self.data = bytearray()
        self.limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        self.dropped = 0
        self.marks = 0
        """Prompt marks (either) seen in all."""
        self.owed = 0
        """The count `marks` reaches once the shell has read every line typed so far (each
        line it reads ends in its prompt or its continuation prompt)."""
        self.at_prompt = False
        """Whether its output so far ends with a prompt mark (it waits for a line)."""
        self.ended = False
        self.error = ""
        """Why its output ended other than by its exit, if it did."""
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.held = ""
        """Text of the last answer kept for the next one: an escape sequence cut off at its
        end (once), or all of it, when the call was given up before it was cleaned."""
        self.held_once = False
        self.arrived = asyncio.Event()
        self.pump = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            async for event in self.proc:
                if event.data:
                    self._receive(event.data)
        except Exception as exc:  # (the sandbox went away): the shell is gone, and why
            self.error = str(exc) or type(exc).__name__
        finally:
            self.ended = True
            self.arrived.set()

    def _receive(self, data: bytes) -> None:
        seam = len(self.data)
        self.data += data
        # marks that end in what came (one cut in two by the chunks included)
        since = max(0, seam - len(MARK2) + 1)
        self.marks += sum(m.end() > seam for m in _MARKS.finditer(self.data, since))
        self.at_prompt = self.data.endswith(MARK) or self.data.endswith(MARK2)
        self._trim()
        self.arrived.set()

    def _trim(self) -> None:
        over = len(self.data) - self.limit
        if over > 0:
            while over < len(self.data) and 0x80 <= self.data[over] < 0xC0:
                over += 1  # (not into a character: from the next whole one)
            del self.data[:over]
            self.dropped += over

    def _answered(self, typed: bool) -> bool:
        """Whether a call has its answer: enough output, the shell gone, or (after input)
        back at a prompt having read every line typed, or (none typed) at any prompt."""
        if self.ended or self.dropped or len(self.data) >= ENOUGH:
            return True
        if not self.at_prompt or not self.data:
            return False
        return not typed or self.marks >= self.owed

    async def interact(self, text: str | None, wait: float, idle: float, limit: int) -> str:
        """Write `text` (if any) to the shell and return its output since the last call
        (see the module for when)."""
        self.limit = max(1, limit)
        self._trim()
        if text:
            if self.ended:
                raise ToolError(EXITED)
            typed = text.encode(errors="replace")
            # (marks past what was owed, a program's own, are not counted ahead)
            owed = max(self.owed, self.marks) + len(_LINE_ENDS.findall(typed))
            if b"\x03" in typed:  # Ctrl-C: what was typed ahead is dropped, one prompt comes
                owed = self.marks + 1
            self.owed = owed
            if owed > self.marks:  # (a line typed: the shell is not at that prompt now)
                self.at_prompt = False
            try:
                await self.proc.write(typed)
            except ProcessEnded as exc:
                raise ToolError(EXITED) from exc
        answered = await self.settle(bool(text), idle if self.data else wait, idle)
        if not answered and self.at_prompt:  # quiet at the shell's prompt: nothing is owed
            self.owed = self.marks  # (lines a program read instead, say a REPL's, made none)
        return await self._take()

    async def settle(self, typed: bool, wait: float, idle: float) -> bool:
        """Wait for the answer (see `_answered`): at most `wait` s for output, then until
        none came for `idle` s. Whether it came (False: given up waiting)."""
        left = wait
        while True:
            self.arrived.clear()
            if self._answered(typed):
                return True
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                return False
            left = idle

    async def _take(self) -> str:
        raw = bytes(self.data)
        dropped, self.dropped = self.dropped, 0
        self.data.clear()
        text = self.held + self.decoder.decode(raw, final=self.ended)
        self.held = ""
        cut = None if self.ended or self.held_once else _UNENDED.search(text)
        self.held_once = cut is not None
        if cut is not None:
            text, self.held = text[: cut.start()], text[cut.start() :]
        try:
            text = await asyncio.to_thread(clean, text) if len(text) > OFF_LOOP else clean(text)
        except BaseException:  # given up meanwhile: the next answer has it
            self.held, self.dropped = text + self.held, self.dropped + dropped
            raise
        if dropped:
            text = (
                f"[the shell's output passed {self.limit} bytes: {dropped} bytes omitted, "
                f"the last ones follow]\n{text}"
            )
        if self.ended and not text:
            raise ToolError(EXITED)
        return text

    async def close(self) -> None:
        """Kill the shell and its commands, and wait (at most CLOSE_WAIT s) for it to have
        ended; its reader ends with it."""
        with contextlib.suppress(Exception):
            await self.proc.kill()
        with contextlib.suppress(Exception):  # (the reader ends when the process does)
            await asyncio.wait_for(asyncio.shield(self.pump), CLOSE_WAIT)
        self.pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.pump


async def _start(box: OrchestratorSandbox, user: str | None, wait: float, idle: float) -> Shell:
    """A new shell, at its first prompt (its terminal's echo off before anything is typed);
    the prompt is kept for the call's answer, as Inspect's tool gives it. NoTerminal where
    the sandbox cannot give it one (asked in a thread: it may start the executor)."""
    from orchestrator.aio import AsyncProcess

    env = {**box.variables, "TERM": "dumb", "PROMPT_COMMAND": _MARK_PROMPTS}
    sync = box.sandbox.sync
    started = await asyncio.to_thread(
        lambda: sync.start(SHELL, tty=True, stdin=True, env=env, user=user, output_limit=ENOUGH)
    )
    shell = Shell(AsyncProcess(started))
    try:
        await shell.settle(False, wait, idle)
        if shell.ended and not shell.data:
            why = shell.error or f"it exited with {(await shell.proc.wait()).exit_code}"
            raise ToolError(f"the shell could not start: {why}")
        if not shell.data:
            raise ToolError(f"the shell printed no prompt within {wait:g}s")
    except BaseException:  # (cancelled, past the call's timeout, or not started: let go)
        await asyncio.shield(shell.close())
        raise
    shell.owed = shell.marks
    return shell


async def interact(
    box: OrchestratorSandbox,
    action: Action,
    text: str | None,
    *,
    instance: str | None = None,
    user: str | None = None,
    wait_for_output: float = WAIT_FOR_OUTPUT,
    idle: float = IDLE,
    limit: int | None = None,
    timeout: float | None = WAIT_FOR_OUTPUT + TRANSPORT,
) -> str:
    """One call of the tool on `box`: the shell of `instance` (started on first use),
    given `action`. Calls to one shell take turns; each ends within `timeout` s (waiting
    for its turn, a shell that reads none of what is typed, included): TimeoutError."""
    async with asyncio.timeout(timeout):
        return await _interact(box, action, text, instance, user, wait_for_output, idle, limit)


async def _interact(
    box: OrchestratorSandbox,
    action: Action,
    text: str | None,
    instance: str | None,
    user: str | None,
    wait_for_output: float,
    idle: float,
    limit: int | None,
) -> str:
    async with box.shell_locks.setdefault(instance, asyncio.Lock()):
        shell = box.shells.get(instance)
        if shell is None or action == "restart":
            if box.shells_closed:
                raise ToolError("the sample's sandbox has ended")
            if shell is not None:
                del box.shells[instance]
                await asyncio.shield(shell.close())
            shell = await _start(box, user, wait_for_output, idle)
            if box.shells_closed:  # (its sample ended while it started)
                await shell.close()
                raise ToolError("the sample's sandbox has ended")
            box.shells[instance] = shell
            if action == "restart":
                return RESTARTED
        typed = {"type": text, "type_submit": (text or "") + "\n", "interrupt": "\x03"}
        return await shell.interact(
            typed.get(action),
            wait_for_output,
            idle,
            limit or SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
        )


async def close_shells(box: OrchestratorSandbox) -> None:
    """Kill every shell of `box` (its sample ended); none starts after."""
    box.shells_closed = True
    shells, box.shells = box.shells, {}
    for shell in shells.values():
        await shell.close()
