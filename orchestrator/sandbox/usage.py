"""What an environment cost: each service's readings of the kernel's own accounting (the
cgroup its engine made for the container: CPU time, memory now and at its peak, processes),
integrated over time by a `Meter` (memory in GB-seconds, the highest process count seen),
and the commands run through this object with their total time.

Nothing here is on a command's path: a command adds one count and one duration to its
place's `Tally` (under a lock held for an addition); the readings are taken by one
process-wide sampler thread every ORCHESTRATOR_USAGE_EVERY seconds for every live meter, by
`Runtime.usage()`, and a last time when the environment is removed. A backend answers
`Lifecycle._read_usage`; one that cannot read its sandboxes' accounting (the local backend,
an engine on another machine) answers nothing, and the result says `measured=False`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from orchestrator.errors import OrchestratorError
from orchestrator.settings import USAGE_EVERY

log = logging.getLogger("orchestrator.usage")


@dataclass(frozen=True)
class Reading:
    """One look at a container's accounting, as the kernel keeps it."""

    cpu_ns: int
    """CPU time of every process it ran, since it started."""
    memory: int
    """Bytes charged to it now (what its memory limit counts against)."""
    memory_peak: int | None
    """The kernel's high-water mark of `memory`; None where it keeps none."""
    pids: int
    """Processes (and threads) now."""
    pids_peak: int | None = None
    """The kernel's high-water mark of `pids`; None where it keeps none (cgroup v1)."""


@dataclass(frozen=True)
class ServiceUsage:
    """What one service (or, in `Usage.total`, all of them) cost so far."""

    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    """Memory charged at the last reading."""
    memory_peak_bytes: int = 0
    """The highest memory charged: the kernel's own mark, or the highest reading."""
    memory_gb_seconds: float = 0.0
    """Memory over time, in GB (10^9 bytes) x seconds, between the readings taken since this
    object started watching (trapezoids between readings ORCHESTRATOR_USAGE_EVERY apart)."""
    pids: int = 0
    pids_peak: int = 0
    """The highest process count: the kernel's mark where it keeps one (cgroup v2), else
    the highest count a reading saw."""
    commands: int = 0
    """Commands run through this object (execute, stream, start; setup's included)."""
    command_seconds: float = 0.0
    """Their total wall time."""


@dataclass(frozen=True)
class Egress:
    """What went through an environment's egress gateway (an allowlist's): requests."""

    allowed: int = 0
    """Requests (HTTP, or CONNECT tunnels) that went out."""
    denied: int = 0
    """Requests the gateway refused (not allowed, or not a request it serves)."""
    bytes_sent: int = 0
    """Bytes the sandboxes sent out on them (a tunnel's whole upload)."""
    bytes_received: int = 0
    """Bytes they got back (a tunnel's whole download)."""
    complete: bool = True
    """False when the gateway's log lost lines before they were read (it keeps 16 MB, about
    200,000 requests, between two readings), or a read stopped before its end (too much
    to read at once: the rest is read next time)."""


@dataclass(frozen=True)
class Usage:
    """`rt.usage()`: per service (the main sandbox is "main") and in total."""

    services: Mapping[str, ServiceUsage]
    total: ServiceUsage
    seconds: float
    """How long this object has watched the environment (the span of memory_gb_seconds)."""
    measured: bool
    """Whether the sandboxes' own accounting was read (False: the backend cannot, e.g. the
    local backend or an engine on another machine: commands alone are counted)."""
    final: bool = False
    """The last reading, taken as the environment was removed (what usage() returns after
    cleanup())."""
    egress: Egress | None = None
    """Through the egress gateway; None where there is none (`egress: none` or `all`: nothing
    to count, or to let out) or the backend counts none."""
    workspace_bytes: int | None = None
    """The bytes of the files in the workspace at the reading; None where it is not a folder
    of this machine, or too large to add up quickly (over WORKSPACE_ENTRIES entries or
    WORKSPACE_SECONDS)."""


class Tally:
    """The commands run in one place and their total time."""

    __slots__ = ("_lock", "commands", "seconds")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commands = 0
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.commands += 1
            self.seconds += seconds


