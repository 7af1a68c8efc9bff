"""The Docker backend: a compiled Compose project, brought up with python-on-whales, talked
to through the in-container executor (or plain `docker exec` where it cannot run)."""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import shutil
from pathlib import Path
from typing import Any, ClassVar, cast, get_args

from python_on_whales.utils import run

from orchestrator import procutil, settings
from orchestrator.backends.container import copyin, images
from orchestrator.backends.container.channel import Channel, Mode
from orchestrator.backends.container.engine import (
    TIMED_OUT,
    docker_client,
    engine_call,
    engine_host,
    is_remote,
    raw_docker,
)
from orchestrator.backends.container.executor.client import FILES
from orchestrator.backends.container.identity import LABEL_DIR
from orchestrator.backends.container.layout import SANDBOX_DIR, STATIC_ROOT
from orchestrator.backends.container.service import ServiceSandbox, shell_connection
from orchestrator.backends.docker.lifecycle import Project, start_project
from orchestrator.backends.docker.render import CompileOptions
from orchestrator.errors import (
    DockerError,
    OrchestratorError,
    SandboxUnavailable,
    SpecError,
    SpecIssue,
    StartupError,
    UsageError,
)
from orchestrator.sandbox import files, hostfs
from orchestrator.sandbox.base import Runtime, Sandbox
from orchestrator.sandbox.options import Chunks, Command
from orchestrator.sandbox.results import Connection, RuntimeInfo
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.spec.models import PublishedPort
from orchestrator.spec.resolve import MAIN, resolve_user

log = logging.getLogger("orchestrator.docker")
EXEC_MODE_ENV = "ORCHESTRATOR_EXEC_MODE"
"""auto (the executor, falling back to plain where it cannot run), executor or plain."""


# Kill every process of the main container except PID 1 (init), the keep-alive (the oldest of
# its children, which has no child of its own) and this script's own ancestry (the executor,
# or plain exec). Orphans are reparented to PID 1, so a daemon is found like any other; a
# process cannot pass for the keep-alive, which started before any command could, and none
# is spared for being its child. Passes repeat until three in a row find nothing, so a fork
# caught mid-pass is not missed.
KILL_OTHERS = r"""
fields() {  # /proc/PID/stat after the name, read whole: a name may hold ") " and newlines
  s=; l=; while IFS= read -r l; do s="$s $l"; done < "$1/stat" || return 1; s="$s $l"
  s=${s##*) }
}
me=$$; keep=" 1 "; p=$$
while [ "${p:-0}" -gt 0 ]; do
  keep="$keep$p "; fields /proc/$p 2>/dev/null || break; set -- $s; p=$2
done
entry=; first=
for d in /proc/[0-9]*; do
  fields $d 2>/dev/null || continue; set -- $s
  [ "$2" = 1 ] || continue
  if [ -z "$first" ] || [ "${20}" -lt "$first" ]; then first=${20}; entry=${d#/proc/}; fi
done
keep="$keep$entry "; quiet=0; n=0
while [ $quiet -lt 3 ] && [ $n -lt 500 ]; do
  n=$((n + 1)); found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $keep in *" $p "*) continue ;; esac
    fields $d 2>/dev/null || continue; set -- $s
    [ "$1" = Z ] || [ "$2" = "$me" ] && continue
    kill -9 "$p" 2>/dev/null && found=1
  done
  [ $found = 1 ] && quiet=0 || quiet=$((quiet + 1))
done
[ $quiet -ge 3 ]
"""


