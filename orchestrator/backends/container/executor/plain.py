"""The plain-exec path: one `docker exec` per command, for images where the executor cannot
run (no python3). Still kills the whole tree inside the container on timeout, by a second
exec (`KILL_TREE`) that kills: every process of the command's session (docker starts each
exec as a session of its own; the command names it, `$$`, on the first line of its stderr,
which is taken off before anyone sees it), every descendant of a process it found, and every
process whose /proc/PID/environ holds the command's unique marker (a `setsid` daemon), with
the sessions of those too. So a child that cleared its environment (`env -i`) is found by
its session or its parent, and one that left the session by its marker; only one that does
both (and outlives its parent) escapes, as it would escape the executor's kill.

The killer uses shell builtins only (read, kill, case, echo: no `tr`, `grep` or `ps`), so it
needs one process, the exec itself, however many the command took: a fork loop that filled
the pids limit cannot stop it (the engine moves an exec into a full cgroup). It freezes what
it finds (SIGSTOP) until a whole pass finds nothing new, so nothing forks or is reparented
away while it looks, then sends the signal (and SIGCONT, so a SIGTERM is acted on). Where
even the exec cannot start (an engine that charges it to the full pids limit), it is retried
until KILL_TIMEOUT; if it never ran, the command raises SandboxUnavailable: its processes
may still run, and the sandbox cannot start a process anyway.

POSIX sh only: nothing is installed in the image, and nothing is left behind in it."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid

from orchestrator import procutil
from orchestrator.backends.container.exec_target import ExecTarget
from orchestrator.errors import BackendUnavailable, SandboxUnavailable
from orchestrator.sandbox.options import Chunks, Command, stdin_chunks

MARK = "ORCHESTRATOR_CMD"
HOLD_LIMIT = 64 * 1024
"""Most stdout held before the command's session line: the docker CLI prints why the engine
would not start a command there (an unknown user, a missing cwd), never more."""
KILL_TIMEOUT = 5.0
"""Longest the in-container kill may take, retries included (an engine that does not
answer, a sandbox that cannot start the killer)."""
# The command, through sh, in a subshell that says its session on stderr (echo is a builtin
# everywhere; $$ is the wrapper's pid, the session's id) and execs the command (a program,
# never a builtin of this shell's); then the wrapper says the command's exit status on
# stderr. That last line says the command has ended while the docker client still waits on
# the engine, which holds the exec's streams for ~2 s more while a background process has
# them: the deadline no longer applies then. The wrapper's own stderr is /dev/null (the
# command's is fd 9, closed in the command), so a shell's report of a child killed by a
# signal ("Killed") is not taken for the command's; a session line that never came means the
# subshell could not be forked (see `run_plain`).
SESSION = b"orchestrator-session:"
EXITED = b"\x1e\x1forchestrator-exit:"
"""Starts the wrapper's last stderr line (two control characters first, so that output a
command prints by chance does not end in it)."""
WRAP = (
    'exec 9>&2 2>/dev/null; (echo "orchestrator-session:$$" >&9; exec "$@" 2>&9 9>&-); '
    'r=$?; echo "\036\037orchestrator-exit:$r" >&9; exit $r'
)
DONE = "orchestrator-killed:"
"""The killer's last line, then the sessions it found (passed to the next pass)."""
# `sh -c KILL_TREE sh TOKEN SIGNAL [SESSION...]`: builtins only (see the module docstring)
KILL_TREE = r"""
m="ORCHESTRATOR_CMD=$1"; sig=$2; shift 2; me=$$; sids=" "
for s in "$@"; do [ "$s" -gt 1 ] 2>/dev/null && sids="$sids$s "; done
hit=" "; quiet=0; n=0
while [ $quiet -lt 2 ] && [ $n -lt 300 ]; do
  n=$((n + 1)); new=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $hit in *" $p "*) continue ;; esac
    if [ "$p" = "$me" ] || [ "$p" = 1 ]; then continue; fi
    read -r st 2>/dev/null < "$d/stat" || continue
    st=${st##*) }; set -- $st
    [ "$1" = Z ] && continue
    take=
    case $sids in *" $4 "*) take=1 ;; esac
    case $hit in *" $2 "*) take=1 ;; esac
    if [ -z "$take" ]; then
      e=; l=
      { while IFS= read -r l || [ -n "$l" ]; do e="$e$l"; l=; done; } 2>/dev/null < "$d/environ"
      case $e in *"$m"*) take=1 ;; esac
    fi
    [ -n "$take" ] || continue
    kill -STOP "$p" 2>/dev/null || continue
    hit="$hit$p "; new=1
    if [ "$4" -gt 1 ]; then case $sids in *" $4 "*) ;; *) sids="$sids$4 " ;; esac; fi
  done
  if [ $new = 1 ]; then quiet=0; else quiet=$((quiet + 1)); fi
done
for p in $hit; do kill -"$sig" "$p" 2>/dev/null; kill -CONT "$p" 2>/dev/null; done
echo "orchestrator-killed:$sids"
"""
_NO_PROCESS = re.compile(
    rb"can't fork|cannot fork|resource temporarily unavailable|cannot allocate memory",
    re.IGNORECASE,
)


