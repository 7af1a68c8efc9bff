"""The runtime protocol: one set of calls for every backend.

A `Sandbox` (sandbox/calls.py) is a place commands run (the main sandbox, or one service of
it): it provides `_run`, `workdir`, `static_path` and `connection`, and execute, stream and
the file calls are written once over them. A `Runtime` is the main sandbox plus the
lifecycle: a backend adds
`_start`, `_kill`, `_poll`, `_close` and `info`, and setup, cleanup, kill and poll are written
once here, so every backend keeps the same semantics.

What the rest of the package may ask of a backend is public and documented here: the
registry and the CLI its class (`check`, `prepare`, `render`, `reap_folder`,
`remove_snapshot_image`), a pool its runtimes (`baseline`, `reset`, `pool_enter`,
`pool_move`, `pool_state`). Nothing outside a backend calls its private hooks or names it.

`{{static:NAME}}` placeholders are resolved in the environment file's own commands (setup,
`commands`), never in the text a caller passes to `execute`: that text may be model-written,
and runs exactly as given (use `static_path(NAME)` to build a path).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import threading
import weakref
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from orchestrator.errors import (
    OrchestratorError,
    RuntimeClosed,
    SandboxPaused,
    SetupFailed,
    UsageError,
)
from orchestrator.sandbox import admission, files, hostpack, snapshot, suspend, threads
from orchestrator.sandbox.calls import Sandbox, _deadline, _raise_held
from orchestrator.sandbox.options import (
    BuildChoice,
    SpawnOptions,
    setup_timeout,
    snapshot_limit,
)
from orchestrator.sandbox.results import (
    EnvironmentStatus,
    RuntimeInfo,
    RuntimeResult,
    decode,
)
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.sandbox.streams import ArchiveFile, ArchiveStream
from orchestrator.settings import engine_host, engine_named
from orchestrator.spec.loader import Environment, require_main_image
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import MAIN, substitute_static

log = logging.getLogger("orchestrator")
_live: weakref.WeakSet[Runtime] = weakref.WeakSet()

PoolState = Literal["ready", "in-use", "claimed", "removing"]
"""Where a pooled environment is: waiting in its pool, handed out by it, taken by another
process (`orchestrator up --pool`), or being removed by it."""


@atexit.register
def _cleanup_at_exit() -> None:
    """Safety net for runtimes a caller forgot to clean up; `with` is the way to use them.
    A process killed outright leaves its projects to `orchestrator cleanup` (owner gone); in
    a child forked from the owner, cleanup() closes only the child's copies."""
    for rt in list(_live):
        if not rt.closed and not rt.options.detached:
            with contextlib.suppress(Exception):
                rt.cleanup()


