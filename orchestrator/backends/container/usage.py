"""A container's accounting, read where its engine keeps it: the cgroup the engine made for
the container on this machine (the files `docker stats` reads too, without its second of
waiting for a CPU delta on engines whose stats API takes no `one-shot`). Found once per
container, from the host's view of its first process: `/proc/PID/cgroup`, where PID is the
one the engine's inspection names and `readiness.runs_here` holds to be that container's on
this kernel; each controller's folder is used only when its path names the container's id.
An engine on another machine or in a VM, or a cgroup layout not known here, reads nothing
(`rt.usage().measured` says so).

A sandbox cannot change what is read: the files are the host's (a container sees its own
cgroup files read-only, if at all), and the pid is the engine's answer, checked again
against the cgroup before it is trusted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import procutil
from orchestrator.backends.container.egress_log import EgressCount
from orchestrator.backends.container.layout import FORWARDER, GATEWAY, SANDBOX_MOUNT
from orchestrator.backends.container.readiness import runs_here
from orchestrator.errors import OrchestratorError
from orchestrator.paths import read_regular
from orchestrator.sandbox.usage import Egress, Meter, Reading, Usage
from orchestrator.spec.published import MAIN

ROOT = Path("/sys/fs/cgroup")
PROCS = 4096
"""Processes of a container looked at for what it runs now, at most."""
COMMAND_LIMIT = 512
"""Bytes of a command line shown."""
LIMIT = 64 * 1024
"""Bytes read of one accounting file at most (each holds a number or a few lines)."""


@dataclass(frozen=True)
class Cgroup:
    """The folders holding one container's accounting (None: that controller not found)."""

    cpu: Path | None
    memory: Path | None
    pids: Path | None
    unified: bool
    """cgroup v2 (one folder, its own file names) rather than v1's folder per controller."""
    first: int = 0
    """The host pid of the container's first process (never "what it runs")."""

    def newest_command(self) -> str:
        """The command line of the newest process it runs that is not ours (its first
        process, the executor and its helpers under SANDBOX_MOUNT): what it runs now; "" for
        none. At most PROCS processes are looked at; the text is the sandbox's own (print it
        as text only)."""
        folder = self.pids or self.memory
        raw = read_regular(folder / "cgroup.procs", LIMIT) if folder is not None else None
        newest: tuple[int, str] = (-1, "")
        for word in (raw or b"").split()[:PROCS]:
            pid = int(word) if word.isdigit() else 0
            if pid in (0, self.first):
                continue
            fields = procutil.stat_fields(pid)
            line = read_regular(Path(f"/proc/{pid}/cmdline"), COMMAND_LIMIT) or b""
            text = line[:COMMAND_LIMIT].replace(b"\0", b" ").decode(errors="replace").strip()
            if len(fields) > 19 and text and SANDBOX_MOUNT not in text:
                newest = max(newest, (int(fields[19]), text))
        return newest[1]

    def read(self) -> Reading | None:
        """The accounting now; None once its files are gone (the container was removed)."""
        if self.unified:
            cpu = _field(self.cpu, "cpu.stat", "usage_usec")
            cpu_ns = None if cpu is None else cpu * 1000
            memory, peak = _number(self.memory, "memory.current"), "memory.peak"
            pids_peak = _number(self.pids, "pids.peak")
        else:
            cpu_ns = _number(self.cpu, "cpuacct.usage")
            memory, peak = (
                _number(self.memory, "memory.usage_in_bytes"),
                "memory.max_usage_in_bytes",
            )
            pids_peak = None
        if cpu_ns is None or memory is None:
            return None
        return Reading(
            cpu_ns=cpu_ns,
            memory=memory,
            memory_peak=_number(self.memory, peak),
            pids=_number(self.pids, "pids.current") or 0,
            pids_peak=pids_peak,
        )