class ComposeRuntime(Runtime):
    name: ClassVar[str] = "docker"
    deviations: ClassVar[dict[str, str]] = {}
    _reset_user: ClassVar[str | None] = "0:0"  # PID 1's user: may signal and remove anything

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.project: Project | None = None
        self._ports: list[PublishedPort] = []
        self._services: dict[str, ServiceSandbox] = {}
        self._mode = cast(Mode, settings.choice(EXEC_MODE_ENV, "auto", get_args(Mode)))
        self._main: Channel | None = None
        self._temp_workspace: Path | None = None
        self._docker_cmd: list[str] = []
        self._shared: Path | None = None  # this machine's folder the containers see, if any

    # ----- lifecycle -----------------------------------------------------------------------
    def _workspace(self, directory: Path) -> Path:
        """The caller's workspace, or a private one inside the project folder, so that it
        goes with the project (`down`, the reaper) whoever removes it."""
        if self.options.workspace is not None:
            self.options.workspace.mkdir(parents=True, exist_ok=True)
            return self.options.workspace
        self._temp_workspace = directory / "workspace"
        self._temp_workspace.mkdir(exist_ok=True)
        return self._temp_workspace

    def _start(self) -> None:
        opts = self.options
        host = opts.host or engine_host()
        remote = is_remote(host)
        if remote and opts.workspace is not None:
            raise UsageError(
                f"the engine at {host} may be another machine: a host workspace "
                "cannot be mounted there; move files with rt.upload and rt.download"
            )

        def make_options(name: str, labels: dict[str, str], subnet: str | None) -> CompileOptions:
            return CompileOptions(
                project=name,
                workspace=self._workspace(Path(labels[LABEL_DIR])),
                labels=labels,
                extra_mounts=opts.mounts,
                extra_ports=opts.ports,
                env_vars=opts.env_vars,
                subnet=subnet,
                policy=opts.policy,
                main_image=opts.resume.image if opts.resume else "",
                remote=remote,
            )

        self.project = start_project(
            self.env,
            make_options,
            extra_files=_executor_files(),
            detached=opts.detached,
            host=opts.host or "",
        )
        compiled = self.project.compiled
        self.warnings += [w for w in compiled.warnings if w not in self.warnings]
        if self._temp_workspace is not None:
            _give(self._temp_workspace, compiled.user)
        self._docker_cmd = raw_docker(self.project.client)  # exec calls last: no time bound
        if remote:
            self._copy_in_all(compiled.user)
        else:  # every container sees it at SANDBOX_MOUNT: folders go through FIFOs there
            self._shared = self.project.directory / SANDBOX_DIR
        self._main = self._channel(MAIN, self.project.main_container)
        self._main.start()  # greets while the ports are read
        if compiled.published:
            self._ports = self.project.ports()
        self._confirm_started()

    def _confirm_started(self) -> None:
        """The executor's greeting proves the main container runs (without one, the engine
        is asked); then the file's user is looked up once."""
        assert self._main is not None
        try:
            if self._main.ready() is None and (lost := self._lost()) is not None:
                raise lost
        except SandboxUnavailable as exc:
            raise StartupError(f"the environment did not start: {exc}") from exc
        self._check_named_user()

    def _copy_in_all(self, user: str) -> None:
        """Nothing of this machine is mounted: copy the executor and the static assets into
        the main container, the static assets into each service that shows them, and give
        the workdir to the sandbox user."""
        self._copy_in(
            MAIN, copyin.main_archive(self.env), [copyin.PREPARE, "sh", self.workdir, user]
        )
        showing = [n for n, s in sorted(self.env.spec.services.items()) if s.static_assets]
        if not self.env.spec.static_assets or not showing:
            return
        static = copyin.static_archive(self.env)
        for service in showing:
            self._copy_in(service, static, [copyin.PREPARE_SERVICE])

    def _copy_in(self, service: str, archive: bytes, script: list[str]) -> None:
        """Unpack an archive into a running service's container, as root."""
        container, docker_cmd = self._locate(service)
        argv = [*docker_cmd, "exec", "-i", "-u", "0:0", container, "/bin/sh", "-c", *script]
        try:
            engine_call(f"preparing {service}", lambda: run(argv, input=archive), retry=False)
        except DockerError as exc:
            raise StartupError(
                f"{self.env.name}: could not prepare {service!r} (its image needs /bin/sh and "
                f"tar): {exc.stderr.strip() or exc}"
            ) from exc

    def _check_named_user(self) -> None:
        """A user the file gives by name exists only in the image: ask it once, at spawn, so
        a typo fails here, naming the field, and not as 126 on every command."""
        user = self.default_user
        if not user or procutil.numeric_ids(user) is not None:
            return
        probe = self.execute(["true"], timeout=30)
        if probe.exit_code == 126 and "unable to find" in probe.stderr:
            raise SpecError(
                SpecIssue(
                    self.env.source,
                    None,
                    None,
                    "user",
                    f"{probe.stderr.strip()} of the image",
                    "create the user in the image, or give a uid[:gid]",
                )
            )

    def _channel(
        self, service: str, container: str, docker_cmd: list[str] | None = None
    ) -> Channel:
        """Commands to one container: its own executor, or plain exec."""
        label = self.env.name if service == MAIN else f"{self.env.name}/{service}"

        def warn(message: str) -> None:
            log.warning(message)
            self.warnings.append(message)

        return Channel(
            label=label,
            docker_cmd=docker_cmd or self._docker_cmd,
            container=container,
            mode=self._mode,
            owned=not self.options.detached,
            lost=lambda: self._lost(service),
            killed=lambda: self._killed,
            warn=warn,
            shared=self._shared,
        )

    def _channels(self) -> list[Channel]:
        return [c for c in (self._main, *(s.channel for s in self._services.values())) if c]

    def _close(self) -> None:
        channels = self._channels()
        for channel in channels:
            channel.shutdown()  # they exit while the project goes down; reaped below
        try:
            if self.project is not None:
                self.project.down(keep=self.env.spec.keep_after_cleanup)
        finally:
            for channel in channels:
                channel.close(release=False)
            if self.project is not None:
                for mount in self.project.compiled.mounts:
                    if mount.origin == "workspace" and mount.source.is_dir():
                        hostfs.defuse(mount.source)  # no setuid file or device stays behind
            if self._temp_workspace is not None:
                shutil.rmtree(self._temp_workspace, ignore_errors=True)

    def detach(self) -> None:
        with self._lock:
            self._closed = True
        for channel in self._channels():
            channel.close()
        if self.project is not None:
            self.project.release()  # its services' tethers too (see Project.tether)

    def _kill(self) -> None:
        for channel in self._channels():
            channel.close()
        if self.project is not None:
            self.project.kill()

    def _pack_workdir(self, user: str | None, limit: int) -> bytes:
        """Where the workdir is the workspace's bind mount, the host packs that folder
        itself (packing writes nothing, so the content being untrusted does no harm); else,
        or when the host may not read all of it, the sandbox packs it."""
        assert self.project is not None
        workdir = posixpath.normpath(self.workdir)
        for mount in self.project.compiled.mounts:
            if mount.target == workdir and mount.origin == "workspace":
                archive = files.pack_host(mount.source, limit)
                if archive is not None:
                    return archive
        return super()._pack_workdir(user, limit)

    def _commit(self, record: Path) -> str:
        assert self.project is not None
        self._check_usable()
        return images.commit(self._container, record, self.project.client)

    def _check_resumable(self, snap: Snapshot) -> None:
        engine = docker_client(host=self.options.host) if self.options.host else None
        if snap.image and not images.exists(snap.image, engine):
            if snap.host != (self.options.host or ""):
                where = f"the engine at {snap.host}" if snap.host else "the process's own engine"
                raise UsageError(
                    f"snapshot {snap.name}: its filesystem image {snap.image} is on {where}; "
                    "resume it there (spawn_runtime(..., host=...))"
                )
            raise UsageError(
                f"snapshot {snap.name}: its filesystem image {snap.image} is gone "
                "(removed outside orchestrator); it cannot be resumed"
            )

    def _project_folder(self) -> Path | None:
        return self.project.directory if self.project else None

    def _kill_processes(self) -> None:
        result = self.execute(["/bin/sh", "-c", KILL_OTHERS], user=self._reset_user, timeout=60)
        if not result.ok:
            raise OrchestratorError(
                f"{self.env.name}: could not kill the processes left running "
                f"(exit {result.exit_code}): {result.stderr.strip()}"
            )

    def _poll(self) -> int | None:
        assert self.project is not None
        state = self._state()
        return None if state.running else int(state.exit_code or 0)

    def _state(self, service: str = MAIN) -> Any:
        assert self.project is not None
        project = self.project
        return engine_call(
            "inspecting the sandbox",
            lambda: project.client.container.inspect(project.container_of(service)).state,
        )

    def _probe(self, service: str = MAIN) -> str | None:
        """Why a container cannot run commands (gone, stopped, paused), or None if it can."""
        what = "its main container" if service == MAIN else f"its service {service!r}"
        try:
            state = self._state(service)
        except DockerError as exc:
            if exc.returncode == TIMED_OUT:  # the engine is not answering: say that instead
                raise
            return f"{what} is gone ({exc.stderr.strip() or exc})"
        if state.paused:
            return f"{what} is paused; unpause it, or take the environment down"
        if state.running:
            return None
        why = f"{state.status}, exit code {state.exit_code}"
        if state.oom_killed:
            why += ", killed by the out-of-memory killer"
        if state.error:
            why += f": {state.error}"
        try:
            logs = self._logs(service).strip()
        except OrchestratorError:
            logs = ""
        return f"{what} is not running ({why}); last log lines:\n{logs or '(none)'}"

    def _lost(self, service: str = MAIN) -> SandboxUnavailable | None:
        why = self._probe(service)
        return SandboxUnavailable(f"{self.env.name}: {why}") if why else None

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
            container, docker_cmd = self._locate(name)
            workdir, image_user = self._exec_defaults(name)
            view = ServiceSandbox(
                name,
                spec,
                container=container,
                image_workdir=workdir,
                user=resolve_user(spec.user) if spec.user else image_user,
                channel=self._channel(name, container, docker_cmd),
                docker_cmd=docker_cmd,
                static_asset=self.env.spec.static_asset,
                check_usable=self._check_usable,
            )
            with self._lock:
                view = self._services.setdefault(name, view)
        return view

    def _locate(self, service: str) -> tuple[str, list[str]]:
        """A service's container, and the docker command that reaches its engine."""
        assert self.project is not None
        return self.project.container_of(service), self._docker_cmd

    def _exec_defaults(self, service: str) -> tuple[str, str | None]:
        assert self.project is not None
        return self.project.exec_defaults(service)

    def _logs(self, service: str) -> str:
        assert self.project is not None
        return self.project.logs(service, tail=20)

    # ----- paths ---------------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        return self.env.spec.workdir

    def static_path(self, name: str) -> str:
        return f"{STATIC_ROOT}/{self.env.spec.static_asset(name).save_path}"

    @property
    def default_user(self) -> str | None:
        return self.project.compiled.user if self.project else None

    @property
    def _container(self) -> str:
        assert self.project is not None
        return self.project.main_container

    @property
    def _id(self) -> str:
        return self.project.name if self.project else self.env.name

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

    def connection(self, *, user: str | None = None) -> Connection:
        self._check_open()
        return shell_connection(self._docker_cmd, self._container, self.workdir, self._user(user))

    def keep(self) -> None:
        self._check_open()
        assert self.project is not None
        self.project.keep()
        self.detach()

    # ----- commands ------------------------------------------------------------------------
    def _run(self, cmd: Command) -> Chunks:
        assert self._main is not None
        return (yield from self._main.run(cmd))

    def _run_bulk(self, cmd: Command) -> Chunks:
        assert self._main is not None
        return (yield from self._main.run(cmd, bulk=True))


@functools.cache
def _executor_files() -> dict[str, bytes]:
    """The executor's sources, copied into every project's sandbox folder (read once)."""
    return {f"{SANDBOX_DIR}/{f.name}": f.read_bytes() for f in FILES}


def _give(path: Path, user: str) -> None:
    """Let the sandbox user write the temporary workspace we made for it (a user given by
    name exists only in the image: then the folder is opened to all)."""
    ids = procutil.numeric_ids(user)
    try:
        if ids is not None and os.geteuid() == 0:
            os.chown(path, *ids)
        else:
            path.chmod(0o777)
    except (OSError, ValueError) as exc:
        raise OrchestratorError(f"cannot prepare the workspace {path}: {exc}") from exc