@dataclass
class _Track:
    """One service's readings over time."""

    last: Reading
    at: float
    gb_seconds: float = 0.0
    memory_peak: int = 0
    pids_peak: int = 0

    def take(self, reading: Reading, now: float) -> None:
        span = max(0.0, now - self.at)
        self.gb_seconds += (self.last.memory + reading.memory) / 2 * span / 1e9
        self.last, self.at = reading, now
        self.see(reading)

    def see(self, reading: Reading) -> None:
        self.memory_peak = max(self.memory_peak, reading.memory, reading.memory_peak or 0)
        self.pids_peak = max(self.pids_peak, reading.pids, reading.pids_peak or 0)


@dataclass(eq=False)
class Meter:
    """One environment's usage over time (see the module). `read` answers each service's
    reading now (none for a service it cannot read)."""

    read: Callable[[], Mapping[str, Reading]]
    count: Callable[[], Egress | None] = lambda: None
    """The egress counts now (a read of the gateway's log: on demand, never sampled)."""
    workspace: Callable[[], Path | None] = lambda: None
    """The workspace's folder on this machine (added up on demand, never sampled)."""
    held: Callable[[], bool] = lambda: False
    """Whether the gateway holds requests open now (or cannot say): asked at the last
    reading only, as it goes, when what it holds will never be counted."""
    clock: Callable[[], float] = time.monotonic
    started: float = field(default_factory=time.monotonic)
    _tracks: dict[str, _Track] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _final: float | None = None
    _egress: Egress | None = None
    _recount_owed = False
    """Whether the last reading left what the gateway holds to a recount that has not come
    (yet, or ever: a removal that failed first): its count says it is short until then."""
    _workspace_bytes: int | None = None
    _asked = False
    """Whether anyone asked (`usage()`): only then does the last reading read the egress log
    and add up the workspace too (a cleanup nobody reads the usage of stays as cheap)."""

    def sample(self) -> None:
        """Take every service's reading now (nothing once the last was taken)."""
        if self._final is not None:
            return
        readings = self.read()
        now = self.clock()
        with self._lock:
            if self._final is not None:
                return
            for name, reading in readings.items():
                track = self._tracks.get(name)
                if track is None:
                    self._tracks[name] = track = _Track(reading, now)
                    track.see(reading)
                else:
                    track.take(reading, now)

    def finish(self, recounted: bool = False) -> None:
        """The last reading, as the environment goes: later calls change nothing.
        `recounted`: its egress is counted again as it goes (`recount`), which asks what
        the gateway holds then: not asked here too, and the count says it is short until
        that recount comes (a removal that fails before it never brings it)."""
        if self._final is not None:
            return
        try:
            self.sample()
            if self._asked:
                self._recount_owed = recounted  # (first: a reading meanwhile says short)
                self.counted(last=not recounted)
        except Exception as exc:  # (the environment may be half gone: what was read stands)
            log.debug("the last usage reading failed: %s", exc)
        with self._lock:
            self._final = self._final or self.clock()

    def counted(self, *, last: bool = False) -> None:
        """Read the egress counts now (nothing once the last reading was taken). `last`: the
        last reading, as the environment goes: a request still open then is never logged,
        so a count that was whole says it is short if the gateway holds any."""
        if self._final is None:
            got = self.count()
            if last and got is not None and got.complete and self.held():
                got = replace(got, complete=False)
            folder = self.workspace()
            size = folder_bytes(folder) if folder is not None else None
            with self._lock:
                if self._final is None:
                    self._egress, self._workspace_bytes = got, size

    @property
    def asked(self) -> bool:
        """Whether anyone read the usage (then the last reading counts egress)."""
        return self._asked

    def recount(self, held: bool) -> None:
        """The egress counts read again after the last reading, once nothing of the
        environment but its gateway is left (nothing can begin after it, and what ended
        before is logged by then): they replace the last reading's. `held`: the gateway
        still holds requests open (or cannot say): then they say they are short."""
        got = self.count()
        if got is not None and got.complete and held:
            got = replace(got, complete=False)
        with self._lock:
            self._egress, self._recount_owed = got, False

    def _short_while_owed(self) -> Egress | None:
        """The egress counts, said short while a recount is owed (see `finish`)."""
        got = self._egress
        if got is not None and got.complete and self._recount_owed:
            return replace(got, complete=False)
        return got

    def usage(self, tallies: Mapping[str, Tally]) -> Usage:
        """What was read so far, with the commands of each place in `tallies`."""
        self._asked = True
        with self._lock:
            end = self._final if self._final is not None else self.clock()
            names = sorted(set(self._tracks) | set(tallies), key=lambda n: (n != "main", n))
            services = {name: _service(self._tracks.get(name), tallies.get(name)) for name in names}
            measured = bool(self._tracks)
            final = self._final is not None
            egress = self._short_while_owed()
        return Usage(
            services=services,
            total=_sum(list(services.values())),
            seconds=max(0.0, end - self.started),
            measured=measured,
            final=final,
            egress=egress,
            workspace_bytes=self._workspace_bytes,
        )


