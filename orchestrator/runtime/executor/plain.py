"""The plain-exec path: one `docker exec` per command, for images where the executor cannot
run (no python3). Still kills the whole tree inside the container on timeout: the command
records its pid, and a second exec walks /proc from it with POSIX sh (no `timeout`, `setsid`
or `pkill` needed in the image)."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid

from orchestrator.runtime import procutil
from orchestrator.runtime.options import Chunks, Command
from orchestrator.runtime.results import Outcome

# `sh -c WRAP PIDFILE argv...`: $0 is the pid file; exec keeps the pid.
WRAP = 'echo $$ > "$0" 2>/dev/null; exec "$@"'
# `sh -c KILL_TREE sh PIDFILE SIGNAL`: signal the recorded process and all its descendants.
KILL_TREE = r"""
read -r root < "$1" 2>/dev/null || exit 0
sig=$2; pids=" $root "; changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for s in /proc/[0-9]*/stat; do
    read -r l < "$s" 2>/dev/null || continue
    pid=${l%% *}; rest=${l##*) }; set -- $rest
    case "$pids" in *" $pid "*) continue ;; esac
    case "$pids" in *" $2 "*) pids="$pids$pid "; changed=1 ;; esac
  done
done
kill -"$sig" $pids 2>/dev/null
[ "$sig" = KILL ] && rm -f "$1"
exit 0
"""


def run_plain(docker_cmd: list[str], container: str, cmd: Command) -> Chunks:
    pidfile = f"/tmp/.orchestrator-{uuid.uuid4().hex}.pid"
    argv = [*docker_cmd, "exec"]
    if cmd.stdin is not None:
        argv.append("-i")
    if cmd.user:
        argv += ["-u", cmd.user]
    argv += ["-w", cmd.cwd]
    for key, value in cmd.env.items():
        argv += ["-e", f"{key}={value}"]
    argv += [container, "/bin/sh", "-c", WRAP, pidfile, *cmd.argv]

    def killer(sig: int) -> None:
        name = signal.Signals(sig).name.removeprefix("SIG")
        subprocess.run(
            [
                *docker_cmd,
                "exec",
                "-u",
                "0",
                container,
                "/bin/sh",
                "-c",
                KILL_TREE,
                "sh",
                pidfile,
                name,
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )

    started = time.monotonic()
    proc = procutil.spawn(argv, None, None, with_stdin=cmd.stdin is not None)
    done = False
    try:
        stdin = [cmd.stdin] if cmd.stdin is not None else None
        code, timed_out, elapsed = yield from procutil.pump(
            proc, stdin, cmd.timeout, killer=killer, started=started
        )
        done = True
        return Outcome(code, timed_out, elapsed)
    finally:
        if not done:
            killer(signal.SIGKILL)
            proc.kill()
            proc.wait()
