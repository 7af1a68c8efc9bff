"""The swarm backend: the environment as a stack on a Docker Swarm, each service one task on
whichever node Swarm picks. Commands reach a task through the engine of its node, by the same
executor (or plain exec) as on Compose, so execute, stream, files, timeouts and users behave
alike. Nothing of this machine is mounted: the executor and the static assets are copied into
the containers once they run, and the workspace lives in the main container."""

from __future__ import annotations

import contextlib
import functools
import shutil
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.backends.container.engine import (
    ContainerNotRunning,
    Engine,
    NoSuchContainer,
    engine_call,
    up_timeout,
)
from orchestrator.backends.container.guardian import ensure_guardian
from orchestrator.backends.container.identity import (
    claim_folder,
    project_labels,
    project_name,
)
from orchestrator.backends.container.readiness import ServiceWatch
from orchestrator.backends.container.runtime import ContainerRuntime
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.backends.swarm.stack import Stack, Task, manager_host, remove_stack_folder
from orchestrator.errors import PolicyError, SpecError, SpecIssue, UsageError
from orchestrator.paths import projects_dir
from orchestrator.sandbox.options import BuildChoice
from orchestrator.spec.loader import Environment, require_main_image
from orchestrator.spec.lockfile import Lock, lock_path
from orchestrator.spec.policy import PULL_ENV, Policy
from orchestrator.spec.resolve import MAIN

SUSPEND_DEVIATION = (
    "a service's filesystem would be committed on the node that ran it, and a woken "
    "service may be placed on another node, where that image is not (it would have to go "
    "through a registry every node can pull from); snapshot the workspace instead"
)


NO_LOCKS = (
    "the swarm backend does not run locked files: its nodes get each image by its name, "
    "which a lock's ids do not pin there"
)
NO_LOCKS_FIX = "run the file on the docker backend, or without its lock (remove FILE.lock)"


def _refuse_lock(env: Environment) -> None:
    """SpecError when the file has a lock beside it (see NO_LOCKS): never run unpinned."""
    lock = lock_path(env.source)
    if lock is not None and (lock.exists() or lock.is_symlink()):
        raise SpecError(SpecIssue(str(lock), field="", message=NO_LOCKS, fix=NO_LOCKS_FIX))