class _Killer:
    """Kills one command's processes inside the container (see the module docstring)."""

    def __init__(self, docker_cmd: list[str], container: str, cmd: Command, token: str):
        # as the command's own user: root in a container has no CAP_SYS_PTRACE, so it
        # cannot read another uid's environ; the same uid can, and may signal it
        target = ExecTarget(docker_cmd, container)
        self._argv = target.argv(["/bin/sh", "-c", KILL_TREE, "sh"], user=cmd.user)
        self._token = token
        self.sessions: list[str] = []
        """Sessions found by earlier passes: their processes die in later ones, even once
        nothing marked is left to find them by."""
        self.no_process = b""
        """Why the killer could not run at all, when the sandbox cannot start a process."""
        self.ended = False
        """The command has exited (its wrapper said so): what still runs in its session is
        left running, as the executor leaves it; only the local docker client is ended."""

    def __call__(self, client: subprocess.Popen[bytes], sig: int) -> None:
        if self.ended:
            if sig == signal.SIGKILL:
                client.kill()
            return
        name = signal.Signals(sig).name.removeprefix("SIG")
        deadline, pause = time.monotonic() + KILL_TIMEOUT, 0.05
        while True:
            said = self._once(name, deadline)
            if said is None:  # done, or the engine does not answer
                break
            self.no_process = said
            if time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)  # a fork loop may free a slot (a shell dies at its failure)
            pause = min(pause * 2, 0.5)
        if sig == signal.SIGKILL:
            client.kill()  # and the local docker client, which a paused sandbox would hold

    def _once(self, name: str, deadline: float) -> bytes | None:
        """One pass: the words of a sandbox that could not start a process (retry), else
        None: it ran, or failed otherwise (paused, gone: the caller's probe says so)."""
        argv = [*self._argv, self._token, name, *self.sessions]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                timeout=max(0.1, deadline - time.monotonic()),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in done.stdout.decode(errors="replace").splitlines():
            if line.startswith(DONE):
                self.sessions = line.removeprefix(DONE).split()
                self.no_process = b""
                return None
        said = done.stdout + done.stderr
        return (said.strip() or b"no answer") if _NO_PROCESS.search(said) else None


def run_plain(
    docker_cmd: list[str], container: str, cmd: Command, out: int | None = None
) -> Chunks:
    """`cmd` by one `docker exec`. `out`: the read end of a FIFO the command's output goes
    to instead of through the engine (see `procutil.pump`)."""
    try:  # ids the engine's runtime may not refuse (runsc runs -1 as nobody): refused here
        procutil.numeric_ids(cmd.user or "")
    except procutil.UnknownUser as exc:
        yield "stderr", f"{exc}\n".encode()
        return procutil.Outcome(126, False, 0.0)
    token = uuid.uuid4().hex
    # through sh, so a missing program is 127 with the message on stderr, as everywhere else
    argv = ExecTarget(docker_cmd, container).argv(
        ["/bin/sh", "-c", WRAP, "sh", *cmd.argv],
        user=cmd.user,
        workdir=cmd.cwd,
        env={**cmd.env, MARK: token},  # last: a caller's variable cannot hide the mark
        stdin=cmd.stdin is not None,
    )
    killer = _Killer(docker_cmd, container, cmd, token)

    stdin = stdin_chunks(cmd.stdin) if cmd.stdin is not None else None
    chunks = procutil.run(
        argv,
        None,
        None,
        stdin=stdin,
        timeout=cmd.timeout,
        killer=killer,
        out=out,
        ended=lambda: killer.ended,
    )
    mark = _ExitMark()
    try:
        head: bytes | None = b""  # stderr until the session's line is complete
        held: bytes | None = b""  # stdout until then: the engine's refusal if it never comes
        while True:
            try:
                kind, data = next(chunks)
            except StopIteration as stop:
                outcome: procutil.Outcome = stop.value
                if head:
                    yield "stderr", head  # not our line after all (the exec failed)
                if rest := mark.rest():
                    yield "stderr", rest
                if mark.code is not None and not outcome.timed_out:  # not the client's own
                    outcome = outcome._replace(exit_code=mark.code)
                if _unforked(killer, held, head, mark, outcome):
                    yield "stderr", NO_FORK
                    outcome = outcome._replace(exit_code=126)  # as the engine says it
                if held:  # the command never started: the docker CLI's refusal
                    code, said = _refusal(held, outcome.exit_code)
                    outcome = outcome._replace(exit_code=code)
                    yield "stderr", said
                if killer.no_process:
                    raise SandboxUnavailable(
                        "the sandbox cannot start a process (its pids or memory limit is "
                        "reached), so the processes of a command that timed out could not "
                        "be killed and may still run: "
                        + killer.no_process.decode(errors="replace")[-300:]
                    ) from None
                return outcome
            except procutil.NoProcess as exc:  # this host, not the sandbox, is out of processes
                raise BackendUnavailable(f"cannot start the docker client: {exc.strerror}") from exc
            if head is not None and kind == "stderr":
                head, data = _session(head + data, killer)
                if head is None:  # the first line is there: the command (or sh) runs
                    if held:
                        yield "stdout", held
                    held = None
                if not data:
                    continue
            elif held is not None and kind == "stdout" and len(held) < HOLD_LIMIT:
                held += data
                continue
            elif held:  # more than a refusal: the command's own
                yield "stdout", held
                held = None
            if kind == "stderr" and head is None:
                data = mark.feed(data)
                killer.ended = mark.code is not None
                if not data:
                    continue
            yield kind, data
    finally:
        chunks.close()  # a caller that gave up: the core kills the tree in the container


