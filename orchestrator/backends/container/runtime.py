"""What every container backend shares: the main sandbox and each service reached through a
Channel (the in-container executor, or plain `docker exec`), probes of why a container
cannot run commands, copy-in of the executor and the static assets, kill and reset of the
processes, pool membership in the project folder, and the runtime's description.

A backend derives from `ContainerRuntime` and adds only placement: where its containers are
and how they come and go (`_start`, `_remove`, `_kill_containers`, `_state`, `_locate`,
`_exec_defaults`, `_logs`, `_container`, `_id`, `_project_folder`, `default_user`)."""

from __future__ import annotations

import contextlib
import logging
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

from orchestrator import settings
from orchestrator.backends.container import (
    archives,
    copyin,
    fileuser,
    freeze,
    membership,
    owed,
    readiness,
    resident,
)
from orchestrator.backends.container.channel import Channel, Mode
from orchestrator.backends.container.engine import Engine, NoSuchContainer
from orchestrator.backends.container.keeper import ContainerInventory
from orchestrator.backends.container.layout import KILL_OTHERS, STATIC_ROOT
from orchestrator.backends.container.service import ServiceSandbox, shell_connection
from orchestrator.backends.container.usage import Accounts
from orchestrator.errors import (
    OrchestratorError,
    SandboxPaused,
    SandboxUnavailable,
    StartupError,
    UsageError,
)
from orchestrator.sandbox.base import PoolState, Runtime
from orchestrator.sandbox.calls import Sandbox
from orchestrator.sandbox.options import AChunks, Chunks, Command
from orchestrator.sandbox.results import Connection, RuntimeInfo
from orchestrator.sandbox.usage import Reading
from orchestrator.spec.models import PublishedPort
from orchestrator.spec.resolve import MAIN, resolve_user

log = logging.getLogger("orchestrator.docker")
EXEC_MODE_ENV = settings.EXEC_MODE.name
"""auto (the executor, falling back to plain where it cannot run), executor or plain."""


