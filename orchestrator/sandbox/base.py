"""The runtime protocol: one set of calls for every backend.

A `Sandbox` (sandbox/calls.py) is a place commands run (the main sandbox, or one service of
it): it provides `_run`, `workdir`, `static_path` and `connection`, and execute, stream and
the file calls are written once over them. A `Runtime` is the main sandbox plus the
lifecycle: a backend adds `_start`, `_kill`, `_poll`, `_close` and `info`, and spawn, setup,
cleanup, kill and poll are written once (here and in sandbox/lifecycle.py), so every backend
keeps the same semantics; so are its saved states (snapshot, suspend, restore, a pool's
baseline and reset), over `_pack_workdir_file`, `_commit_all` and `_kill_processes`.

What the rest of the package may ask of a backend is public and documented: the services
and the CLI its class (`Backend`, sandbox/backend.py: `check`, `prepare`, `render`,
`from_record`, `reap_folder`, `remove_snapshot_image`, ...), a pool its runtimes
(`baseline`, `reset`, `pool_enter`, `pool_move`, `pool_state`). Nothing outside a backend
calls its private hooks or names it.

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
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, Literal

from orchestrator import procutil
from orchestrator.errors import OrchestratorError, SetupFailed, UsageError
from orchestrator.sandbox import files, hostpack, snapshot, threads, usage
from orchestrator.sandbox.backend import Amounts
from orchestrator.sandbox.call import file_deadline, raise_held
from orchestrator.sandbox.lifecycle import Hold, Lifecycle
from orchestrator.sandbox.options import SpawnOptions, setup_timeout, snapshot_limit
from orchestrator.sandbox.results import RuntimeResult, decode
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.sandbox.streams import ArchiveFile, ArchiveStream
from orchestrator.settings import engine_host, engine_named
from orchestrator.spec.loader import Environment
from orchestrator.spec.resolve import MAIN, substitute_static

log = logging.getLogger("orchestrator")
_live: weakref.WeakSet[Runtime] = weakref.WeakSet()

PoolState = Literal["ready", "in-use", "claimed", "removing"]
"""Where a pooled environment is: waiting in its pool, handed out by it, taken by another
process (`orchestrator up --pool`), or being removed by it."""
Admit = Callable[[Amounts], "Hold | None"]
"""What `Runtime.spawn` is given to wait for room on the host (see there)."""


@atexit.register
def _cleanup_at_exit() -> None:
    """Safety net for runtimes a caller forgot to clean up; `with` is the way to use them.
    A process killed outright leaves its projects to `orchestrator cleanup` (owner gone); in
    a child forked from the owner, cleanup() closes only the child's copies."""
    for rt in list(_live):
        if not rt.closed and not rt.options.detached:
            with contextlib.suppress(Exception):
                rt.cleanup()