class SwarmRuntime(ContainerRuntime):
    name: ClassVar[str] = "swarm"
    deviations: ClassVar[dict[str, str]] = {
        "static-read-only-as-root": "static assets are copied into the sandbox, read-only by "
        "mode (owned by root): root in the sandbox can change them",
        "suspend": SUSPEND_DEVIATION,
        "fork-memory": "no fork at all (see suspend)",
        "default-pids": "Swarm services on Engine 20.10 cannot limit processes: the default "
        "process limit is not applied (memory and CPUs are), so memory alone bounds a fork bomb",
    }
    needs_image: ClassVar[bool] = True

    @classmethod
    def check(cls, env: Environment, policy: Policy, *, workspace: Path | None = None) -> list[str]:
        require_main_image(env)  # the workspace lives in the main container: no host folder
        _refuse_lock(env)
        return list(compile_stack(env, StackOptions(project="validate", policy=policy)).warnings)

    @classmethod
    def make_lock(cls, env: Environment, policy: Policy) -> Lock:
        raise UsageError(f"{NO_LOCKS}; {NO_LOCKS_FIX}")

    @classmethod
    def prepare(cls, env: Environment, policy: Policy, *, build: BuildChoice = "auto") -> None:
        # Swarm builds nothing (a `build:` is a spec error here): images reach the nodes
        # beforehand, so every `build` choice holds as it is
        cls.check(env, policy)

    @classmethod
    def render(cls, env: Environment, workspace: Path | None, policy: Policy) -> dict[str, str]:
        """The stack file (the workspace lives in the main container: `workspace` is unused)."""
        require_main_image(env)
        opts = StackOptions(project=f"orch-{env.name}-preview", policy=policy)
        return {"stack.yaml": compile_stack(env, opts).stack_yaml}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stack: Stack | None = None
        self._tasks: dict[str, Task] = {}

    # ----- lifecycle -----------------------------------------------------------------------
    def _start(self) -> None:
        _refuse_lock(self.env)
        self._require_pulls()
        self._deploy()

    def _require_pulls(self) -> None:
        """A Swarm's nodes pull each task's image themselves, from the registry its name
        says: only the caller may allow that (a file alone never makes the engine pull)."""
        if not self.options.policy.allow_pull:
            raise PolicyError(
                SpecIssue(
                    self.env.source,
                    field="image",
                    message="a Swarm's nodes pull each task's image themselves, from the "
                    "registry its name says, and images are pulled only when the caller "
                    "allows it",
                    fix=f"let the caller allow pulls for a Swarm ({PULL_ENV}=1), with images "
                    "in a registry of the caller's (docs/scale-out.md)",
                )
            )

    def _deploy(self) -> None:
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
        claim_folder(directory, backend=self.name)  # reapers ask this class (reap_folder)
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
        self._main_engine = self.stack.node_engine(main.node)
        self._copy_in_all(compiled.user)
        # Swarm has no depends_on: the main container runs its keep-alive meanwhile, and no
        # command runs in it before every service is ready (a job, ended with exit 0)
        extra = self.env.spec.services
        watch = ServiceWatch(self._id, extra, self._state, self._logs, timeout=up_timeout())
        watch.started()
        self._main = self._channel(MAIN, main.container)
        self._main.start()
        self._confirm_started()
        watch.settled()  # and none died as it started

    def _remove(self) -> None:
        if self.stack is not None:
            self.stack.remove(list(self._tasks.values()))

    def _kill_containers(self) -> None:
        assert self.stack is not None
        for task in self._tasks.values():  # restart_policy none: a killed task stays down
            whales = self.stack.node_engine(task.node).whales
            with contextlib.suppress(ContainerNotRunning, NoSuchContainer):  # dead already
                engine_call(
                    "killing a task", functools.partial(whales.container.kill, task.container)
                )

    def _state(self, service: str = MAIN) -> Any:
        assert self.stack is not None
        task = self._tasks[service]
        whales = self.stack.node_engine(task.node).whales
        return engine_call(
            "inspecting the sandbox", lambda: whales.container.inspect(task.container).state
        )

    @classmethod
    def reap_folder(cls, folder: Path) -> None:
        remove_stack_folder(folder)

    # ----- where things are ----------------------------------------------------------------
    @property
    def _id(self) -> str:
        return self.stack.name if self.stack else self.env.name

    def _locate(self, service: str) -> tuple[str, Engine]:
        assert self.stack is not None
        task = self._tasks[service]
        return task.container, self.stack.node_engine(task.node)

    def _exec_defaults(self, service: str) -> tuple[str, str | None]:
        assert self.stack is not None
        task = self._tasks[service]
        whales = self.stack.node_engine(task.node).whales
        config = engine_call(
            "inspecting a service", lambda: whales.container.inspect(task.container).config
        )
        workdir = str(config.working_dir or "")
        return (workdir if workdir.startswith("/") else "/"), (config.user or None)

    def _logs(self, service: str) -> str:
        assert self.stack is not None
        task = self._tasks.get(service)
        if task is None:
            return ""
        whales = self.stack.node_engine(task.node).whales
        text = engine_call("reading logs", lambda: whales.container.logs(task.container, tail=20))
        return text if isinstance(text, str) else ""

    @property
    def _container(self) -> str:
        return self._tasks[MAIN].container

    @property
    def default_user(self) -> str | None:
        return self.stack.compiled.user if self.stack else None

    def _project_folder(self) -> Path | None:
        return self.stack.directory if self.stack else None

    # ----- snapshots (no host folder: the sandbox packs the workspace) -----------------------
    def _commit_all(self, record: Path) -> dict[str, str]:
        raise UsageError(f"suspend is not supported on swarm: {SUSPEND_DEVIATION}")

    def _commit(self, record: Path) -> str:
        raise UsageError(
            "the swarm backend snapshots the workspace only: an image committed on one node "
            "would not be on the node a resume lands on"
        )
