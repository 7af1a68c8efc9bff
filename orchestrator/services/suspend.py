"""Wake what was suspended to disk: `Runtime.suspend` saves a whole environment (the workspace
archive, and on a container backend each container's filesystem as an image, services
too) as a snapshot record, then removes the environment; `wake` starts it again from that
record under a new id, running `setup.resume_commands`.

Running processes are not kept: a woken environment starts its services' commands anew on
their saved files (as after a power cut: a database recovers from its own files).

Who owns a suspended environment: by default nobody (it is meant to be woken later, by
another process: it stays until woken or removed). `suspend(keep=False)` makes the
suspending process its owner: once that process is gone (SIGKILL included), its guardian
or the next reaper removes the record and the images the record owns."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from orchestrator import procutil, settings
from orchestrator.errors import OrchestratorError, PolicyError, UsageError
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.registry import get_runtime_class, runtime_names
from orchestrator.sandbox.snapshot import Snapshot, remove_files
from orchestrator.services.spawn import spawn_runtime
from orchestrator.spec.loader import Environment, load_environment
from orchestrator.spec.models import Mount, PortMap
from orchestrator.spec.policy import UNISOLATED_ENV, Policy


def wake(
    ref: str | Path,
    *,
    env: Environment | str | Path | None = None,
    keep_record: bool = False,
    backend: str | None = None,
    host: str | None = None,
    workspace: str | Path | None = None,
    mounts: Sequence[Mount | Mapping[str, object] | str] | None = None,
    ports: Sequence[PortMap | Mapping[str, object] | int] | None = None,
    env_vars: Mapping[str, str] | None = None,
    policy: Policy | None = None,
    detached: bool = False,
) -> Runtime:
    """Start a suspended environment again (`Runtime.suspend`; `ref`: its name or its
    record's path) under a new id: its services from their saved filesystems, its ports
    and networks as its file says, its workspace restored, then `setup.resume_commands`.
    The record is removed once it is up (its images go with the woken environment), unless
    `keep_record` (wake it again later: each wake is a copy). What the suspended runtime's
    caller gave at spawn (`mounts`, `ports`, `env_vars`, `workspace`) is not saved: give it
    again. `env`: the file to wake it with (default: the one it was suspended from, which
    must be unchanged). Raises UsageError for a record that cannot be woken here."""
    snap = Snapshot.find(ref)
    policy = policy or Policy.from_env()
    env, backend = _wake_target(snap, env, backend, host, policy)
    rt = spawn_runtime(
        env,
        workspace=workspace,
        mounts=mounts,
        ports=ports,
        env_vars=env_vars,
        resume=snap,
        backend=backend,
        policy=policy,
        detached=detached,
        host=host,
    )
    if not keep_record:
        consume(snap)
    return rt


FORKS = 64
"""Copies one `fork` makes at most."""
SIDE_BY_SIDE = 4
"""Copies one `fork` starts at once."""


def fork(
    rt: Runtime, n: int = 1, *, detached: bool = False, memory: bool | None = None
) -> list[Runtime]:
    """`n` new environments made from the running `rt` as it is now (`rt.checkpoint()`,
    woken `n` times: see `wake`), each under its own id with its own networks, published
    ports and workspace, and its services resolving to its own. With memory (a gVisor
    sandbox with no network: `rt.memory_refusal()` is None), each copy's processes run on
    from that instant, independently, and no setup command runs; else a process running in
    `rt` does not in a copy, which ran `setup.resume_commands`. `memory`: None (default)
    carries it where it can, and says in each copy's warnings when it could not; True
    refuses (UsageError) where it cannot; False copies files only. `rt` runs on (with
    memory, it stands still for the instant it is saved). The caller's mounts and variables
    given at its spawn go to each copy; its caller-published ports do not (each publishes
    the file's own). Each copy is admitted as any spawn is. `detached`: the copies outlive
    this process (as `up`'s). The record goes once the copies are up (its images with the
    last of them); if one fails to start, those made are removed and the error raised."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= FORKS:
        raise UsageError(f"n must be a whole number from 1 to {FORKS}, not {n!r}")
    why = None if memory is False else rt.memory_refusal()
    if memory and why is not None:
        raise UsageError(f"{rt.env.name}: no fork with memory: {why}")
    carried = memory is not False and why is None

    def one(saved: Snapshot) -> Runtime:
        return wake(
            saved.path,
            env=rt.env,
            keep_record=True,
            backend=rt.name,
            host=rt.options.host or saved.host,  # the engine it runs on
            mounts=list(rt.options.mounts),
            env_vars=dict(rt.options.env_vars),
            policy=rt.options.policy,
            detached=detached,
        )

    # side by side: a copy is mostly waiting on the engine (its start, its restore); they
    # begin as soon as the record is whole, while the original starts again from it
    pool = ThreadPoolExecutor(min(n, SIDE_BY_SIDE), thread_name_prefix="orchestrator-fork")
    given_up = _GivenUp()
    futures: list[Future[Runtime]] = []
    records: list[Snapshot] = []

    def begin(saved: Snapshot) -> None:  # (the record is in `records` already: ours)
        futures.extend(pool.submit(given_up.kept, lambda: one(saved)) for _ in range(n))

    failed = True

    def end() -> None:
        """The copies gone if the fork failed, then no copy reading the record any more,
        then the record: kept whole by a thread of its own, which a second Ctrl-C in the
        caller does not stop (the process waits for it at its exit)."""
        if failed:
            given_up.remove_all()  # those made, and those still starting once they are up
        pool.shutdown(wait=True)  # no copy reads the record any more
        for saved in records:
            if not failed:
                consume(saved)  # (its images go with the last copy)
                continue
            with contextlib.suppress(OSError, OrchestratorError):  # the first error is news
                saved.remove()  # no copy runs: its images too

    try:
        # this process's: its death leaves it to the reaper
        rt._save_whole(
            None, keep=False, quiet=False, memory=carried, meanwhile=begin, handed=records
        )
        made = [f.result() for f in futures]
        failed = False
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    finally:
        with procutil.deferred():  # (a Ctrl-C before it started would skip the end: held till then)
            ender = threading.Thread(target=end, name="orchestrator-fork-end")
            ender.start()
        ender.join()
    if memory is None and why is not None:
        for copy in made:
            copy.warnings.append(
                f"{copy.env.name}: a copy of the files only, whose processes started anew "
                f"(no memory carried: {why})"
            )
    return made


class _GivenUp:
    """The copies a fork has made, which all go if it is given up: those made by then at
    once, each in a thread of its own that a second Ctrl-C in the caller does not stop, and
    those still starting by the thread that started them, once they are up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: list[Runtime] = []
        self._gone = False

    def kept(self, start: Callable[[], Runtime]) -> Runtime:
        copy = start()
        with self._lock:
            if not self._gone:
                self._made.append(copy)
                return copy
        _remove(copy)
        raise OrchestratorError("the fork was given up: this copy is removed")

    def remove_all(self) -> None:
        with self._lock:
            self._gone, made = True, list(self._made)
        removers = [threading.Thread(target=_remove, args=(c,), name="orch-fork") for c in made]
        for remover in removers:
            remover.start()
        for remover in removers:
            remover.join()


def _remove(copy: Runtime) -> None:
    with contextlib.suppress(Exception):  # (each goes whatever the others do)
        copy.cleanup()


def _wake_target(
    snap: Snapshot,
    env: Environment | str | Path | None,
    backend: str | None,
    host: str | None,
    policy: Policy,
) -> tuple[Environment | str | Path, str | None]:
    """The environment file to wake `snap` with (the caller's `env`, else the file it was
    suspended from, which must be unchanged) and the backend (the caller's, else the one
    that suspended it). The record is input: a backend it names that runs unisolated is
    refused unless the policy allows it, and an engine it names is never reached unless
    the caller names it too."""
    named = settings.engine_address(host) if host else settings.engine_host()
    if snap.host and not settings.same_engine(named, snap.host):
        raise UsageError(
            f"{snap.name}: its images are on the engine at {snap.host}; wake it there "
            f"(wake(..., host={snap.host!r}) / orchestrator -H {snap.host} wake)"
        )
    if env is None:
        if not snap.source:
            what = "was suspended from text" if snap.suspended else "is a snapshot"
            raise UsageError(
                f"{snap.name} {what}: its record names no environment file; pass the file "
                "(wake(name, env=...))"
            )
        env = load_environment(Path(snap.source), backends=runtime_names)
        if env.digest != snap.digest:
            raise UsageError(
                f"{snap.name}: its file {snap.source} changed since it was suspended; pass "
                "the file to wake it with (wake(name, env=...)) to accept the change"
            )
    if backend is None and snap.backend:
        cls = get_runtime_class(snap.backend)
        if not cls.isolated and not policy.allow_unisolated:
            raise PolicyError(
                f"{snap.name} was suspended on backend {snap.backend!r}, which runs commands "
                f"unisolated on this host; a record may not choose that alone: pass "
                f"backend={snap.backend!r}, or allow it with Policy(allow_unisolated=True) / "
                f"{UNISOLATED_ENV}=1"
            )
        backend = snap.backend
    return env, backend


def consume(snap: Snapshot) -> None:
    """The record of a woken environment goes (its images go with the environment)."""
    snap.path.unlink(missing_ok=True)
    snap.record.unlink(missing_ok=True)
    remove_files(snap.memory_folder)
