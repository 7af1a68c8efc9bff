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

from inspect_ai.tool import Tool, ToolError, ToolResult, tool
from inspect_ai.tool._tool import ToolParsingError
from inspect_ai.util import SandboxEnvironmentLimits, tool_state_instance
from inspect_ai.util import sandbox as current_sandbox

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
    r"\x1b\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)"  # OSC, ended (a title, a link, a mark)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves)
    r"|\x1b[ -/]*[0-~]"  # any other escape (an OSC never ended: its ESC ] alone)
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # control characters but tab, newline, return
)
_UNENDED = re.compile(r"\x1b(?:\][^\x07\x1b]{0,4096}|\[[0-?]*[ -/]*|[ -/]*)?\Z")
"""An escape sequence cut off at the end of what came: kept for the next call."""
_NEWLINES = re.compile(r"\r+\n")
_LINE_ENDS = re.compile(rb"[\r\n\x03]")


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
        self.at_prompt = False
        """Whether its output so far ends with a prompt mark (it waits for a line)."""
        self.ended = False
        self.error = ""
        """Why its output ended other than by its exit, if it did."""
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.held = ""
        """An escape sequence cut off at the end of the last answer, for the next one."""
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

    def _answered(self, needed: int | None, marks: int) -> bool:
        """Whether a call has its answer: enough output, the shell gone, or back at a
        prompt after the `needed` prompts its input makes (None: any prompt)."""
        if self.ended or self.dropped or len(self.data) >= ENOUGH:
            return True
        if not self.at_prompt or not self.data:
            return False
        return needed is None or self.marks - marks >= needed

    async def interact(self, text: str | None, wait: float, idle: float, limit: int) -> str:
        """Write `text` (if any) to the shell and return its output since the last call
        (see the module for when)."""
        self.limit = max(1, limit)
        self._trim()
        needed = None
        marks = self.marks
        if text:
            if self.ended:
                raise ToolError(EXITED)
            typed = text.encode(errors="replace")
            # each line ended (or Ctrl-C) is answered by a prompt, once the shell reads
            # it; a shell busy with a command prints one first, when the command ends
            needed = len(_LINE_ENDS.findall(typed)) + (0 if self.at_prompt else 1)
            if typed == b"\x03":
                needed = 1
            try:
                await self.proc.write(typed)
            except ProcessEnded as exc:
                raise ToolError(EXITED) from exc
        await self.settle(needed, marks, idle if self.data else wait, idle)
        return await self._take()

    async def settle(self, needed: int | None, marks: int, wait: float, idle: float) -> None:
        """Wait for the answer (see `_answered`): at most `wait` s for output, then until
        none came for `idle` s."""
        left = wait
        while True:
            self.arrived.clear()
            if self._answered(needed, marks):
                return
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except TimeoutError:
                return
            left = idle

    async def _take(self) -> str:
        raw = bytes(self.data)
        dropped, self.dropped = self.dropped, 0
        self.data.clear()
        text = self.held + self.decoder.decode(raw, final=self.ended)
        self.held = ""
        if not self.ended and (cut := _UNENDED.search(text)) is not None:
            text, self.held = text[: cut.start()], text[cut.start() :]
        if len(text) > OFF_LOOP:
            text = await asyncio.to_thread(clean, text)
        else:
            text = clean(text)
        if dropped:
            text = (
                f"[the shell's output passed {self.limit} bytes: {dropped} bytes omitted, "
                f"the last ones follow]\n{text}"
            )
        if self.ended and not text:
            raise ToolError(EXITED)
        return text

    async def close(self) -> None:
        """Kill the shell and its commands; its reader ends with it."""
        with contextlib.suppress(Exception):
            await self.proc.kill()
        self.pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.pump


async def _start(box: OrchestratorSandbox, user: str | None, wait: float, idle: float) -> Shell:
    """A new shell, at its first prompt (its terminal's echo off before anything is typed);
    the prompt is kept for the call's answer, as Inspect's tool gives it."""
    env = {**box.variables, "TERM": "dumb", "PROMPT_COMMAND": _MARK_PROMPTS}
    proc = await box.sandbox.start(
        SHELL, tty=True, stdin=True, env=env, user=user, output_limit=ENOUGH
    )
    shell = Shell(proc)
    try:
        await shell.settle(None, 0, wait, idle)
    except BaseException:  # (cancelled, or past the call's timeout: nobody would hold it)
        await asyncio.shield(shell.close())
        raise
    if shell.ended and not shell.data:
        why = shell.error or f"it exited with {(await proc.wait()).exit_code}"
        raise ToolError(f"the shell could not start: {why}")
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
                await shell.close()
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