class ContainerRuntime(ContainerInventory, Runtime):
    """A runtime whose sandbox and services are containers of one engine (or of several,
    one per node): everything but placement. Its environments left running are one
    inventory for every container backend (keeper.py)."""

    _reset_user: ClassVar[str | None] = "0:0"  # PID 1's user: may signal and remove anything

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ports: list[PublishedPort] = []
        self._services: dict[str, ServiceSandbox] = {}
        self._mode = cast(Mode, settings.EXEC_MODE.get())
        self._main: Channel | None = None
        self._main_engine: Engine | None = None
        """The engine of the main container (its backend sets it once the container is
        placed)."""
        # this machine's folder holding each container's transfer folder (<service>, which
        # that container alone sees at IO_MOUNT), if any
        self._shared: Path | None = None
        self._image_workdir: str | None = None  # `workdir: null`: the image's, once asked
        self._accounts = Accounts()
        self._owed = owed.Owed(self._project_folder, self._service_located)
        """Kills owed to plain commands failed as paused, run once thawed (owed.py)."""

    # ----- placement: what a container backend provides ------------------------------------
    @abstractmethod
    def _remove(self) -> None:
        """Remove the containers and what else the environment made (a partial start too)."""

    def _removed(self) -> None:
        """After `_remove`, whether or not it succeeded: local leftovers go."""

    @abstractmethod
    def _kill_containers(self) -> None:
        """Kill every container of the environment."""

    def _before_down(self, keep: bool) -> None:
        """Before its containers go down together (removed; with `keep`, stopped and kept):
        what the engine needs first (the Docker backend: all but one leave each network they
        share, or, kept, each is stopped, one at a time; see removal.leave_networks). Before
        its executors are told to stop too, as an executor ends its own container's life
        then."""

    @abstractmethod
    def _state(self, service: str = MAIN) -> Any:
        """The engine's state of a service's container (running, paused, exit_code, ...)."""

    @abstractmethod
    def _locate(self, service: str) -> tuple[str, Engine]:
        """A service's container, and the engine that runs it."""

    @abstractmethod
    def _exec_defaults(self, service: str) -> tuple[str, str | None]:
        """Where an exec starts in a service (its image's WORKDIR, or /) and as whom."""

    @abstractmethod
    def _logs(self, service: str) -> str:
        """The last log lines of a service's container ("" when there is none)."""

    @property
    @abstractmethod
    def _container(self) -> str:
        """The main container."""

    @property
    @abstractmethod
    def _id(self) -> str:
        """What `orchestrator ps` calls this environment."""

    @abstractmethod
    def _project_folder(self) -> Path | None:
        """The folder that stands for this environment outside this process (its project
        folder; pool membership is kept there), None before it exists."""

    def lasting_folder(self) -> Path | None:
        return self._project_folder()

    # ----- start ---------------------------------------------------------------------------
    def _confirm_started(self) -> None:
        """The executor's greeting proves the main container runs (without one, the engine
        is asked); then the file's user is looked up once."""
        assert self._main is not None
        try:
            if self._main.ready() is None and (lost := self._lost()) is not None:
                raise lost
        except SandboxUnavailable as exc:
            raise StartupError(f"the environment did not start: {exc}") from exc
        source, user = self.env.source, self.default_user
        fileuser.check_named(source, user, lambda: self.execute(["true"], timeout=30))

    def _copy_in_all(self, user: str) -> None:
        """Nothing of this machine is mounted: copy the executor and the static assets into
        the main container, the static assets into each service that shows them, and give
        the workdir to the sandbox user."""
        self._copy_in(
            MAIN,
            archives.main_archive(self.env, self.options.policy),
            [copyin.PREPARE, "sh", self.env.spec.workdir or "", user],
        )
        self._prepare_services(copied=True)

    def _prepare_services(self, *, copied: bool) -> None:
        """Let each gated service's command start (copyin.prepare_services), then wait for
        the health of those: the engine does not hold the main sandbox for a gated service."""
        waits = copyin.prepare_services(self.env, self._locate, copied, self.options.policy)
        readiness.wait_healthy(self._id, waits, self._state, self._logs)  # bounded

    def _copy_in(self, service: str, archive: bytes, script: list[str]) -> None:
        """Unpack an archive into a running service's container, as root."""
        container, engine = self._locate(service)
        copyin.unpack(engine, container, service, archive, script, self.env.name)

    def _check_ids(self, user: str, what: str) -> tuple[int, int] | None:
        """`user`'s ids if numeric, else None (see fileuser.check_ids)."""
        return fileuser.check_ids(self.env.source, user, what)

    # ----- channels ------------------------------------------------------------------------
    def _channel(self, service: str, container: str, engine: Engine | None = None) -> Channel:
        """Commands to one container: its own executor, or plain exec."""
        label = self.env.name if service == MAIN else f"{self.env.name}/{service}"

        def warn(message: str) -> None:
            log.warning(message)
            self.warnings.append(message)

        return Channel(
            label=label,
            engine=engine or self._engine_of_main(),
            container=container,
            mode=self._mode,
            owned=not self.options.detached,
            lost=lambda: self._lost(service),
            killed=lambda: self._killed,
            running=lambda: self._visibly_running(service),
            warn=warn,
            shared=None if self._shared is None else self._shared / service,
            owed=(self._owed, service),
        )

    def _engine_of_main(self) -> Engine:
        assert self._main_engine is not None, "the main container is not placed yet"
        return self._main_engine

    def _service_located(self, service: str) -> tuple[str, Engine]:
        """`_locate`, for a service of the file's only (a record names it: see owed.py)."""
        if service != MAIN and service not in self.env.spec.services:
            raise UsageError(f"{self.env.name} has no service {service!r}")
        return self._locate(service)

    def _channels(self) -> list[Channel]:
        return [c for c in (self._main, *(s.channel for s in self._services.values())) if c]

    # ----- lifecycle -----------------------------------------------------------------------
    def _close(self) -> None:
        self._thaw_to_end()
        self._before_down(self.env.spec.keep_after_cleanup)
        channels = self._channels()
        for channel in channels:
            channel.shutdown()  # they exit while the containers go down; reaped below
        try:
            self._remove()
        finally:
            for channel in channels:
                channel.close(release=False)
            self._removed()

    def _kill(self) -> None:
        self._thaw_to_end()
        self._before_down(keep=False)
        for channel in self._channels():
            channel.close()
        self._kill_containers()

    def _kill_processes(self) -> None:
        result = self.execute(["/bin/sh", "-c", KILL_OTHERS], user=self._reset_user, timeout=60)
        if not result.ok:
            raise OrchestratorError(
                f"{self.env.name}: could not kill the processes left running "
                f"(exit {result.exit_code}): {result.stderr.strip()}"
            )

    def _poll(self) -> int | None:
        state = self._state()
        return None if state.running else int(state.exit_code or 0)

    def _probe(self, service: str = MAIN) -> str | None:
        """Why a container cannot run commands (gone, stopped, paused), or None if it can."""
        what = "its main container" if service == MAIN else f"its service {service!r}"
        return readiness.unusable(what, lambda: self._state(service), lambda: self._logs(service))

    def _visibly_running(self, service: str = MAIN) -> bool:
        """Whether this machine sees a service's container running on, its first process
        alive (False where that cannot be told: the caller asks the engine again)."""
        return False

    def _lost(self, service: str = MAIN) -> SandboxUnavailable | None:
        why = self._probe(service)
        if not why:
            return None
        kind = SandboxPaused if why.endswith(readiness.PAUSED) else SandboxUnavailable
        return kind(f"{self.env.name}: {why}")

    # ----- pause / resume (freeze.py) ---------------------------------------------------------
    def _frozen_groups(self) -> freeze.Groups:
        """The containers a pause freezes, by the engine that runs them (see freeze.py)."""
        live = [MAIN, *sorted(n for n, s in self.env.spec.services.items() if not s.job)]
        return freeze.groups(live, self._locate)

    def _pause(self) -> None:
        freeze.refuse_gvisor(self.env, self.options.policy)
        freeze.pause(self._frozen_groups())

    def _resume(self) -> None:
        freeze.resume(self._frozen_groups())
        # a command whose call failed as paused (whoever paused and resumes) dies now,
        # before resume returns and before any other command of this process
        self._owed.settle(everyone=True)

    def _frozen(self) -> bool:
        try:
            return bool(self._state().paused)
        except NoSuchContainer:
            return False

    def _thaw_to_end(self) -> None:
        """Before this process kills or removes an environment it paused: thaw it, so that
        its tethers and executors take their word and the engine stops it at once (a
        paused container waits out its stop timeout). Others' pauses need nothing: the
        engine kills and removes a paused container (the guardian, the reapers, `down`)."""
        if self._paused:
            self._paused = False
            with contextlib.suppress(OrchestratorError):
                self._resume()

    # ----- pools ---------------------------------------------------------------------------
    def pool_enter(self, pool: str) -> None:
        self._check_owner()
        folder = self._project_folder()
        if folder is not None:
            membership.enter(folder, pool, membership.READY)

    def pool_move(self, frm: PoolState, to: PoolState) -> bool:
        self._check_owner()
        folder = self._project_folder()
        return folder is None or membership.move(folder, frm, to)

    def pool_state(self) -> PoolState | None:
        self._check_owner()
        found = membership.membership(self._project_folder())
        return cast(PoolState, found[1]) if found is not None else None

    def logs(
        self, service: str = MAIN, *, tail: int | None = None, follow: bool = False
    ) -> Iterator[bytes]:
        self.service(service)  # UsageError naming the services
        container, engine = self._locate(service)
        return engine.logs(container, tail=tail, follow=follow)

    # ----- services ------------------------------------------------------------------------
    def _places(self) -> dict[str, Sandbox]:
        with self._lock:
            return {MAIN: self, **self._services}

    def _read_usage(self) -> dict[str, Reading]:
        located = {}
        for name in (MAIN, *self.env.spec.services):
            with contextlib.suppress(OrchestratorError):
                located[name] = self._locate(name)
        return self._accounts.read(located)

    def service(self, name: str) -> Sandbox:
        self._check_open()
        if name == MAIN:
            return self
        spec = self.env.spec.services.get(name)
        if spec is None:
            known = ", ".join([MAIN, *sorted(self.env.spec.services)])
            raise UsageError(f"{self.env.name} has no service {name!r} (known: {known})")
        with self._lock:
            view = self._services.get(name)
        if view is None:
            container, engine = self._locate(name)
            workdir, image_user = self._exec_defaults(name)
            view = ServiceSandbox(
                name,
                spec,
                container=container,
                image_workdir=workdir,
                user=resolve_user(spec.user) if spec.user else image_user,
                channel=self._channel(name, container, engine),
                engine=engine,
                static_asset=self.env.spec.static_asset,
                check_usable=self._check_usable,
                host_folders=self.writable_host_folders,
            )
            with self._lock:
                view = self._services.setdefault(name, view)
        return view

    # ----- paths ---------------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        """The file's `workdir`, else (null) the image's WORKDIR, asked once."""
        if self.env.spec.workdir is not None:
            return self.env.spec.workdir
        if self._image_workdir is None:
            self._image_workdir = self._exec_defaults(MAIN)[0]
        return self._image_workdir

    def static_path(self, name: str) -> str:
        return f"{STATIC_ROOT}/{self.env.spec.static_asset(name).save_path}"

    def info(self) -> RuntimeInfo:
        self._check_open()
        return RuntimeInfo(
            id=self._id,
            env=self.env.name,
            backend=self.name,
            workdir=self.workdir,
            user=self.default_user,
            exec_mode="plain" if self._main is None or self._main.mode == "plain" else "executor",
            container=self._container,
            ports=tuple(self._ports),
        )

    def _gives_terminal(self) -> bool:
        self._check_open()
        return self._main is not None and self._main.ready() is not None

    def connection(self, *, user: str | None = None) -> Connection:
        self._check_open()
        return shell_connection(
            self._engine_of_main(), self._container, self.workdir, self._user(user)
        )

    # ----- commands ------------------------------------------------------------------------
    def _run(self, cmd: Command) -> Chunks:
        assert self._main is not None
        return (yield from self._main.run(cmd))

    def _arun(self, cmd: Command) -> AChunks:
        assert self._main is not None
        return self._main.arun(cmd)

    def _run_bulk(self, cmd: Command) -> Chunks:
        assert self._main is not None
        return (yield from self._main.run(cmd, bulk=True))

    def _check_keeps(self) -> None:
        resident.check_endpoint(self._project_folder())

    def _run_kept(self, cmd: Command) -> Chunks:
        folder = self._project_folder()
        return (yield from resident.run_kept(folder, cmd, self._lost, self._reopen_endpoint))

    def _reopen_endpoint(self) -> bool:
        """Start the environment's resident again (its endpoint's died); False where this
        backend cannot."""
        return False
