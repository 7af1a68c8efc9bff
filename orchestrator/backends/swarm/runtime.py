"""The swarm backend: the environment as a stack on a Docker Swarm, each service one task on
whichever node Swarm picks. Commands reach a task through the engine of its node, by the same
executor (or plain exec) as on Compose, so execute, stream, files, timeouts and users behave
alike. Nothing of this machine is mounted: the executor and the static assets are copied into
the containers once they run, and the workspace lives in the main container."""

from __future__ import annotations

import functools
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.backends.container.engine import engine_call, up_timeout
from orchestrator.backends.container.guardian import ensure_guardian
from orchestrator.backends.container.identity import (
    claim_folder,
    project_labels,
    project_name,
    projects_dir,
)
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.backends.swarm.stack import Stack, Task, manager_host
from orchestrator.errors import (
    DockerError,
    HealthcheckFailed,
    UsageError,
)
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.spec.resolve import MAIN


class SwarmRuntime(ComposeRuntime):
    name: ClassVar[str] = "swarm"
    deviations: ClassVar[dict[str, str]] = {
        "static-read-only-as-root": "static assets are copied into the sandbox, read-only by "
        "mode (owned by root): root in the sandbox can change them",
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stack: Stack | None = None
        self._tasks: dict[str, Task] = {}

    # ----- lifecycle -----------------------------------------------------------------------
    def _start(self) -> None:
        opts = self.options
        refused = [
            what
            for what, given in (
                ("a host workspace", opts.workspace),
                ("mounts", opts.mounts),
                ("ports", opts.ports),
            )
            if given
        ]
        if refused:
            raise UsageError(
                f"the swarm backend takes no {' or '.join(refused)}: the sandbox runs on "
                "another machine; move files with rt.upload and rt.download"
            )
        if opts.detached:
            raise UsageError(
                "the swarm backend cannot leave an environment running after this process; "
                "use the library or `orchestrator run`"
            )
        name = project_name(self.env.name)
        directory = projects_dir() / name
        claim_folder(directory)
        ensure_guardian()  # removes the stack if this process dies without cleaning up
        labels = project_labels(self.env, name, directory, detached=False)
        stack_opts = StackOptions(
            project=name, labels=labels, env_vars=opts.env_vars, policy=opts.policy
        )
        try:
            compiled = compile_stack(self.env, stack_opts)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.warnings += [w for w in compiled.warnings if w not in self.warnings]
        self.stack = Stack(name, directory, opts.host or manager_host(), compiled)
        self.stack.deploy()
        services = [MAIN, *sorted(self.env.spec.services)]
        self._tasks = self.stack.wait_running(services, up_timeout())
        main = self._tasks[MAIN]
        self._docker_cmd = self.stack.node_cmd(main.node)
        self._copy_in_all(compiled.user)
        self._wait_healthy(list(compiled.healthchecked))
        self._main = self._channel(MAIN, main.container)
        self._main.start()
        self._confirm_started()

    def _wait_healthy(self, services: list[str]) -> None:
        """Swarm does not hold one service for another's health: the spawn waits instead."""
        deadline = time.monotonic() + up_timeout()
        for service in services:
            while True:
                health = getattr(self._state(service).health, "status", None)
                if health == "healthy":
                    break
                if health == "unhealthy" or time.monotonic() > deadline:
                    logs = self._logs(service).strip()
                    raise HealthcheckFailed(
                        f"stack {self._id}: service {service!r} never became healthy; "
                        f"last log lines:\n{logs or '(no output)'}"
                    )
                time.sleep(0.2)

    def _close(self) -> None:
        channels = self._channels()
        for channel in channels:
            channel.shutdown()
        try:
            if self.stack is not None:
                self.stack.remove(list(self._tasks.values()))
        finally:
            for channel in channels:
                channel.close(release=False)

    def _kill(self) -> None:
        for channel in self._channels():
            channel.close()
        assert self.stack is not None
        for task in self._tasks.values():  # restart_policy none: a killed task stays down
            client = self.stack.node_client(task.node)
            try:
                engine_call(
                    "killing a task", functools.partial(client.container.kill, task.container)
                )
            except DockerError as exc:
                if "is not running" not in exc.stderr and "No such container" not in exc.stderr:
                    raise

    def _poll(self) -> int | None:
        state = self._state()
        return None if state.running else int(state.exit_code or 0)

    def _state(self, service: str = MAIN) -> Any:
        assert self.stack is not None
        task = self._tasks[service]
        client = self.stack.node_client(task.node)
        return engine_call(
            "inspecting the sandbox", lambda: client.container.inspect(task.container).state
        )

    def detach(self) -> None:
        Runtime.detach(self)

    def keep(self) -> None:
        Runtime.keep(self)

    # ----- where things are ----------------------------------------------------------------
    @property
    def _id(self) -> str:
        return self.stack.name if self.stack else self.env.name

    def _locate(self, service: str) -> tuple[str, list[str]]:
        assert self.stack is not None
        task = self._tasks[service]
        return task.container, self.stack.node_cmd(task.node)

    def _exec_defaults(self, service: str) -> tuple[str, str | None]:
        assert self.stack is not None
        task = self._tasks[service]
        client = self.stack.node_client(task.node)
        config = engine_call(
            "inspecting a service", lambda: client.container.inspect(task.container).config
        )
        workdir = str(config.working_dir or "")
        return (workdir if workdir.startswith("/") else "/"), (config.user or None)

    def _logs(self, service: str) -> str:
        assert self.stack is not None
        task = self._tasks.get(service)
        if task is None:
            return ""
        client = self.stack.node_client(task.node)
        text = engine_call("reading logs", lambda: client.container.logs(task.container, tail=20))
        return text if isinstance(text, str) else ""

    @property
    def _container(self) -> str:
        return self._tasks[MAIN].container

    @property
    def default_user(self) -> str | None:
        return self.stack.compiled.user if self.stack else None

    def _project_folder(self) -> Path | None:
        return self.stack.directory if self.stack else None

    # ----- snapshots -----------------------------------------------------------------------
    def _pack_workdir(self, user: str | None, limit: int) -> bytes:
        return Runtime._pack_workdir(self, user, limit)  # no host folder: the sandbox packs

    def _commit(self, record: Path) -> str:
        raise UsageError(
            "the swarm backend snapshots the workspace only: an image committed on one node "
            "would not be on the node a resume lands on"
        )

    def _check_resumable(self, snap: Snapshot) -> None:
        Runtime._check_resumable(self, snap)