async def gives_terminal(box: OrchestratorSandbox) -> bool:
    """Whether `box` can run the shell on a terminal (not where commands go by plain
    `docker exec`: no python3 in the image); asked once."""
    if box.terminal is None:
        box.terminal = await asyncio.to_thread(box.sandbox.sync._gives_terminal)
    return box.terminal


def _ours(user_sandbox: object) -> OrchestratorSandbox | None:
    from orchestrator.integrations.inspect import OrchestratorSandbox, _on_asyncio

    if not _on_asyncio():
        return None
    try:
        return user_sandbox.as_type(OrchestratorSandbox)  # type: ignore[attr-defined, no-any-return]
    except TypeError:
        return None


@tool(name="bash_session")
def bash_session(
    *,
    timeout: int | None = None,
    wait_for_output: int | None = None,
    user: str | None = None,
    instance: str | None = None,
) -> Tool:
    """Inspect's `bash_session` tool (the same arguments and defaults), run natively on an
    orchestrator sandbox (see the module); on any other sandbox, Inspect's own.

    Args:
      timeout: Seconds a call may take in all (default: `wait_for_output` + 180).
      wait_for_output: Seconds a call waits for the first output (default 30).
      user: The user the shell runs as (default: the sandbox's).
      instance: Which shell (each instance has its own); default: the current
          `tool_state_scope()`, if any.
    """
    wait = wait_for_output or WAIT_FOR_OUTPUT
    if timeout is None:
        timeout = wait + TRANSPORT
    elif timeout < wait + TRANSPORT:
        raise ValueError(f"Timeout must be at least {wait + TRANSPORT} seconds, but got {timeout}.")
    fallback: list[Tool] = []

    async def execute(action: Action, input: str | None = None) -> ToolResult:
        r"""
        Interact with a bash shell.

        Sends text to a long-running bash shell and returns what it printed since the last
        call. A call may not return all of a command's output: call again (action "read")
        for more.

        USAGE NOTES:
        - Submit a new command when the shell is at its prompt (output ending in "$ " or
          "# ").
        - Send control characters as Unicode escapes ("\u0003" is Ctrl+C, "\u0004"
          Ctrl+D); the words "Ctrl+C" are typed as they are.
        - "read" returns new output without typing anything: use it while a long command
          runs.
        - Input typed while a command runs waits until it ends; "interrupt" (Ctrl+C)
          stops it.
        - Output ending in "> " is the shell's continuation prompt: the input left a quote
          or bracket open. Finish it, or "interrupt" and type it again.

        Examples:
        - bash_session(action="type_submit", input="echo foo") -> "foo\nuser@host:/# "
        - bash_session(action="type_submit", input="tail -f /tmp/foo.log") -> output;
          bash_session(action="read") -> more output;
          bash_session(action="interrupt") -> "^Cuser@host:/# "
        - bash_session(action="type_submit", input="ssh fred@foo.com") -> "password: ";
          bash_session(action="type_submit", input="secret") -> "fred@foo.com:~$ "

        Args:
          action: What to do:
                - "type": type the input, without pressing return
                - "type_submit": type the input and press return
                - "read": return new output, typing nothing
                - "interrupt": type Ctrl+C to stop what runs
                - "restart": start a new shell in place of this one
          input: The text to type. Needed for "type", optional for "type_submit", not
                given for "restart", "read" or "interrupt".

        Returns:
          The shell's output since the last call.
        """
        if action == "type" and input is None:
            raise ToolParsingError(f"'input' is required for '{action}' action.")
        if action in ("restart", "read", "interrupt") and input is not None:
            raise ToolParsingError(f"Do not provide 'input' with '{action}' action.")
        box = _ours(current_sandbox())
        if box is None or not await gives_terminal(box):
            if not fallback:
                from inspect_ai.tool import bash_session as inspect_bash_session

                fallback.append(
                    inspect_bash_session(
                        timeout=timeout, wait_for_output=wait, user=user, instance=instance
                    )
                )
            return await fallback[0](action=action, input=input)
        return await interact(
            box,
            action,
            input,
            instance=tool_state_instance(instance),
            user=user,
            wait_for_output=wait,
            timeout=timeout,
        )

    return execute