class Runtime(Sandbox):
    """A live environment. Use as a context manager; leaving the block calls `cleanup()`."""

    #: Registered backend name.
    name: ClassVar[str] = ""
    #: Conformance rules this backend deliberately does not keep: rule id -> reason.
    deviations: ClassVar[Mapping[str, str]] = {}
    #: The main sandbox runs an image: the file must give exactly one of `image` or `build`.
    needs_image: ClassVar[bool] = False
    #: Commands run isolated from this host. A backend that says False (local) runs only when
    #: the caller chooses it or its policy allows a file to (`Policy.allow_unisolated`).
    isolated: ClassVar[bool] = True

    # ----- what the registry and the CLI ask of a backend class (no engine is touched) -----
    @classmethod
    def check(cls, env: Environment, policy: Policy, *, workspace: Path | None = None) -> list[str]:
        """Check `env` for this backend under `policy` without starting anything: raise
        SpecError (PolicyError) listing what it refuses, return warnings worth printing.
        `workspace`: the host folder it would get (None: a scratch one). Used by `orchestrator
        validate` and `render`. The default checks `needs_image`; a backend that compiles the
        file to a project of its own checks that compilation too."""
        if cls.needs_image:
            require_main_image(env)
        return []

    @classmethod
    def prepare(cls, env: Environment, policy: Policy, *, build: BuildChoice = "auto") -> None:
        """Work done once before many spawns of `env` (building its images, say), after the
        same checks as `check`; `build` says how images are got (see BuildChoice). The
        default only checks."""
        cls.check(env, policy)

    @classmethod
    def requested(cls, env: Environment, options: SpawnOptions | None) -> admission.Amounts:
        """What `env` takes of this host once up, as admission counts it (`options`: the
        spawn's, None: a spawn with none): the memory and CPU limits this backend applies to
        each of its containers, the file's or the caller's defaults. The default: the file's
        main sandbox and services; a backend that adds containers of its own counts them."""
        return admission.request(env)

    @classmethod
    def doctor(cls, env: Environment | None = None) -> list[tuple[str, str]]:
        """What `orchestrator doctor` should say about this backend on this machine (its
        engine, what it needs there), or with `env`, of what that file needs here (its
        images), as (pass | warn | fail, message) lines. The default: nothing."""
        return []

    @classmethod
    def render(cls, env: Environment, workspace: Path | None, policy: Policy) -> dict[str, str]:
        """The native project `env` compiles to for `workspace`, as {relative path: text},
        the main file first (`orchestrator render`); `workspace` None: the private one a
        spawn without a workspace makes, shown by a stand-in that the rendering says is one.
        The default: this backend has none."""
        raise UsageError(
            f"the {cls.name or cls.__name__} backend has no project file to render: it runs "
            "the environment directly; `orchestrator validate` checks the file"
        )

    # ----- environments left running: `orchestrator.environments`, `remove_environment`, `reap`
    # A backend whose environments never outlive their process keeps these defaults.
    # Backends sharing one implementation (the container ones) are asked once.
    @classmethod
    def running(cls) -> tuple[list[EnvironmentStatus], list[str]]:
        """Its environments left running, after removing those whose owner is gone (their
        ids, second)."""
        return [], []

    @classmethod
    def running_ids(cls) -> list[str]:
        """The ids of its environments left running (a listing that removes nothing), which
        `remove_environment` matches a caller's ref against, over every backend at once."""
        return []

    @classmethod
    def remove_running(cls, ident: str, *, force: bool = False) -> str | None:
        """Remove its environment `ident` (an exact id) and return it; None when it has none
        so named. UsageError when its owner process still uses it, unless `force` or it was
        kept on purpose."""
        return None

    @classmethod
    def reap(cls, *, everything: bool = False, include_kept: bool = False) -> list[str]:
        """Remove what is left of environments whose owner is gone (all with `everything`;
        kept ones only with `include_kept`): what was removed, one line each."""
        return []

    def __init__(self, env: Environment, options: SpawnOptions) -> None:
        self.env = env
        self.options = options
        self.setup_result: RuntimeResult | None = None
        self.warnings: list[str] = list(env.notices)
        self._closed = False
        self._removal: str | None = None
        """What cleanup() got to: None (not tried), running, done, failed (tried again), or
        detached (never removed by this object)."""
        self._killed = False
        self._lock = threading.Lock()
        self._pid = os.getpid()
        """The process this runtime belongs to: a child forked from it holds a copy it must
        neither use nor clean up (`_in_child`)."""

    # ----- what a backend provides -------------------------------------------------------
    @abstractmethod
    def _start(self) -> None:
        """Bring the environment up (cleanup() undoes whatever part of it happened)."""

    @abstractmethod
    def _kill(self) -> None:
        """Kill every process of the environment."""

    @abstractmethod
    def _poll(self) -> int | None:
        """None while the environment is alive, else its exit status."""

    @abstractmethod
    def _close(self) -> None:
        """Release everything the environment holds. Must tolerate a partial start."""

    @abstractmethod
    def info(self) -> RuntimeInfo:
        """What this runtime is: id, backend, workdir, user, how commands run, ports."""

    def file_command(self, name: str) -> str:
        """The environment file's `commands.NAME`, its `{{static:...}}` resolved here."""
        try:
            text = self.env.spec.commands[name]
        except KeyError:
            known = ", ".join(sorted(self.env.spec.commands)) or "none"
            raise UsageError(f"no command named {name!r} in the file (known: {known})") from None
        return substitute_static(text, self.static_path)

    # ----- lifecycle -----------------------------------------------------------------------
    @classmethod
    def spawn(cls, env: Environment, options: SpawnOptions | None = None) -> Runtime:
        """Start the environment and run its setup; on any failure remove what was started."""
        rt = cls(env, options or SpawnOptions())
        if rt.options.resume is not None:
            rt._check_resumable(rt.options.resume)
        if rt.options.host:  # its snapshots' images may be removed there (settings.may_reach)
            engine_named(rt.options.host)
        want = cls.requested(env, rt.options)  # what it will be held to, once up
        rt._admission = admission.admit(env, want=want)  # waits for room (sandbox/admission)
        _live.add(rt)
        try:
            rt._start()
            if rt._admission is not None:
                rt._admission.anchor(rt.lasting_folder())
            if rt.options.resume is not None:
                rt._restore(rt.options.resume)
            if not rt.options.disable_setup:
                rt._run_setup()
        except BaseException:
            rt.cleanup()
            raise
        return rt

    #: Found running by `orchestrator.attach`: leaving a `with` block leaves it running.
    attached: bool = False
    #: This environment's hold on the host's admission budget (None: not admitted by us).
    _admission: admission.Admission | None = None

    @classmethod
    def _attach(
        cls, ident: str, env: Environment, options: SpawnOptions, folder: Path, state: Any
    ) -> Runtime:
        """A runtime for environment `ident`, running already, from the record this backend
        left in `folder` (see sandbox/attach.py). The default: this backend cannot."""
        raise UsageError(f"the {cls.name} backend cannot attach to a running environment")

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.attached:
            self.detach()
        else:
            self.cleanup()

    def _in_child(self) -> bool:
        """Whether this is a copy of the runtime in a child forked from its process."""
        return os.getpid() != self._pid

    def cleanup(self) -> None:
        """Stop and remove everything. Idempotent; afterwards every call raises RuntimeClosed.
        A removal that fails (an engine that hung or refused) raises, and the next cleanup()
        tries it again (after this process, the owner's guardian or a reap removes it); one
        another thread is running meanwhile is not waited for. In a
        child forked from the runtime's process it only closes the child's copy: the
        environment, its processes and its admission are the parent's."""
        with self._lock:
            again = self._removal == "failed"
            if self._closed and not again:  # removed, being removed, or detached
                return
            self._closed = True
            self._removal = "running"
        if self._in_child():
            return
        try:
            self._close()
        except BaseException:
            with self._lock:
                if self._removal == "running":  # (not detached meanwhile)
                    self._removal = "failed"
            raise
        else:
            with self._lock:
                if self._removal == "running":
                    self._removal = "done"
        finally:
            # released whether or not the removal went through: what is left goes with a
            # later cleanup(), the owner's guardian or a reap, and must not hold back spawns
            if self._admission is not None:
                self._admission.release()

    def lasting_folder(self) -> Path | None:
        """The host folder that stands for this environment beyond this object (a container
        backend's project folder), None when it has none: its admission is held while that
        folder exists, after this process too (a detached environment until `down`)."""
        return None

    @property
    def closed(self) -> bool:
        return self._closed

    def poll(self) -> int | None:
        """None while the environment runs; its exit status once it was killed or died."""
        self._check_open()
        return self._poll()

    def kill(self) -> None:
        """Kill every process of the environment now (as subprocess's kill). Call cleanup()
        afterwards to remove it."""
        self._check_open()
        self._killed = True
        self._kill()

    # ----- pause / resume (a backend provides _pause, _resume, _frozen) -------------------
    #: Paused by this object (a fast refusal of calls); `paused` asks the backend.
    _paused: bool = False

    def pause(self) -> None:
        """Freeze every process of the environment (the main sandbox and every service)
        where it is: no CPU, memory kept, until `resume()`. Meanwhile every call that would
        run something (execute, stream, the file calls, snapshot, service calls) raises
        SandboxPaused at once; a command in flight raises it within about two seconds (by
        plain `docker exec`, at its deadline), and is killed: it never runs again, whoever
        resumes the environment. info(), poll(), logs(), kill() and cleanup() still work.
        Idempotent; raises UsageError where the backend cannot."""
        self._check_usable_unpaused()
        if not self._paused:
            self._pause()
            self._paused = True

    def resume(self) -> None:
        """Let a paused environment run on, its processes as they were (also one paused by
        another process, e.g. `orchestrator pause`). Idempotent."""
        self._check_usable_unpaused()
        self._resume()
        self._paused = False

    @property
    def paused(self) -> bool:
        """Whether the environment is paused now (by this object or another process)."""
        self._check_open()
        self._paused = self._frozen()
        return self._paused

    def _pause(self) -> None:
        """Freeze every process of the environment; all or none (undo a partial pause)."""
        raise UsageError(f"the {self.name} backend cannot pause an environment")

    def _resume(self) -> None:
        """Thaw what `_pause` froze (whoever froze it); nothing when nothing is frozen."""
        raise UsageError(f"the {self.name} backend cannot pause an environment")

    def _frozen(self) -> bool:
        """Whether the environment is paused, as the backend sees it now."""
        return False

    def _check_usable_unpaused(self) -> None:
        self._check_open()
        if self._killed:
            raise RuntimeClosed(f"runtime for {self.env.name!r} was killed")

    def _check_not_paused(self) -> None:
        """Raise SandboxPaused while this object paused the environment and it still is."""
        if self._paused and self.paused:
            raise SandboxPaused(
                f"{self.env.name}: the environment is paused; nothing runs in it until it is "
                "resumed: call rt.resume(), or run `orchestrator resume ID`"
            )

    def snapshot(
        self,
        dest: str | Path | None = None,
        *,
        limit: int | None = None,
        filesystem: bool = False,
        timeout: float | None = None,
    ) -> Snapshot:
        """Save the workspace (the working folder's whole tree) as a snapshot: to the path
        `dest`, under the name `dest` in the snapshots folder, or a fresh name there. With
        `filesystem` (Docker), the main container's filesystem is saved too, as an image
        (removed with the snapshot). Resume it with spawn_runtime(env, resume=snapshot).
        Take it while no command runs: the two are not one atomic copy. `timeout`: the
        sandbox packs it, and past that many seconds SandboxFileTimeout is raised."""
        self._check_open()
        self._check_not_paused()
        path = snapshot.archive_path(self.env.name, dest)
        limit = limit or snapshot_limit()
        snapshot.records_folder(path)  # private, owner-checked
        # with a timeout or without, into a file beside `path`: never whole in memory
        archive = self._pack_workdir_file(path.parent, None, limit, timeout)
        image, env, host = "", self.env, self._engine()
        try:
            image = self._commit(path.with_suffix(".json")) if filesystem else ""
            threads.last_step()  # (an async caller that was cancelled gets no snapshot)
            return snapshot.save(archive, env.name, env.digest, path, image, host, self.name)
        except BaseException:
            if image:  # made for a snapshot that is not: it goes (what is at `path` stays)
                made = snapshot.Snapshot(path, "", "", "", 0, image, host, self.name)
                with contextlib.suppress(OSError, OrchestratorError):  # the first error is news
                    self.remove_snapshot_image(made)
            raise
        finally:
            archive.unlink(missing_ok=True)  # (moved into place unless that failed)

    def _engine(self) -> str:
        """The engine this runtime's containers are on, as a snapshot records it: the one
        named at spawn, else the process's (ORCHESTRATOR_ENGINE and the rest included), so
        a record made on Podman says so ("": the docker CLI's default)."""
        return self.options.host or engine_host()

    def _commit(self, record: Path) -> str:
        """Save the main container's filesystem as an image owned by `record`; its tag."""
        raise UsageError(f"the {self.name} backend has no container filesystem to snapshot")

    def _check_resumable(self, snap: Snapshot) -> None:
        """Refuse, before anything starts, a snapshot this backend cannot resume."""
        if snap.images:
            raise UsageError(
                f"snapshot {snap.name} holds container filesystems, which only the "
                f"{snap.image_backend} backend resumes (this is {self.name}); resume it there, or "
                "take a snapshot without filesystem=True"
            )

    def suspend(self, name: str | None = None, *, keep: bool = True) -> Snapshot:
        """Save the whole environment to disk and remove it (its memory freed): the
        workspace, and on a container backend every container's filesystem (each service's
        too) as images, in a record named `name` (or a fresh name) in the snapshots folder.
        `orchestrator.wake(record.name)` starts it again under a new id. Running processes
        are not kept (every command is killed first). `keep` (default): the record stays
        until woken or removed, whatever becomes of this process; keep=False: it goes, with
        its images, when this process ends. See sandbox/suspend.py."""
        self._check_usable()
        path = suspend.record_path(self.env.name, name)
        images = self._commit_all(path.with_suffix(".json"))  # all at one frozen instant
        main = images.pop(MAIN, "")
        env, host = self.env, self._engine()
        archive: Path | None = None
        try:
            self._kill_processes()  # nothing changes the workspace while it is packed
            snapshot.records_folder(path)  # private, owner-checked
            archive = self._pack_workdir_file(path.parent, None, snapshot_limit())
            saved = snapshot.save(
                archive,
                *(env.name, env.digest, path, main, host, self.name),
                services=images,
                source=suspend.source_of(env),
                suspended=True,
                owner={} if keep else suspend.this_process(),
            )
        except BaseException:  # the images made go again (the environment runs on)
            with contextlib.suppress(OSError, OrchestratorError):  # the first error is the news
                snapshot.Snapshot(path, "", "", "", 0, main, host, self.name, images).remove()
            raise
        finally:
            if archive is not None:
                archive.unlink(missing_ok=True)  # (moved into place unless that failed)
        self.kill()  # nothing in it is kept: no stop grace to wait for
        self.cleanup()
        return saved

    def _commit_all(self, record: Path) -> dict[str, str]:
        """Save every container's filesystem (by service, "main" too) as images owned by
        `record`, at one instant; the default (no container filesystem): none."""
        return {}

    @classmethod
    def reap_folder(cls, folder: Path) -> None:
        """Remove what an abandoned project folder of this backend stands for (its owner
        process is gone), then the folder; raise OrchestratorError when that cannot be done
        now (the next reap tries again). Asked by the reapers for a folder that names this
        backend. The default: a backend that leaves nothing running has nothing to remove."""

    @classmethod
    def remove_snapshot_image(cls, snap: Snapshot) -> None:
        """Remove the image a snapshot of this backend holds (`snap.image`), only if it is
        that snapshot's own. The default: a backend that makes no images leaves it."""
        log.warning(
            "snapshot %s names image %s, but the %s backend makes none: left alone",
            snap.name,
            snap.image,
            cls.name,
        )

    def _restore(self, snap: Snapshot) -> None:
        if snap.digest != self.env.digest:
            self.warnings.append(
                f"snapshot {snap.name} was taken from {snap.env!r} as another file; resumed anyway"
            )
        with ArchiveFile(snap.path) as archive:  # read as it is sent, never whole
            try:
                self._unpack_here(archive, self.workdir, None)
            except OrchestratorError:
                if archive.error is None:
                    raise
            if archive.error is not None:  # the sandbox saw a cut archive; this is why
                raise archive.error

    def restore(self, snap: Snapshot) -> None:
        """Put a running environment back to a snapshot: every process in it is killed (the
        environment stays up; its services are left as they are), then the working folder
        is emptied and refilled from the snapshot. No setup command runs."""
        with ArchiveFile(snap.path) as archive:  # read as it is sent, never whole
            self._refill_workdir(archive)

    #: Who packs and refills the workspace in a reset: someone who can read and remove
    #: whatever the commands left there (None: the default user).
    _reset_user: ClassVar[str | None] = None

    # ----- what a pool asks of a runtime (public hooks; a backend may refine them) ---------
    def baseline(self, limit: int | None = None) -> bytes:
        """The working folder as it is now, as a tar stream to give `reset` later (a pool
        takes one right after setup). Packed by someone who can read all of it."""
        return self._pack_workdir(self._reset_user, limit or snapshot_limit())

    def reset(self, baseline: bytes) -> None:
        """Put the environment back to `baseline`: every process in it is killed (it stays
        up; its services are left as they are), then the working folder is emptied and
        refilled from the archive. Raises OrchestratorError when it cannot: then the
        environment is not fit to hand out again."""
        self._refill_workdir(baseline)

    def _refill_workdir(self, baseline: bytes | ArchiveStream) -> None:
        """reset(), from bytes or from a stream (a snapshot's file, sent as it is read)."""
        self._check_usable()
        self._kill_processes()
        target, deadline = self._path(self.workdir), _deadline(None)
        argv = files.replace_argv(target)
        cmd = self._command(argv, None, b"", None, self._reset_user, deadline)
        cmd = dataclasses.replace(cmd, stdin=baseline)
        stream = baseline if isinstance(baseline, ArchiveStream) else None
        _, err, outcome = self._collect(cmd, 64 * 1024, bulk=stream is not None)
        stderr = decode(err.value())
        _raise_held(outcome, stderr, target, "reset", deadline)
        if stream is not None and stream.error is not None:
            raise stream.error  # the sandbox saw a cut archive; this is why
        files.raise_for_folder(outcome.exit_code, target, "reset", stderr)

    def pool_enter(self, pool: str) -> None:
        """Record that pool `pool` holds this environment, waiting ("ready"), where other
        processes can see it (`orchestrator ps`, `up --pool`). The default: nowhere, for a
        backend whose environments no other process can reach."""

    def pool_move(self, frm: PoolState, to: PoolState) -> bool:
        """Change the recorded pool state from `frm` to `to` atomically against other
        processes; False (nothing changed) when it is not in `frm` (claimed meanwhile).
        The default, with nothing recorded: always True."""
        return True

    def pool_state(self) -> PoolState | None:
        """The recorded pool state (None: in no pool, or nothing recorded)."""
        return None

    def _pack_workdir(self, user: str | None, limit: int) -> bytes:
        """The working folder as a tar stream (snapshots, pool baselines); a backend that
        can read it more directly than through a command does so."""
        return self._pack_here(self.workdir, user, limit)

    def _pack_workdir_file(
        self, folder: Path, user: str | None, limit: int, timeout: float | None = None
    ) -> Path:
        """The working folder's archive for a snapshot or a suspend record, in a new file in
        `folder` (the record's folder: the caller moves it into place, or removes it),
        written as it comes, never whole in memory; past `timeout` seconds
        SandboxFileTimeout. A backend that can write that file more directly than through a
        command does so."""
        return hostpack.into_part(
            folder,
            lambda fd: self._pack_into(
                self.workdir, user, limit, timeout, functools.partial(hostpack.write_all, fd)
            ),
        )

    @abstractmethod
    def _kill_processes(self) -> None:
        """Kill every process running in the environment, leaving the environment up."""

    def keep(self) -> None:
        """Keep the environment running after this process, until `orchestrator down` (for
        a harness told not to clean up). Backends that cannot do that raise UsageError."""
        raise UsageError(f"the {self.name} backend cannot keep an environment after this process")

    def detach(self) -> None:
        """Let the environment outlive this object (for `orchestrator up`): release local
        resources without stopping it. Backends that cannot do that raise UsageError. In a
        child forked from the runtime's process it only closes the child's copy."""
        if self._in_child():
            self._closed = True
            return
        self._detach()
        with self._lock:  # (also after a removal that failed: it is left as it is now)
            self._closed = True
            self._removal = "detached"

    def _detach(self) -> None:
        """`detach`, in the runtime's own process."""
        raise UsageError(
            f"the {self.name} backend cannot keep an environment running after "
            "this process; use `orchestrator run` instead"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosed(f"runtime for {self.env.name!r} is closed (cleanup() was called)")
        self._check_owner()

    def _check_owner(self) -> None:
        """UsageError in a child forked from the runtime's process (see `_in_child`)."""
        if self._in_child():
            raise UsageError(
                f"runtime for {self.env.name!r} belongs to process {self._pid}, which this "
                "process was forked from: its channels and executors are that process's; "
                "spawn a runtime here, or `orchestrator up` one and `attach` to it in each "
                "process"
            )

    def _check_usable(self) -> None:
        self._check_usable_unpaused()
        self._check_not_paused()

    def _setup_output(self) -> RuntimeResult | None:
        return self.setup_result

    def logs(
        self, service: str = MAIN, *, tail: int | None = None, follow: bool = False
    ) -> Iterator[bytes]:
        """What service `service`'s process printed (the main sandbox's by default; commands
        run with execute print to their caller, not here), as it comes: the last `tail`
        lines, then with `follow` new output until the caller stops reading. Backends
        without such output raise UsageError."""
        raise UsageError(f"the {self.name} backend keeps no logs")

    def service(self, name: str) -> Sandbox:
        """Commands and files in service `name` of a multi-container environment ("main" is
        the sandbox itself). Backends without services know only "main"."""
        self._check_open()
        if name == MAIN:
            return self
        raise UsageError(f"the {self.name} backend has no service {name!r} (only {MAIN!r})")

    # ----- setup ---------------------------------------------------------------------------
    def _setup_commands(self) -> list[str]:
        setup = self.env.spec.setup
        # resumed: the workspace already holds what setup made; its own commands run instead
        cmds = list(setup.resume_commands if self.options.is_resume else setup.commands)
        if self.options.is_evaluation:
            cmds += setup.eval_commands
        return cmds

    def _run_setup(self) -> None:
        commands = self._setup_commands()
        if not commands:
            return
        timeout = setup_timeout()
        stdout, stderr, elapsed = [], [], 0.0
        for command in commands:
            r = self.execute(substitute_static(command, self.static_path), timeout=timeout)
            stdout.append(r.stdout)
            stderr.append(r.stderr)
            elapsed += r.elapsed
            if not r.ok:
                why = "timed out" if r.timed_out else f"exited with {r.exit_code}"
                raise SetupFailed(
                    f"setup command {command!r} {why}",
                    command=command,
                    exit_code=r.exit_code,
                    stdout="".join(stdout),
                    stderr="".join(stderr),
                )
        self.setup_result = RuntimeResult(0, "".join(stdout), "".join(stderr), elapsed)