class Runtime(Lifecycle):
    """A live environment. Use as a context manager; leaving the block calls `cleanup()`."""

    # ----- lifecycle -----------------------------------------------------------------------
    @classmethod
    def spawn(
        cls, env: Environment, options: SpawnOptions | None = None, *, admit: Admit | None = None
    ) -> Runtime:
        """Start the environment and run its setup; on any failure remove what was started.
        `admit(want)` waits until the host has room for what it will be held to (`requested`)
        and returns the hold on it, released at cleanup (spawn_runtime passes admission's,
        services/admission.py; None: not admitted)."""
        rt = cls(env, options or SpawnOptions())
        if rt.options.resume is not None:
            rt._check_resumable(rt.options.resume)
        if rt.options.host:  # its snapshots' images may be removed there (settings.may_reach)
            engine_named(rt.options.host)
        want = cls.requested(env, rt.options)  # what it will be held to, once up
        rt._hold = admit(want) if admit is not None else None  # waits for room
        _live.add(rt)
        try:
            rt._start()
            usage.watch(rt._meter)
            if rt._hold is not None:
                rt._hold.anchor(rt.lasting_folder())
            snap = rt.options.resume
            if snap is not None:
                rt._restore(snap)
                if snap.memory:  # its processes run on as they were: no setup runs
                    rt._restore_memory(snap)
            if not rt.options.disable_setup and not (snap is not None and snap.memory):
                rt._run_setup()
        except BaseException:
            rt.cleanup()
            raise
        return rt

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
        snapshot.replaced(path)  # (refused before anything is packed, and again below)
        # with a timeout or without, into a file beside `path`: never whole in memory
        archive = self._pack_workdir_file(path.parent, None, limit, timeout)
        image, env, host = "", self.env, self._engine()
        try:
            with snapshot.saving(path.with_suffix(".json")):  # (its image: no orphan meanwhile)
                old = snapshot.replaced(path)
                image = self._commit(path.with_suffix(".json")) if filesystem else ""
                threads.last_step()  # (an async caller that was cancelled gets no snapshot)
                with procutil.deferred():  # (a Ctrl-C between the two would remove it)
                    saved = snapshot.save(
                        archive, env.name, env.digest, path, image, host, self.name
                    )
                    image = ""  # (its record names it now: it stays with it, whatever comes)
                if old is not None:  # (one in use now goes with a later reap: images.py)
                    self._drop_replaced(old, saved)
                return saved
        except BaseException:
            if image:  # made for a snapshot that is not: it goes (what is at `path` stays)
                made = snapshot.Snapshot(path, "", "", "", 0, image, host, self.name)
                with contextlib.suppress(OSError, OrchestratorError):  # the first error is news
                    self.remove_snapshot_image(made)
            raise
        finally:
            archive.unlink(missing_ok=True)  # (moved into place unless that failed)

    @staticmethod
    def _drop_replaced(old: Snapshot, new: Snapshot) -> None:
        """Remove the image of `old`, the snapshot `new` replaced (each image's tag is its
        own); a failure is logged: the new snapshot stands."""
        try:
            old.remove_images()
        except (OSError, OrchestratorError) as exc:
            log.warning("snapshot %s: the image it replaced is left: %s", new.name, exc)

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
        its images, when this process ends. See sandbox/snapshot.py, and `wake`
        (services/suspend.py)."""
        saved = self._save_whole(name, keep=keep, quiet=True)
        self.kill()  # nothing in it is kept: no stop grace to wait for
        self.cleanup()
        return saved

    def checkpoint(
        self, name: str | None = None, *, keep: bool = True, memory: bool = False
    ) -> Snapshot:
        """Save the whole environment as `suspend` does (the workspace, and on a container
        backend every container's filesystem, each service's too, at one instant) and leave
        it running: `orchestrator.wake(record.name, keep_record=True)` starts a copy, and
        `orchestrator.fork(rt, n)` makes copies at once. Without `memory`, its files only:
        running processes and memory are neither saved nor stopped (take it while nothing
        writes the workspace). With `memory`, its processes and memory too, where the
        backend can (`memory_refusal()` says why not; UsageError then): the environment
        stands still for that instant, and a copy's processes run on from it. `keep`: as
        for suspend."""
        return self._save_whole(name, keep=keep, quiet=False, memory=memory)

    def memory_refusal(self) -> str | None:
        """Why `checkpoint(memory=True)` cannot save this environment's processes and
        memory here (None: it can). The default: no process checkpoint (CRIU fails on
        these machines' kernel; gVisor's is the Docker backend's)."""
        return (
            f"the {self.name} backend keeps no memory in a checkpoint (a process checkpoint "
            "needs gVisor on Docker; CRIU fails on this kernel)"
        )

    @contextlib.contextmanager
    def _memory_held(self, folder: Path) -> Iterator[dict[str, str]]:
        """Save the environment's memory into `folder` and hold it still while the block
        saves its files; the digests of the files saved. Where memory_refusal() is not
        None: UsageError, with it, before anything is saved."""
        raise UsageError(f"{self.env.name}: no checkpoint with memory: {self.memory_refusal()}")
        yield {}  # (a generator: never reached)

    def _restore_memory(self, snap: Snapshot) -> None:
        """Start this new environment's processes from `snap`'s memory image."""
        raise UsageError(f"{snap.name} holds memory, which the {self.name} backend restores not")

    def _save_whole(
        self,
        name: str | None,
        *,
        keep: bool,
        quiet: bool,
        memory: bool = False,
        meanwhile: Callable[[Snapshot], object] | None = None,
        handed: list[Snapshot] | None = None,
    ) -> Snapshot:
        """Save the workspace and every container's filesystem in a record (see suspend);
        `quiet`: every command is killed first; `memory`: processes and memory too, the
        files saved while they stand still. `meanwhile(record)`, once the record is whole
        and before the environment runs on (with memory: is started again from it), begins
        what may go on meanwhile (a fork's copies) and returns at once. An error raises,
        and the record goes, here, unless it was handed over first: put in the caller's
        `handed` (one step, before `meanwhile` runs), it is the caller's to remove, once
        what it began has stopped reading it."""
        self._check_usable()
        path = snapshot.record_path(self.env.name, name)
        snapshot.records_folder(path)  # private, owner-checked
        folder = path.with_suffix(snapshot.MEMORY_SUFFIX)
        held: contextlib.AbstractContextManager[dict[str, str]] = (
            self._memory_held(folder) if memory else contextlib.nullcontext({})
        )
        saved: Snapshot | None = None
        # (while it is saved, its images and memory folder are no orphans: `saving` holds
        # its name from before anything of it is made until after what a failure removes;
        # a save refused its name makes and removes nothing)
        with snapshot.saving(path.with_suffix(".json"), fresh=True):
            try:
                with held as digests:
                    saved = self._save_files(path, keep=keep, quiet=quiet, memory=digests)
                    if meanwhile is not None:
                        if handed is not None:
                            handed.append(saved)
                        meanwhile(saved)
                    return saved
            except BaseException:  # (also once saved, when the sandbox did not start again)
                if handed is not None and any(h is saved for h in handed):
                    raise  # copies may be starting from its files and images: the caller's
                with contextlib.suppress(OSError, OrchestratorError):  # the first error: news
                    snapshot.remove_files(folder)
                    if path.with_suffix(".json").exists():
                        snapshot.Snapshot.find(path).remove()
                    path.unlink(missing_ok=True)  # (an archive moved in, its record not written)
                raise

    def _save_files(
        self, path: Path, *, keep: bool, quiet: bool, memory: dict[str, str]
    ) -> Snapshot:
        images = self._commit_all(path.with_suffix(".json"))  # all at one frozen instant
        main = images.pop(MAIN, "")
        env, host = self.env, self._engine()
        archive: Path | None = None
        try:
            if quiet:
                self._kill_processes()  # nothing changes the workspace while it is packed
            snapshot.records_folder(path)  # private, owner-checked
            archive = self._pack_workdir_file(path.parent, None, snapshot_limit())
            saved = snapshot.save(
                archive,
                *(env.name, env.digest, path, main, host, self.name),
                services=images,
                source=snapshot.source_of(env),
                suspended=True,
                owner={} if keep else snapshot.this_process(),
                memory=memory,
            )
        except BaseException:  # the images made go again (the environment runs on; with
            # memory, it is started again from its image first, which _save_whole removes)
            with contextlib.suppress(OSError, OrchestratorError):  # the first error is the news
                made = snapshot.Snapshot(path, "", "", "", 0, main, host, self.name, images)
                made.remove(memory=False)
            raise
        finally:
            if archive is not None:
                archive.unlink(missing_ok=True)  # (moved into place unless that failed)
        return saved

    def _commit_all(self, record: Path) -> dict[str, str]:
        """Save every container's filesystem (by service, "main" too) as images owned by
        `record`, at one instant; the default (no container filesystem): none."""
        return {}

    def _other_file(self, snap: Snapshot) -> None:
        """Say so when `snap` was taken from another version of the file."""
        if snap.digest != self.env.digest:
            self.warnings.append(
                f"snapshot {snap.name} was taken from {snap.env!r} as another file; resumed anyway"
            )

    def _restore(self, snap: Snapshot) -> None:
        self._other_file(snap)
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
        target, deadline = self._path(self.workdir), file_deadline(None)
        argv = files.replace_argv(target)
        cmd = self._command(argv, None, b"", None, self._reset_user, deadline)
        cmd = dataclasses.replace(cmd, stdin=baseline)
        stream = baseline if isinstance(baseline, ArchiveStream) else None
        _, err, outcome = self._collect(cmd, 64 * 1024, bulk=stream is not None)
        stderr = decode(err.value())
        raise_held(outcome, stderr, target, "reset", deadline)
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
        phases = self._setup_egress()
        if phases is None:
            self._run_setup_commands(commands)
            return
        phase, run = phases
        self._apply_egress(phase)  # setup's own egress, for its commands only
        try:
            self._run_setup_commands(commands)
        except BaseException:
            with contextlib.suppress(Exception):  # (it is removed anyway: spawn's cleanup)
                self._apply_egress(run)
            raise
        self._apply_egress(run)  # the sandbox's: what setup left open through the gateway cut

    def _run_setup_commands(self, commands: list[str]) -> None:
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
