"""The plain-exec path: one `docker exec` per command, for images where the executor cannot
run (no python3). Still kills the whole tree inside the container on timeout: the command
runs with a unique marker in its environment, which every descendant inherits, and a second
exec kills each process whose /proc/PID/environ holds it (POSIX sh, tr and grep; no
`timeout`, `setsid` or `pkill` needed in the image, and nothing left behind in it)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import uuid

from orchestrator import procutil
from orchestrator.errors import BackendUnavailable
from orchestrator.runtime.options import Chunks, Command, stdin_chunks

MARK = "ORCHESTRATOR_CMD"
NO_USER = b"unable to find user "
KILL_TIMEOUT = 5.0
"""Longest the in-container kill may take (an engine that does not answer)."""
# `sh -c KILL_MARKED sh TOKEN SIGNAL`
KILL_MARKED = r"""
m="ORCHESTRATOR_CMD=$1"
for e in /proc/[0-9]*/environ; do
  tr '\000' '\n' < "$e" 2>/dev/null | grep -qx "$m" || continue
  p=${e#/proc/}; kill -"$2" "${p%/environ}" 2>/dev/null
done
exit 0
"""


def run_plain(
    docker_cmd: list[str], container: str, cmd: Command, out: int | None = None
) -> Chunks:
    """`cmd` by one `docker exec`. `out`: the read end of a FIFO the command's output goes
    to instead of through the engine (see `procutil.pump`)."""
    token = uuid.uuid4().hex
    argv = [*docker_cmd, "exec", "-e", f"{MARK}={token}"]
    if cmd.stdin is not None:
        argv.append("-i")
    if cmd.user:
        argv += ["-u", cmd.user]
    argv += ["-w", cmd.cwd]
    for key, value in cmd.env.items():
        argv += ["-e", f"{key}={value}"]
    # through sh, so a missing program is 127 with the message on stderr, as everywhere else
    argv += [container, "/bin/sh", "-c", 'exec "$@"', "sh", *cmd.argv]

    def killer(client: subprocess.Popen[bytes], sig: int) -> None:
        name = signal.Signals(sig).name.removeprefix("SIG")
        # as the command's own user: root in a container has no CAP_SYS_PTRACE, so it
        # cannot read another uid's environ; the same uid can, and may signal it
        user = ["-u", cmd.user] if cmd.user else []
        kill = [*docker_cmd, "exec", *user, container, "/bin/sh", "-c", KILL_MARKED, "sh"]
        # a paused or vanished container fails or times out here: the client is killed below
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [*kill, token, name], capture_output=True, timeout=KILL_TIMEOUT, check=False
            )
        if sig == signal.SIGKILL:
            client.kill()  # and the local docker client, which a paused sandbox would hold

    stdin = stdin_chunks(cmd.stdin) if cmd.stdin is not None else None
    chunks = procutil.run(
        argv, None, None, stdin=stdin, timeout=cmd.timeout, killer=killer, out=out
    )
    try:
        first = True
        while True:
            try:
                kind, data = next(chunks)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            except procutil.NoProcess as exc:  # this host, not the sandbox, is out of processes
                raise BackendUnavailable(f"cannot start the docker client: {exc.strerror}") from exc
            if first and kind == "stdout" and data.startswith(NO_USER):
                # the docker CLI prints its own refusal on stdout
                kind, data = "stderr", data.replace(b"\r\n", b"\n")
            first = False
            yield kind, data
    finally:
        chunks.close()  # a caller that gave up: the core kills the tree in the container
