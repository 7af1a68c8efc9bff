"""A live environment's life, written once over a backend's primitives: cleanup, kill, poll,
pause and resume, keep and detach, and the checks every call makes (closed, killed, paused,
used from a forked child). `Runtime` (sandbox/base.py) adds how one starts and its saved
states; its class hooks are `Backend`'s (sandbox/backend.py)."""

from __future__ import annotations

import os
import threading
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, Self

from orchestrator.errors import RuntimeClosed, SandboxPaused, UsageError
from orchestrator.sandbox.backend import Backend
from orchestrator.sandbox.calls import Sandbox
from orchestrator.sandbox.options import SpawnOptions
from orchestrator.sandbox.results import RuntimeInfo, RuntimeResult
from orchestrator.sandbox.usage import Egress, Meter, Reading, Usage
from orchestrator.spec import egress as egress_rules
from orchestrator.spec.loader import Environment
from orchestrator.spec.resolve import MAIN, substitute_static


class Hold(Protocol):
    """An environment's hold on the host's budget (services/admission.py gives one to a
    spawn): anchored, once it is up, to the folder that stands for it beyond this process;
    released when it is removed."""

    def anchor(self, folder: Path | None) -> None: ...

    def release(self) -> None: ...


class Lifecycle(Sandbox, Backend):
    """A live environment (see `Runtime`, which is what backends derive from)."""

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
        self._meter = Meter(
            self._read_usage, self._count_egress, self._host_workspace, self._egress_held
        )

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

    def _read_usage(self) -> Mapping[str, Reading]:
        """Each service's reading of its sandbox's accounting now, by name ("main" for the
        sandbox; sandbox/usage.py); none for what the backend cannot read (the default)."""
        return {}

    def _count_egress(self) -> Egress | None:
        """What went through the environment's egress gateway so far; None where it has
        none, or the backend counts none (the default)."""
        return None

    def _egress_held(self) -> bool:
        """Whether the egress gateway holds requests open now, or cannot say (the default:
        none)."""
        return False

    def _recounts_egress(self) -> bool:
        """Whether the removal counts the egress again (Meter.recount), once only the gateway
        is left: then the last reading need not ask what it holds (the default: no)."""
        return False

    def _host_workspace(self) -> Path | None:
        """The workspace's folder on this machine, for `usage()` (None: it has none)."""
        return None

    def _places(self) -> Mapping[str, Sandbox]:
        """Where commands ran through this object, by service name: the sandbox itself, and
        each service a backend made a view of."""
        return {MAIN: self}

    def usage(self) -> Usage:
        """What the environment cost so far, per service and in total: CPU time, memory
        (now, at its peak, and over time in GB-seconds), processes, and the commands run
        through this object (sandbox/usage.py). After cleanup() (or detach()), the last
        reading, taken as it went."""
        if not self._closed and not self._in_child():
            self._meter.sample()
            self._meter.counted()
        return self._meter.usage({name: place.tally for name, place in self._places().items()})

    # ----- egress (a backend provides _apply_egress) ---------------------------------------
    def set_egress(self, egress: str | Sequence[str]) -> str:
        """Change what the environment may reach outside it, from now on: "none", "all" or
        a list of allowlist entries, as `network.egress` takes them, narrowed by the policy
        of the process that calls it (each entry it drops is a warning in `warnings`). It
        holds for new connections before this returns; when it takes something away,
        requests and tunnels open at that moment are cut. It applies to every container that
        reaches outside through the environment's egress gateway (the sandbox, and services
        with an allowlist), for the environment's life (a woken or forked copy starts from
        its file); a service with `egress: all` keeps its own way out (a warning says so).
        Also while the environment is paused. Returns what now holds, as one line ("none",
        "all" or the entries). UsageError for a bad entry, or where the environment has no
        egress gateway (docs/network.md, "Egress by phase")."""
        self._check_usable_unpaused()
        try:
            asked = egress_rules.parse(egress)
        except ValueError as exc:
            raise UsageError(f"set_egress: {exc}") from None
        got, notes = self.options.policy.narrow_egress(asked)
        notes += self._apply_egress(got)
        self.warnings += [w for w in (f"set_egress: {n}" for n in notes) if w not in self.warnings]
        return egress_rules.describe(got)

    def _apply_egress(self, egress: egress_rules.Egress) -> list[str]:
        """Make the environment's egress gateway let through `egress` from now on, cutting
        what it had open when that takes anything away; what the caller should know of
        it (what it does not change)."""
        raise UsageError(
            f"the {self.name} backend cannot change a running environment's egress: it has "
            "no egress gateway (use the docker backend)"
        )

    def _setup_egress(self) -> tuple[egress_rules.Egress, egress_rules.Egress] | None:
        """What setup may reach, and the sandbox after it, when the file gives setup egress
        of its own that differs from the sandbox's (None: setup runs under network.egress)."""
        policy = self.options.policy
        setup, _ = policy.setup_egress_of(self.env.spec)
        run, _ = policy.egress_of(self.env.spec, MAIN)
        return None if setup is None or setup == run else (setup, run)

    def file_command(self, name: str) -> str:
        """The environment file's `commands.NAME`, its `{{static:...}}` resolved here."""
        try:
            text = self.env.spec.commands[name]
        except KeyError:
            known = ", ".join(sorted(self.env.spec.commands)) or "none"
            raise UsageError(f"no command named {name!r} in the file (known: {known})") from None
        return substitute_static(text, self.static_path)

    #: Found running by `orchestrator.attach`: leaving a `with` block leaves it running.
    attached: bool = False
    #: This environment's hold on the host's budget (None: not admitted; see Runtime.spawn).
    _hold: Hold | None = None

    def __enter__(self) -> Self:
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
        self._meter.finish(recounted=self._recounts_egress())
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
            if self._hold is not None:
                self._hold.release()

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
        self._meter.finish()
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