NO_FORK = b"sh: can't fork: the sandbox cannot start a process\n"
"""What a command the wrapper could not fork says (in the words a shell uses, which the file
helpers read as "the sandbox cannot start a process")."""


def _unforked(
    killer: _Killer,
    held: bytes | None,
    head: bytes | None,
    mark: _ExitMark,
    outcome: procutil.Outcome,
) -> bool:
    """Whether the wrapper ran but could not fork the command's subshell: no session line,
    nothing else printed, and the wrapper's status line (busybox goes on after a failed
    fork) or the 2 of a shell that exits at one (dash)."""
    quiet = not killer.sessions and not held and not head
    return quiet and not outcome.timed_out and (mark.code is not None or outcome.exit_code == 2)


class _ExitMark:
    """Finds the wrapper's last line (EXITED, the status, a newline) in the stderr after the
    session's line, and takes it out; what may be its start, at the end of a chunk, is held
    until the next chunk says."""

    def __init__(self) -> None:
        self.code: int | None = None
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What of `data` (after what was held) goes on as the command's stderr."""
        if self.code is not None:
            return data  # a background process's, after the command ended
        data, self._held = self._held + data, b""
        at = data.find(EXITED)
        if at >= 0:
            end = data.find(b"\n", at)
            status = data[at + len(EXITED) : end]
            if end < 0 and len(data) - at <= len(EXITED) + 3:
                self._held = data[at:]  # the line is not complete yet
                return data[:at]
            if end >= 0 and status.isdigit() and len(status) <= 3:
                self.code = int(status)
                return data[:at] + data[end + 1 :]
            return data  # not the wrapper's line
        for size in range(min(len(EXITED) - 1, len(data)), 0, -1):
            if data.endswith(EXITED[:size]):
                self._held = data[-size:]
                return data[:-size]
        return data

    def rest(self) -> bytes:
        """What is held at the end: not the line after all."""
        held, self._held = self._held, b""
        return held


_CHDIR = re.compile(  # runc's words, then runsc's
    rb'(?:chdir to cwd \("(.*)"\) set in config\.json failed'
    rb'|failed to find initial working directory "(.*)"): ([a-z ]+)'
)


def _refusal(said: bytes, code: int) -> tuple[int, bytes]:
    """The exit code and stderr of a command the engine would not start, from what the
    docker CLI printed (on its stdout): a missing or non-folder cwd is 2 and the words the
    executor uses, as a shell would say it; the rest keep the engine's words."""
    found = _CHDIR.search(said)
    if found is not None and found.group(3) in (b"no such file or directory", b"not a directory"):
        why = found.group(3).decode().capitalize()
        where = found.group(1) or found.group(2)
        return 2, b"cannot change directory to %s: %s\n" % (where, why.encode())
    return code, said.replace(b"\r\n", b"\n")


def _session(head: bytes, killer: _Killer) -> tuple[bytes | None, bytes]:
    """Take the command's first stderr line, its session, off `head`: (what is still held,
    None once done; what goes on to the caller)."""
    if head.startswith(SESSION) and b"\n" not in head and len(head) < 64:
        return head, b""  # the line is not complete yet
    if SESSION.startswith(head):
        return head, b""
    line, newline, rest = head.partition(b"\n")
    if head.startswith(SESSION) and newline and line[len(SESSION) :].isdigit():
        killer.sessions.append(line[len(SESSION) :].decode())
        return None, rest
    return None, head