WORKSPACE_ENTRIES = 100_000
WORKSPACE_SECONDS = 1.0


def folder_bytes(folder: Path) -> int | None:
    """The bytes of the regular files under `folder` (links not followed, nothing opened);
    None past WORKSPACE_ENTRIES entries or WORKSPACE_SECONDS, or when it cannot be read."""
    total, seen = 0, 0
    deadline = time.monotonic() + WORKSPACE_SECONDS
    pending = [str(folder)]
    while pending:
        try:
            with os.scandir(pending.pop()) as found:
                for entry in found:
                    seen += 1
                    if seen > WORKSPACE_ENTRIES or time.monotonic() > deadline:
                        return None
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(entry.path)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
        except OSError:
            if not pending and seen == 0:
                return None  # (the folder itself: gone, or not ours to read)
    return total


def _service(track: _Track | None, tally: Tally | None) -> ServiceUsage:
    commands = (tally.commands, tally.seconds) if tally is not None else (0, 0.0)
    if track is None:
        return ServiceUsage(commands=commands[0], command_seconds=commands[1])
    return ServiceUsage(
        cpu_seconds=track.last.cpu_ns / 1e9,
        memory_bytes=track.last.memory,
        memory_peak_bytes=track.memory_peak,
        memory_gb_seconds=track.gb_seconds,
        pids=track.last.pids,
        pids_peak=track.pids_peak,
        commands=commands[0],
        command_seconds=commands[1],
    )


def _sum(parts: list[ServiceUsage]) -> ServiceUsage:
    """The services together: each field summed (the peaks too: an upper bound, they need
    not have peaked at once)."""
    return ServiceUsage(
        **{f.name: sum(getattr(p, f.name) for p in parts) for f in fields(ServiceUsage)}
    )


# ----- the one sampler thread of this process ---------------------------------------------------
_meters: weakref.WeakSet[Meter] = weakref.WeakSet()
_sampler_lock = threading.Lock()
_sampler: threading.Thread | None = None
_wake = threading.Event()
"""Set by `watch`: the sampler reads ORCHESTRATOR_USAGE_EVERY again (a change counts at once)."""


def watch(meter: Meter) -> None:
    """Sample `meter` every ORCHESTRATOR_USAGE_EVERY seconds until its last reading (or until
    nothing holds it)."""
    global _sampler
    USAGE_EVERY.get()  # a bad value is the caller's error, here, not a silent thread's
    with _sampler_lock:
        _meters.add(meter)
        if _sampler is None or not _sampler.is_alive():
            _sampler = threading.Thread(target=_sample_all, name="orchestrator-usage", daemon=True)
            _sampler.start()
        else:
            _wake.set()


def _sample_all() -> None:
    global _sampler
    every = USAGE_EVERY.get()
    while True:
        if _wake.wait(every):
            _wake.clear()
        with contextlib.suppress(OrchestratorError):  # (a bad value meanwhile: the last good)
            every = USAGE_EVERY.get()
        with _sampler_lock:
            for done in [m for m in list(_meters) if m._final is not None]:
                _meters.discard(done)
            meters = list(_meters)
            if not meters:  # (watch starts another when one comes)
                _sampler = None
                return
        for meter in meters:
            try:
                meter.sample()
            except Exception as exc:  # one environment's failure is not the others'
                log.debug("a usage reading failed: %s", exc)
        del meters, meter  # (held while it waits, they would keep a dropped runtime alive)
