"""How commands reach one container of a Docker environment (the main sandbox or a service):
its in-container executor, started once and restarted if it dies, or plain `docker exec` per
command where the executor cannot run (no python3) or cannot act as the command's user."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from orchestrator import procutil
from orchestrator.compile.render import SANDBOX_MOUNT
from orchestrator.errors import ExecutorLost, SandboxUnavailable
from orchestrator.runtime.executor.client import ExecutorClient
from orchestrator.runtime.executor.plain import run_plain
from orchestrator.runtime.options import Chunks, Command
from orchestrator.runtime.results import Outcome

log = logging.getLogger("orchestrator.docker")
READY_TIMEOUT = 15.0
Mode = Literal["auto", "executor", "plain"]
ROOT = (None, "0", "0:0")
"""Users a root executor without CAP_SETUID can still run commands as (itself)."""


class Channel:
    def __init__(
        self,
        *,
        label: str,
        docker_cmd: list[str],
        container: str,
        mode: Mode,
        owned: bool,
        lost: Callable[[], SandboxUnavailable | None],
        killed: Callable[[], bool],
        warn: Callable[[str], None],
    ) -> None:
        self.label = label
        self.mode = mode
        self._docker_cmd = docker_cmd
        self._container = container
        self._owned = owned
        self._lost = lost
        self._killed = killed
        self._warn = warn
        self._executor: ExecutorClient | None = None
        self._lock = threading.Lock()

    # ----- the executor ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the executor now (it greets while the caller does other work)."""
        if self.mode != "plain":
            with self._lock:
                if self._executor is None:
                    self._executor = self._new_executor()

    def _new_executor(self) -> ExecutorClient:
        client = ExecutorClient(
            [
                *self._docker_cmd,
                "exec",
                "-i",
                "-u",
                "0",
                self._container,
                "python3",
                "-u",
                "-I",  # isolated: no user site, no PYTHON* variables of the sandbox
                "-S",  # no site import: a faster start
                f"{SANDBOX_MOUNT}/agent.py",
                # owned: when this process dies, by any signal, the container stops itself
                *(["--owned"] if self._owned else []),
            ]
        )
        client.start()
        return client

    def ready(self) -> ExecutorClient | None:
        """The live executor (restarted if it died), or None where commands go plain."""
        if self.mode == "plain":
            return None
        with self._lock:
            ex = self._executor
            if ex is None or not ex.alive:
                if ex is not None:
                    why = ex.stderr_tail or "no output"
                    log.warning("%s: executor died (%s); starting a new one", self.label, why)
                    ex.close()
                ex = self._executor = self._new_executor()
        if ex.wait_ready(READY_TIMEOUT):
            self.mode = "executor"
            return ex
        ex.close()  # also collects what it printed before dying
        reason = ex.stderr_tail or "no answer"
        with self._lock:
            if self._executor is ex:
                self._executor = None
        lost = self._lost()
        if lost is not None:
            raise lost
        if self.mode == "executor":
            raise ExecutorLost(f"{self.label}: the executor cannot run in this image: {reason}")
        self.mode = "plain"
        self._warn(
            f"{self.label}: the fast executor cannot run in this image ({reason}); "
            "falling back to plain `docker exec` per command"
        )
        return None

    def shutdown(self) -> None:
        """Ask the executor to stop, without waiting (the container is going down)."""
        if self._executor is not None:
            self._executor.shutdown()

    def close(self, release: bool = True) -> None:
        with self._lock:
            ex, self._executor = self._executor, None
        if ex is not None:
            ex.close(release=release)

    # ----- commands ----------------------------------------------------------------------------
    def run(self, cmd: Command, *, bulk: bool = False) -> Chunks:
        """Run one command. `bulk` (a folder packed for download) goes by plain exec: its
        output then crosses one process less than through the executor, which matters for
        100 MB more than the exec's start-up does."""
        ex = None if bulk else self.ready()
        if ex is not None and not (ex.info.get("setuid", True) or cmd.user in ROOT):
            ex = None  # root without CAP_SETUID here (a non-root service): docker exec -u
        if ex is None:
            outcome = yield from run_plain(self._docker_cmd, self._container, cmd)
            failed = outcome.exit_code != 0 or outcome.timed_out
            if failed and not self._killed():  # the command failed, or the container did?
                lost = self._lost()
                if lost is not None:
                    raise lost
            return outcome
        started = time.monotonic()
        try:
            return (yield from ex.run(cmd, procutil.GRACE, self._lost))
        except ExecutorLost as exc:
            if self._killed():  # kill() ended it, as SIGKILL ends a process
                return Outcome(137, False, time.monotonic() - started)
            ex.close()  # the next command starts a fresh one
            lost = self._lost()
            if lost is not None:
                raise lost from exc
            raise