def cgroup_of(got: dict[str, Any] | None) -> Cgroup | None:
    """The cgroup of a container the engine inspected (its API's answer), when it runs on
    this machine's kernel and its folders are found; else None."""
    if not runs_here(got):
        return None
    assert got is not None
    cid, pid = str(got["Id"]), int(got["State"]["Pid"])
    raw = read_regular(Path(f"/proc/{pid}/cgroup"), LIMIT) or b""
    v1: dict[str, Path] = {}
    unified: Path | None = None
    for line in raw.decode(errors="replace").splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if cid not in path or ".." in path.split("/"):
            continue
        if not controllers:
            unified = ROOT / path.lstrip("/")
            continue
        for name in controllers.split(","):
            for mount in (controllers, name):  # mounted as "cpu,cpuacct" or as "cpuacct"
                folder = ROOT / mount / path.lstrip("/")
                if name not in v1 and folder.is_dir():
                    v1[name] = folder
    if "memory" in v1 and "cpuacct" in v1:
        return Cgroup(v1["cpuacct"], v1["memory"], v1.get("pids"), unified=False, first=pid)
    if unified is not None and (ROOT / "cgroup.controllers").is_file() and unified.is_dir():
        return Cgroup(unified, unified, unified, unified=True, first=pid)
    return None


def _number(folder: Path | None, name: str) -> int | None:
    raw = read_regular(folder / name, LIMIT) if folder is not None else None
    try:
        return int(raw.split()[0]) if raw else None
    except ValueError:  # ("max", or nothing a number)
        return None


def _field(folder: Path | None, name: str, key: str) -> int | None:
    """A `key value` line's value in a flat-keyed file (cgroup v2's cpu.stat)."""
    raw = read_regular(folder / name, LIMIT) if folder is not None else None
    for line in (raw or b"").decode(errors="replace").splitlines():
        found, _, value = line.partition(" ")
        if found == key and value.strip().isdigit():
            return int(value)
    return None


class Accounts:
    """The cgroups of one environment's containers, each found once (see the module)."""

    def __init__(self) -> None:
        self._found: dict[str, Cgroup | None] = {}

    def cgroup(self, container: str, engine: Any) -> Cgroup | None:
        """The container's cgroup on this machine (None: not found here, or the container
        is gone or not running yet: then looked for again next time)."""
        if container not in self._found:
            try:
                got = engine.inspected(container, "reading a container's usage")
            except OrchestratorError:  # (removed since it was listed: nothing to read)
                return None
            found = cgroup_of(got)
            if found is None and ((got or {}).get("State") or {}).get("Running") is not True:
                return None
            self._found[container] = found
        return self._found[container]

    def read(self, located: dict[str, tuple[str, Any]]) -> dict[str, Reading]:
        """Each service's reading, from `located` (service -> its container and engine);
        none for a container whose accounting is not found here."""
        readings = {}
        for service, (container, engine) in located.items():
            cgroup = self.cgroup(container, engine)
            reading = cgroup.read() if cgroup is not None else None
            if reading is not None:
                readings[service] = reading
            elif cgroup is not None:
                del self._found[container]  # gone: a container of that name is another
        return readings


_gateways: dict[str, EgressCount] = {}
"""In a process that lists environments again and again (`orchestrator top`): each gateway's
count, so that each listing reads only what its log gained since the last. Only the gateways
of the last listing are kept."""


def usage_of(engine: Any, containers: list[tuple[str, str, str]]) -> tuple[Usage, str]:
    """What one environment cost, from another process than its owner's (`orchestrator ps
    --usage`, `top`): one reading of each of its containers ((id, service, state), as the
    listing gives them), and its gateway's counts. Memory over time and commands are the
    owner's to count (`rt.usage()`): here they are 0. Second, what its main sandbox runs now
    (`Cgroup.newest_command`)."""
    accounts, located = Accounts(), {}
    egress: Egress | None = None
    for cid, service, state in containers:
        if service == GATEWAY:
            egress = _gateways.setdefault(cid, EgressCount()).read(engine, cid)
        elif service != FORWARDER and state in ("running", "paused"):
            located[service] = (cid, engine)
    readings = accounts.read(located)
    main = accounts.cgroup(*located[MAIN]) if MAIN in located else None
    command = main.newest_command() if main is not None else ""
    meter = Meter(read=lambda: readings, count=lambda: egress)
    meter.sample()
    meter.counted()
    return meter.usage({}), command


def keep_counts_of(gateways: set[str]) -> None:
    """Forget the counts of gateways not in `gateways` (their environments went)."""
    for cid in [c for c in _gateways if c not in gateways]:
        del _gateways[cid]
