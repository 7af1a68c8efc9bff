"""Tethers: the extra services of a project tied to the life of the process that started
it. In each, a `docker exec -i` of TETHER waits on an input whose only write end this
process holds; when that input ends without the word `release` (this process died, by any
signal), the service stops itself from inside, as the main container does through its
executor's --owned."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterable

from orchestrator import procutil
from orchestrator.backends.container.engine import ExecTarget
from orchestrator.backends.container.removal import TURN

# `sh -c TETHER`, in each extra service of a project with an owner process
TETHER = r"""
read -r word
[ "$word" = release ] && exit 0
sleep "$1" 2>/dev/null
kill -TERM 1 2>/dev/null
sleep 2 2>/dev/null
kill -KILL -1 2>/dev/null
exit 0
"""
"""Wait for the end of input; unless it brought the word `release`, stop this container
from inside, after its turn's delay ($1 seconds): SIGTERM to its init (which passes it on),
then SIGKILL to whatever else runs as its user (the init then exits with its child: the
container stops)."""

RELEASE = b"release\n"
TETHER_WAIT = 5.0
"""Longest `release` waits for the tethers to take their word and exit."""


def _end_tethers(tethers: list[subprocess.Popen[bytes]]) -> None:
    """Kill the tethers still running once their services are removed (or their removal
    failed: the guardian or a reap finishes it). A `docker exec` into a gVisor container
    that is removed never returns: left, it would outlive this process, an orphan."""
    for proc in tethers:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()


class Tethers:
    """The tethers of one project, and those released that had not exited yet."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._lingering: list[subprocess.Popen[bytes]] = []
        """Tethers released that had not exited within TETHER_WAIT (see `end_lingering`)."""

    def tie(self, targets: Iterable[ExecTarget]) -> None:
        """Start a tether in each service (`targets`: their exec targets). A service without
        /bin/sh is not tied: the next reaper (`ps`, any spawn) removes it."""
        for turn, target in enumerate(targets, start=1):
            delay = f"{TURN * turn:.2f}"
            argv = target.argv(["/bin/sh", "-c", TETHER, "tether", delay], stdin=True)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a terminal's Ctrl-C to us is not our death
                    env=procutil.marked_environ(),  # ended by our guardian if we die first
                )
            except OSError:  # no process slot left: the guardian and the reapers remain
                continue
            with self._lock:
                self._procs.append(proc)

    def release(self) -> None:
        """Untie the services from this process (kept, handed over, or being removed):
        each tether gets the word `release` and exits, leaving its service running. Those
        still running after TETHER_WAIT linger (see `end_lingering`)."""
        with self._lock:
            tethers, self._procs = self._procs, []
        for proc in tethers:
            if proc.stdin is None:
                continue
            with contextlib.suppress(OSError):  # its container is gone already
                proc.stdin.write(RELEASE)
            with contextlib.suppress(OSError):
                proc.stdin.close()
        deadline = time.monotonic() + TETHER_WAIT
        for proc in tethers:
            # never killed here: that would end its input, which stops the service; a tether
            # slow to exit (a gVisor service's exec ends slowly) is waited for by a thread of
            # its own, which holds it until it ends: dropped while running, it would be a
            # zombie and a ResourceWarning
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with self._lock:
                    self._lingering.append(proc)
                threading.Thread(target=proc.wait, daemon=True).start()

    def end_lingering(self) -> None:
        """Once the services are removed: kill the released tethers still running."""
        with self._lock:
            lingering, self._lingering = self._lingering, []
        _end_tethers(lingering)
