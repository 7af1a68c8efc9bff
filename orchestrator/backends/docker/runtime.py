"""The Docker backend: a compiled Compose project, brought up with python-on-whales, talked
to through the in-container executor (or plain `docker exec` where it cannot run)."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import procutil
from orchestrator.backends.container import images
from orchestrator.backends.container.copyin import gated_services
from orchestrator.backends.container.egress_log import EgressCount
from orchestrator.backends.container.engine import (
    ContainerState,
    Engine,
    engine_call,
    is_remote,
    up_timeout,
)
from orchestrator.backends.container.executor.files import executor_files
from orchestrator.backends.container.identity import LABEL_DIR, folder_engine
from orchestrator.backends.container.layout import IO_DIR, KILL_OTHERS, SANDBOX_DIR
from orchestrator.backends.container.mounts import ResolvedMount, clean_path
from orchestrator.backends.container.readiness import ServiceWatch, ran_for, runs_here
from orchestrator.backends.container.resident import open_endpoint, reopen
from orchestrator.backends.container.runtime import EXEC_MODE_ENV, ContainerRuntime
from orchestrator.backends.docker import egress_change, hooks, memory
from orchestrator.backends.docker.direct import DirectRun
from orchestrator.backends.docker.lifecycle import Project
from orchestrator.backends.docker.network import GATEWAY
from orchestrator.backends.docker.render import CompiledProject, CompileOptions
from orchestrator.backends.docker.start import start_project
from orchestrator.errors import OrchestratorError, ProjectNotFound, UsageError
from orchestrator.paths import make_folders
from orchestrator.sandbox import hostfs, hostpack, record
from orchestrator.sandbox.backend import Amounts
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.call import file_deadline
from orchestrator.sandbox.options import BuildChoice, SpawnOptions
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.sandbox.usage import Egress
from orchestrator.settings import engine_host, same_engine
from orchestrator.spec import egress as egress_rules
from orchestrator.spec.loader import Environment
from orchestrator.spec.lockfile import Lock
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import IMAGE_USER, MAIN

__all__ = ["EXEC_MODE_ENV", "KILL_OTHERS", "ComposeRuntime"]
log = logging.getLogger("orchestrator.docker")

RECOUNT_WITHIN = 5.0
"""Seconds the last egress count waits at most, at removal, for the gateway to let go of
what a gone sandbox held open (see ComposeRuntime._recount_egress)."""


class ComposeRuntime(ContainerRuntime):
    name: ClassVar[str] = "docker"
    deviations: ClassVar[dict[str, str]] = {
        "fork-memory": "only a gVisor sandbox with no network, on an engine on this machine, "
        "is forked with its memory (no process checkpoint under runc: CRIU fails here; "
        "docs/fork.md); any other copies its files",
    }
    needs_image: ClassVar[bool] = True

    @classmethod
    def check(cls, env: Environment, policy: Policy, *, workspace: Path | None = None) -> list[str]:
        return hooks.check(env, policy, workspace)

    @classmethod
    def prepare(cls, env: Environment, policy: Policy, *, build: BuildChoice = "auto") -> None:
        hooks.prepare(env, policy, build=build)

    @classmethod
    def doctor(cls, env: Environment | None = None) -> list[tuple[str, str]]:
        from orchestrator.backends.container import doctor  # (only `orchestrator doctor`)

        if env is not None:
            return doctor.image_checks(Engine.at(), env)
        checks = doctor.engine_checks(Engine.at())
        if any(status == "fail" for status, _ in checks):
            return checks  # nothing more can be asked of it
        return checks + hooks.doctor()

    @classmethod
    def requested(cls, env: Environment, options: SpawnOptions | None) -> Amounts:
        return hooks.requested(env, options or SpawnOptions())

    @classmethod
    def render(cls, env: Environment, workspace: Path | None, policy: Policy) -> dict[str, str]:
        return hooks.render(env, workspace, policy)

    @classmethod
    def make_lock(cls, env: Environment, policy: Policy) -> Lock:
        return hooks.lock(env, policy)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.project: Project | None = None
        self._temp_workspace: Path | None = None
        self._egress = EgressCount()

    # ----- lifecycle -----------------------------------------------------------------------
    def _workspace(self, directory: Path) -> Path:
        """The caller's workspace, or a private one inside the project folder, so that it
        goes with the project (`down`, the reaper) whoever removes it."""
        if self.options.workspace is not None:
            make_folders(self.options.workspace)  # what is missing: 0700, whatever the umask
            return self.options.workspace
        self._temp_workspace = directory / "workspace"
        make_folders(self._temp_workspace)  # private until given to the sandbox user
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

        pinned = hooks.pins(self.env, opts.policy, host)  # (none: the file has no lock)
        self.warnings += [w for w in pinned.warnings if w not in self.warnings]

        def make_options(name: str, labels: dict[str, str], subnet: str | None) -> CompileOptions:
            return CompileOptions(
                project=name,
                workspace=self._workspace(Path(labels[LABEL_DIR])),
                private_workspace=opts.workspace is None,
                labels=labels,
                extra_mounts=opts.mounts,
                extra_ports=opts.ports,
                env_vars=opts.env_vars,
                subnet=subnet,
                policy=opts.policy,
                main_image=opts.resume.image if opts.resume else pinned.main,
                service_images=_service_images(self.env, opts.resume) or pinned.services,
                remote=remote,
                build=opts.build,
            )

        with_memory = opts.resume is not None and bool(opts.resume.memory)
        self.project = start_project(
            self.env,
            make_options,
            extra_files=_executor_files(),
            detached=opts.detached,
            host=opts.host or "",
            first_start=self._from_memory if with_memory and not remote else None,
        )
        compiled = self.project.compiled
        if compiled.user == IMAGE_USER:  # the image says, as Compose runs it
            compiled = replace(compiled, user=self.project.image_user(MAIN))
            self.project.compiled = compiled
            self._check_ids(compiled.user, "the image's USER")
        self.warnings += [w for w in compiled.warnings if w not in self.warnings]
        if self._temp_workspace is not None:
            _give(self._temp_workspace, compiled.user)
        self._main_engine = self.project.engine
        if remote:
            self._copy_in_all(compiled.user)
        else:  # each container sees its own IO_DIR/<service>: folders go through FIFOs there
            self._shared = self.project.directory / IO_DIR
            self._prepare_services(copied=False)  # a service's workdir, before its command
        services = self.env.spec.services
        watch = ServiceWatch(
            self._id, services, self._state, self._logs, timeout=up_timeout(), ran_for=self._ran_for
        )
        watch.started()  # every service runs, is healthy, or (a job) exited 0
        self._main = self._channel(MAIN, self.project.main_container)
        # a copy with memory runs from it already (_from_memory), or is stopped once its
        # workspace is in and started again from it (_restore_memory): until then commands
        # go by plain `docker exec`, and the executor (a third of a second under gVisor)
        # starts only for the restored one
        if with_memory:
            self._main.mode = "plain"
        else:
            self._main.start()  # greets while the ports are read
        if compiled.published:
            self._ports = self.project.ports()
        self._confirm_started()
        if opts.resume is None:
            watch.settled()  # and none died as it started
        else:  # once its workspace is restored: the settle window overlaps that
            self._unsettled = watch
        self._remember()  # for attach(): `orchestrator exec`, `up --pool`, ...
        if opts.detached and self._shared is not None and not with_memory:
            self._open_endpoint()

    def _open_endpoint(self) -> bool:
        """A detached environment's endpoint for `orchestrator exec` (container/resident.py),
        where its executor reaches a socket of the host's (not under gVisor)."""
        assert self.project is not None and self._main is not None and self._shared is not None
        try:
            self._main.ready()
        except OrchestratorError:  # the first command says why, as without an endpoint
            return False
        if self._main.transport != "socket":
            return False
        defaults: dict[str, object] = {"cwd": self.workdir, "user": self.default_user}
        return open_endpoint(
            self.project.engine,
            self.project.main_container,
            self.project.directory,
            self._shared / MAIN,
            defaults,
        )

    def _reopen_endpoint(self) -> bool:
        if self.project is None or self._main is None or self._shared is None:
            return False
        return reopen(self.project.directory, self._open_endpoint)

    def _remember(self) -> None:
        assert self.project is not None
        c = self.project.compiled
        state = {
            "user": c.user,
            "published": c.published,
            "shared": self._shared is not None,
            "temp_workspace": self._temp_workspace is not None,
            "mounts": [[str(m.source), m.target, m.read_only, m.origin] for m in c.mounts],
            "defuse": [str(p) for p in c.defuse],
            "writable": [str(p) for p in c.writable],
            "infra": list(c.infra),  # (set_egress: whether the sandbox has a gateway)
            "proxied": list(c.proxied),
            "egress": c.egress,
        }
        # the engine it runs on, even when only the process's variables named it (`-H`,
        # `--engine podman`): whoever attaches later reaches it there
        host = self.options.host or engine_host()  # ("": the docker CLI's default)
        record.remember(self.project.directory, self.name, self.env, host, state)

    @classmethod
    def from_record(
        cls, ident: str, env: Environment, options: SpawnOptions, folder: Path, state: Any
    ) -> Runtime:
        """The project in `folder`, as `_remember` described it."""
        rt = cls(env, options)
        try:
            mounts = tuple(ResolvedMount(Path(s), t, bool(r), o) for s, t, r, o in state["mounts"])
            defuse = tuple(Path(str(p)) for p in state.get("defuse", ()))
            writable = tuple(Path(str(p)) for p in state.get("writable", ()))
            user, published = str(state["user"]), bool(state["published"])
            shared, temp = bool(state["shared"]), bool(state["temp_workspace"])
            infra = tuple(str(i) for i in state.get("infra", ()))
            proxied = tuple(str(g) for g in state.get("proxied", ()))
            egress = {str(k): str(v) for k, v in dict(state.get("egress", {})).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ProjectNotFound(f"{ident}: its record is not usable ({exc!r})") from None
        compiled = CompiledProject(
            ident,
            "",
            {},
            (),
            mounts,
            {},
            user,
            "",
            False,
            published,
            defuse=defuse,
            writable=writable,
            infra=infra,
            proxied=proxied,
            egress=egress,
        )
        # no engine named (by the caller or the record): the one the folder records, not
        # whichever this process works with
        rt.project = Project(ident, folder, compiled, options.host or folder_engine(folder) or "")
        rt._temp_workspace = folder / "workspace" if temp else None
        rt._main_engine = rt.project.engine
        # (a project made before the transfer folders were per container has none: no FIFO)
        rt._shared = folder / IO_DIR if shared and (folder / IO_DIR).is_dir() else None
        # its executor starts at the first command, which says why when it cannot run (a
        # stopped sandbox is attached too: its logs, poll() and cleanup() still work)
        rt._main = rt._channel(MAIN, rt.project.main_container)
        if published:
            rt._ports = rt.project.ports()
        return rt

    def _recounts_egress(self) -> bool:
        """Whether the removal counts the egress again (Project.down's `before_gateway`):
        when someone read the usage and a gateway counts it."""
        project = self.project
        return project is not None and self._meter.asked and GATEWAY in project.compiled.infra

    def _remove(self) -> None:
        if self.project is not None:
            recount = self._recount_egress if self._recounts_egress() else None
            self.project.down(keep=self.env.spec.keep_after_cleanup, before_gateway=recount)

    def _recount_egress(self) -> None:
        """The last egress count again, once the sandbox and its services are gone and the
        gateway is not yet (Project.down): the last reading was taken while they still ran,
        and a request begun after it was never in it. Squid logs a tunnel whose client went
        a moment after: what it still holds is asked again for at most RECOUNT_WITHIN s in
        all (a gateway that cannot say is not asked again: the count says it is short)."""
        assert self.project is not None
        deadline = time.monotonic() + RECOUNT_WITHIN
        while True:
            left = deadline - time.monotonic()
            held = egress_change.open_requests(self.project, within=max(1.0, left))
            if held is None or held == 0 or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        self._meter.recount(held != 0)

    def _removed(self) -> None:
        self._release_images()
        if self.project is not None:
            compiled = self.project.compiled
            folders = [m.source for m in compiled.mounts if m.origin == "workspace"]
            for folder in dict.fromkeys([*folders, *compiled.defuse]):
                if folder.exists():  # no set-id program, file capability or device stays
                    hostfs.defuse(folder)
        if self._temp_workspace is not None:
            shutil.rmtree(self._temp_workspace, ignore_errors=True)

    def _detach(self) -> None:
        with self._lock:
            self._closed = True
        for channel in self._channels():
            channel.close()
        if self.project is not None:
            self.project.release()  # its services' tethers too (see Project.tether)
            self.project.let_go()  # (no call of this runtime restarts it from now on)

    def _kill_containers(self) -> None:
        if self.project is not None:
            self.project.kill()

    def _before_down(self, keep: bool) -> None:
        if self.project is None:
            return
        if keep:
            self.project.stop_one_by_one()
        else:
            self.project.leave_networks()

    def _pack_workdir(self, user: str | None, limit: int) -> bytes:
        """Where the workdir is the workspace's bind mount, the host packs that folder
        itself (packing writes nothing, so the content being untrusted does no harm); else,
        or when the host may not read all of it, the sandbox packs it."""
        source = self._workspace_source()
        archive = None if source is None else hostpack.pack_host(source, limit)
        return super()._pack_workdir(user, limit) if archive is None else archive

    def _pack_workdir_file(
        self, folder: Path, user: str | None, limit: int, timeout: float | None = None
    ) -> Path:
        """As _pack_workdir, the host's tar writing straight into the file; where it cannot,
        the sandbox packs it into the file, in what is left of `timeout`."""
        source = self._workspace_source()
        started = time.monotonic()
        made = None if source is None else hostpack.pack_to_file(source, folder, limit, timeout)
        if made is not None:
            return made
        left = None if timeout is None else max(timeout - (time.monotonic() - started), 0.01)
        return super()._pack_workdir_file(folder, user, limit, left)

    def writable_host_folders(self) -> Sequence[Path]:
        """Every host folder a container of this environment writes (binding.py)."""
        return () if self.project is None else self.project.compiled.writable

    def _workspace_source(self) -> Path | None:
        """The host folder of the workspace's bind mount, where that is the workdir."""
        assert self.project is not None
        workdir = posixpath.normpath(self.workdir)
        for mount in self.project.compiled.mounts:
            if mount.target == workdir and mount.origin == "workspace":
                return mount.source
        return None

    def _commit(self, record: Path) -> str:
        assert self.project is not None
        self._check_usable()
        return images.commit(self._container, record, self.project.engine)

    def _commit_all(self, record: Path) -> dict[str, str]:
        assert self.project is not None
        self._check_usable()
        project = self.project
        services = [MAIN, *sorted(self.env.spec.services)]
        containers = {s: project.container_of(s) for s in services}
        return images.commit_all(containers, record, project.engine)

    def _engine(self) -> str:
        """The engine its containers are on, as it was when it started (the process's
        settings may say another one now)."""
        if self.project is not None and self.project.engine.address:
            return self.project.engine.address
        return super()._engine()

    _unsettled: ServiceWatch | None = None
    _started_from_memory = False
    """A copy whose container was started from its memory image at once (_from_memory)."""

    def _from_memory(self, project: Project, run: DirectRun) -> bool:
        """Start a copy with memory from its record at once (memory.first_start), where
        nothing stands in the way: its own new, empty workspace folder is what is mounted at
        its working folder (no mount of the file's or the caller's there, nor below it), its
        user's ids are numbers, the sealed runtime, an engine that restores; else False, and
        it starts as any wake."""
        snap, folder = self.options.resume, self._temp_workspace
        assert snap is not None and snap.memory
        if run.runtime != memory.sealed_runtime() or folder is None or not self.env.spec.workdir:
            return False
        if not _only_mount_at(run, self.workdir, folder) or any(folder.iterdir()):
            return False  # (only into its own new, empty folder: nothing there to follow)
        user = project.compiled.user
        ids = procutil.numeric_ids(project.image_user(MAIN) if user == IMAGE_USER else user)
        if ids is None or memory.engine_refusal(project.engine) is not None:
            return False  # (_restore_memory says why)
        _give(folder, f"{ids[0]}:{ids[1]}")  # its processes run on at once, in it
        with memory.locked(project.directory, self.env.name):
            done = memory.first_start(
                project.engine,
                run.name,
                self.workdir,
                snap,
                seconds=file_deadline(None),
                scratch=project.directory,
                owners=ids,
            )
        self._started_from_memory = done
        return done

    def _restore(self, snap: Snapshot) -> None:
        if self._started_from_memory:
            self._other_file(snap)  # its workspace is in already
        else:
            super()._restore(snap)
        watch, self._unsettled = self._unsettled, None
        if watch is not None:
            watch.settled()  # none of its services died as it started

    # ----- memory (memory.py) -----------------------------------------------------------------
    def memory_refusal(self) -> str | None:
        if self.project is None:
            return "it is not running"
        return memory.refusal(self.project)

    @contextlib.contextmanager
    def _memory_held(self, folder: Path) -> Iterator[dict[str, str]]:
        why = self.memory_refusal()
        if why is not None:
            raise UsageError(f"{self.env.name}: no checkpoint with memory: {why}")
        self._check_usable()
        assert self.project is not None and self._main is not None
        with memory.locked(self.project.directory, self.env.name):
            self._main.close()  # its executor is started anew once the sandbox runs again
            try:
                with memory.held(self.project.engine, self._container, folder) as digests:
                    yield digests
            finally:
                self._main.start()

    def _restore_memory(self, snap: Snapshot) -> None:
        why = self.memory_refusal()
        if why is not None:
            raise UsageError(f"{snap.name} holds memory, which cannot be restored here: {why}")
        assert self.project is not None and self._main is not None
        with memory.locked(self.project.directory, self.env.name):
            self._main.close()
            self._main.mode = self._mode  # (plain until now: see _start)
            if not self._started_from_memory:
                engine, container = self.project.engine, self._container
                memory.restore(engine, container, snap.memory_folder, snap.memory)
            self._main.start()
            self._main.ready()  # it runs, started from its memory (or says why not)
        if self.options.detached:
            self._reopen_endpoint()

    def _check_resumable(self, snap: Snapshot) -> None:
        """Every image the record names must be there and be the record's own (images.py);
        a memory image needs an engine that restores one."""
        engine = Engine.at(self.options.host or "")
        if snap.memory:
            why = memory.engine_refusal(engine)
            if why is not None:
                raise UsageError(f"{snap.name} holds memory, which cannot be restored here: {why}")
        images.check_resumable(snap, engine, on_its_engine=same_engine(snap.host, self._engine()))
        unknown = sorted(set(snap.services) - set(self.env.spec.services) - {MAIN})
        if unknown:
            self.warnings.append(
                f"snapshot {snap.name} holds services the file has not ({', '.join(unknown)}): "
                "left out"
            )

    def _release_images(self) -> None:
        """An environment woken from a record that is gone now (`wake` consumed it) takes
        that record's images with it: they were its own, and nothing else runs them."""
        snap = self.options.resume
        if snap is not None and snap.images and not snap.record.exists():
            images.release_woken(snap, Engine.at(self.options.host or ""))

    @classmethod
    def remove_snapshot_image(cls, snap: Snapshot) -> None:
        images.remove_snapshot(snap)

    def _project_folder(self) -> Path | None:
        return self.project.directory if self.project else None

    def _ran_for(self, service: str) -> float | None:
        """How long a service's container has run, by this machine's kernel
        (readiness.ran_for); None for one gated, whose command began only once it was
        prepared, after its container started (those gated wherever the assets go)."""
        if self.project is None or service in gated_services(self.env, copied=True):
            return None
        container = self.project.container_of(service)
        return ran_for(self.project.inspected(container, "inspecting a service"))

    def _state(self, service: str = MAIN) -> Any:
        assert self.project is not None
        project = self.project
        container = project.container_of(service)
        got = project.inspected(container, "inspecting the sandbox")
        if got is not None:
            return ContainerState.of(got.get("State"))
        whales = project.engine.whales
        return engine_call(
            "inspecting the sandbox", lambda: whales.container.inspect(container).state
        )

    def _visibly_running(self, service: str = MAIN) -> bool:
        """The engine (asked on its local socket) says the container runs, and its first
        process runs here (readiness.runs_here)."""
        assert self.project is not None
        try:
            got = self.project.inspected(
                self.project.container_of(service), "inspecting the sandbox"
            )
        except OrchestratorError:
            return False
        return runs_here(got)

    def _host_workspace(self) -> Path | None:
        if self._shared is None or not self.env.spec.workspace.mount:
            return None  # (remote, or not mounted: the workspace is in the container)
        return self.options.workspace or self._temp_workspace

    def _count_egress(self) -> Egress | None:
        project = self.project
        if project is None or GATEWAY not in project.compiled.infra:
            return None  # (no gateway: nothing goes out, or everything does, uncounted)
        return self._egress.read(project.engine, project.container_of(GATEWAY))

    def _egress_held(self) -> bool:
        project = self.project
        if project is None or GATEWAY not in project.compiled.infra:
            return False
        return egress_change.open_requests(project) != 0  # (None: not known)

    def _apply_egress(self, egress: egress_rules.Egress) -> list[str]:
        assert self.project is not None
        egress_change.apply(self.project, egress)
        c = self.project.compiled
        routed = sorted(n for n, e in c.egress.items() if e == "all" and n not in c.proxied)
        if not routed:
            return []
        return [
            f"services {', '.join(routed)} reach outside on their own (egress: all), not "
            "through the gateway: they are not changed, and the sandbox can reach them"
        ]

    def _locate(self, service: str) -> tuple[str, Engine]:
        """A service's container, and the engine that runs it."""
        assert self.project is not None
        return self.project.container_of(service), self.project.engine

    def _exec_defaults(self, service: str) -> tuple[str, str | None]:
        assert self.project is not None
        return self.project.exec_defaults(service)

    def _logs(self, service: str) -> str:
        assert self.project is not None
        return self.project.logs(service, tail=20)

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

    def keep(self) -> None:
        self._check_open()
        assert self.project is not None
        self.project.keep()
        self.detach()


def _service_images(env: Environment, snap: Snapshot | None) -> dict[str, str]:
    """The services' images a woken record runs instead of the file's (those the file has)."""
    if snap is None:
        return {}
    return {s: image for s, image in snap.services.items() if s in env.spec.services}


def _executor_files() -> dict[str, bytes]:
    """The executor, copied into every project's sandbox folder (made once)."""
    return {f"{SANDBOX_DIR}/{rel}": data for rel, data in executor_files().items()}


def _only_mount_at(run: DirectRun, workdir: str, folder: Path) -> bool:
    """Whether the one mount at `workdir` binds `folder`, and nothing is mounted below it."""
    host, workdir = run.body["HostConfig"], clean_path(workdir)
    mounts = host.get("Mounts") or []
    at = [m for m in mounts if clean_path(str(m.get("Target"))) == workdir]
    others = [m for m in mounts if m not in at]
    targets = [clean_path(str(m.get("Target"))) for m in others]
    targets += [clean_path(str(t)) for t in host.get("Tmpfs") or {}]
    return (
        len(at) == 1
        and at[0].get("Type") == "bind"
        and at[0].get("Source") == str(folder)
        and not at[0].get("ReadOnly")
        and not any(t == workdir or t.startswith(workdir.rstrip("/") + "/") for t in targets)
        # (and none it could write into: a link in the image may lead a target below it)
        and all(m.get("ReadOnly") for m in others)
    )


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
