"""The swarm backend's deployment layer: a stack on a Swarm manager, found again by its
labels, its tasks located on whichever node runs them, and removed with everything it made.

The manager is reached at ORCHESTRATOR_SWARM_HOST (any `docker --host` address; default this
machine's engine); a node's engine, to exec into the task it runs, through
ORCHESTRATOR_SWARM_NODE_HOST, a template with {addr} (the node's Swarm address) and
{hostname} (default: the manager itself, for a task on the manager's own node). Each stack
has a project folder in the state folder, as a Compose project does, holding the stack file,
the owner, and the manager's address, so a reaper or the owner's guardian can remove it."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator import settings
from orchestrator.backends.container.engine import Engine, NotSwarmManager, StackEmpty
from orchestrator.backends.container.identity import LABEL_PROJECT
from orchestrator.backends.swarm.compile import CompiledStack
from orchestrator.errors import DockerError, OrchestratorError, StartupError, UsageError
from orchestrator.paths import make_folders, write_file
from orchestrator.spec.resolve import MAIN

SWARM_HOST_ENV = settings.SWARM_HOST.name
NODE_HOST_ENV = settings.SWARM_NODE_HOST.name
STACK_FILE = "stack.yaml"
MANAGER_FILE = "swarm"
"""In a stack's project folder: the manager's address ("" for this machine's engine)."""
REMOVE_WAIT = 60.0
"""Seconds `remove` waits for Swarm to take the stack's tasks and network away."""


def manager_host() -> str:
    return settings.SWARM_HOST.get()


@dataclass(frozen=True)
class Task:
    service: str
    state: str
    """Swarm's task state: new, pending, assigned, preparing, starting, running, complete,
    failed, shutdown, rejected, orphaned, remove."""
    error: str
    container: str
    node: str
    exit_code: int | None


FAILED = ("failed", "rejected", "orphaned", "complete", "shutdown", "remove")


@dataclass
class Stack:
    name: str
    directory: Path
    host: str
    """The manager's address ("" for this machine's engine)."""
    compiled: CompiledStack

    def __post_init__(self) -> None:
        self.engine = Engine.at(self.host)
        """The manager's engine."""
        self._nodes: dict[str, Engine] = {}
        self.deployed = False
        """Whether a deploy was tried that may have created something."""

    def write(self) -> Path:
        make_folders(self.directory)
        write_file(self.directory / MANAGER_FILE, self.host + "\n")
        path = self.directory / STACK_FILE
        write_file(path, self.compiled.stack_yaml)
        return path

    def deploy(self) -> None:
        path = self.write()
        self.deployed = True
        try:
            self.engine.stack_deploy(self.name, path)
        except NotSwarmManager as exc:
            self.deployed = False
            where = self.host or "this machine's engine"
            raise UsageError(
                f"{where} is not a Swarm manager: start one (`docker swarm init`) or point "
                f"{SWARM_HOST_ENV} at one (docs/scale-out.md)"
            ) from exc

    def tasks(self) -> dict[str, Task]:
        """The newest task of each service of the stack (two engine calls: the stack's task
        names, then all its tasks inspected at once)."""
        try:
            listed = self.engine.stack_tasks(self.name)
        except StackEmpty:  # just deployed: its tasks are not made yet
            return {}
        # a task is named <stack>_<service>.<slot>
        names = {
            ident: name.removeprefix(self.name + "_").rpartition(".")[0]
            for ident, name in listed.items()
        }
        if not names:
            return {}
        newest: dict[str, tuple[str, Task]] = {}
        for item in self.engine.inspect_tasks(list(names)):
            service = names.get(str(item.get("ID", "")), "")
            status = item.get("Status") or {}
            container = status.get("ContainerStatus") or {}
            task = Task(
                service=service,
                state=str(status.get("State", "")),
                error=str(status.get("Err", "")),
                container=str(container.get("ContainerID", "")),
                node=str(item.get("NodeID", "")),
                exit_code=container.get("ExitCode"),
            )
            stamp = str(item.get("CreatedAt", ""))
            if service and (service not in newest or stamp > newest[service][0]):
                newest[service] = (stamp, task)
        return {service: task for service, (_, task) in newest.items()}

    def wait_running(self, services: list[str], timeout: float) -> dict[str, Task]:
        """Wait until every service's task runs, or (an extra service) ran and ended: the
        runtime judges it from its container (a job's exit code, a sidecar's crash, with
        its logs). A task that failed without a container, or the main one ending (or the
        time running out) is a StartupError naming the service and why."""
        deadline = time.monotonic() + timeout
        while True:
            tasks = self.tasks()
            for service in services:
                task = tasks.get(service)
                if task is not None and task.state in FAILED and not self._ran(service, task):
                    why = task.error or f"its task ended ({task.state})"
                    raise StartupError(
                        f"stack {self.name}: service {service!r} did not start: {why}"
                    )
            if all(s in tasks and self._started(s, tasks[s]) for s in services):
                return tasks
            if time.monotonic() > deadline:
                states = ", ".join(
                    f"{s}: {tasks[s].state if s in tasks else 'no task'}" for s in services
                )
                raise StartupError(
                    f"stack {self.name} did not start within {timeout:g}s ({states}); a task "
                    "that stays pending often names an image no node has (docs/scale-out.md)"
                )
            time.sleep(0.2)

    def _started(self, service: str, task: Task) -> bool:
        """Running; or, for a service with a healthcheck, started (Swarm says "starting"
        until it is healthy): it may need to be prepared to become healthy (copyin.GATE),
        and the runtime waits for its health; or an extra service that ran and ended."""
        healthchecked = service in self.compiled.healthchecked
        started = task.state == "running" or (healthchecked and task.state == "starting")
        return started or (task.state in FAILED and self._ran(service, task))

    @staticmethod
    def _ran(service: str, task: Task) -> bool:
        """An extra service whose command ran and ended (complete, or failed with an exit
        code): its container is left (restart_policy none) for the runtime to judge."""
        ended = task.state in ("complete", "failed") and task.exit_code is not None
        return service != MAIN and bool(task.container) and ended

    def node_engine(self, node: str) -> Engine:
        """The engine of node `node` (its address asked of the manager once)."""
        if node not in self._nodes:
            self._nodes[node] = Engine.at(node_host(self.host, node))
        return self._nodes[node]

    def remove(self, tasks: list[Task] | None = None) -> None:
        """Remove the stack (services, their containers, its network) and wait until Swarm
        has taken them away, the containers of `tasks` on their nodes too, then the project
        folder."""
        if self.deployed:
            remove_stack(self.name, self.host)
            deadline = time.monotonic() + REMOVE_WAIT
            for task in tasks or []:
                whales = self.node_engine(task.node).whales
                while time.monotonic() < deadline and whales.container.exists(task.container):
                    time.sleep(0.1)
        shutil.rmtree(self.directory, ignore_errors=True)


def node_host(manager: str, node: str) -> str:
    """The engine address of a node, from ORCHESTRATOR_SWARM_NODE_HOST; the manager's own
    node is the manager's engine."""
    engine = Engine.at(manager)
    addr, hostname = engine.node(node)
    template = settings.SWARM_NODE_HOST.get()
    if template:
        return template.format(addr=addr, hostname=hostname)
    if engine.node_id() == node:
        return manager
    raise UsageError(
        f"a task runs on node {hostname} ({addr}), whose engine this machine cannot name: set "
        f"{NODE_HOST_ENV}, e.g. tcp://{{addr}}:2376 or ssh://{{hostname}} (docs/scale-out.md)"
    )


def remove_stack(name: str, host: str) -> None:
    """`docker stack rm` until no service or network of the stack is left (bounded): Swarm
    refuses to remove a network while a task of it is still being taken down, so the first
    call may leave the network for a later one."""
    engine = Engine.at(host)
    deadline = time.monotonic() + REMOVE_WAIT
    last: DockerError | None = None
    while True:
        try:
            engine.stack_remove(name)
        except DockerError as exc:  # partly removed: what is left goes on the next pass
            last = exc
        if not engine.stack_left(label=f"{LABEL_PROJECT}={name}", name=name):
            return
        if time.monotonic() > deadline:
            why = f": {last.stderr.strip()}" if last is not None else ""
            raise OrchestratorError(f"stack {name}: Swarm still lists parts of it{why}")
        time.sleep(0.5)


def remove_stack_folder(folder: Path) -> None:
    """Remove the stack a project folder stands for, then the folder (kept when the stack
    could not be removed, for the next try). A folder without its manager file was left
    before any deploy (the file is written first): there is no stack to remove."""
    try:
        manager: str | None = (folder / MANAGER_FILE).read_text().strip()
    except FileNotFoundError:
        manager = None
    except OSError as exc:
        raise OrchestratorError(f"cannot read {folder / MANAGER_FILE}: {exc}") from exc
    if manager is not None:
        remove_stack(folder.name, manager)
    shutil.rmtree(folder, ignore_errors=True)
