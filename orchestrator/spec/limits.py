"""The limits a container gets when its file names none: a file that says nothing about
`resources` never runs unbounded (no memory ceiling, no process ceiling: a fork bomb that
fills the host's pid table), and admission (services/admission.py) counts what was applied.

The defaults, each the caller's to change (never the file's):
- memory 1g (ORCHESTRATOR_DEFAULT_MEMORY): room for a test suite, a package install or a
  build in one container, while 18 such containers fit the 75% admission budget of a 24 GiB
  host; past it the kernel kills the container's largest process (reported as out of
  memory) instead of the host swapping or killing something else;
- cpus 1.0 (ORCHESTRATOR_DEFAULT_CPUS): one core, so one busy sandbox slows others only by
  its share; a ceiling on time, never a reservation (see admission's CPU budget);
- pids 1024 (ORCHESTRATOR_DEFAULT_PIDS): far above what a build or a parallel test run
  starts (a few hundred), far below a host's pid_max (32,768 by default): a fork or thread
  bomb stops at it, and 30 of them at once do not exhaust the host.

Backends apply them where they can (docs/security.md lists where they cannot)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator import settings
from orchestrator.errors import SpecIssue
from orchestrator.spec.models import MIN_MEMORY, EnvironmentV1, Resources, size_bytes

DEFAULT_MEMORY_ENV = settings.DEFAULT_MEMORY.name
MAX_PIDS_ENV = settings.MAX_PIDS.name


@dataclass(frozen=True)
class Limits:
    """What one container is held to, as numbers (what admission adds up)."""

    memory: int
    """Bytes."""
    cpus: float
    pids: int | None
    """None: not limited (a backend that cannot, such as Swarm on this engine)."""

    @classmethod
    def of(cls, r: Resources) -> Limits:
        """The limits of resources whose defaults are applied (see `applied`)."""
        full = applied(r)
        assert full.memory is not None and full.cpus is not None
        return cls(size_bytes(full.memory), full.cpus, full.pids)


def default_memory() -> int:
    memory = settings.DEFAULT_MEMORY.get()
    if memory < MIN_MEMORY:
        raise settings.DEFAULT_MEMORY.refused("at least 6m (the engine refuses less)")
    return memory


def default_cpus() -> float:
    return settings.DEFAULT_CPUS.get()


def default_pids() -> int:
    return settings.DEFAULT_PIDS.get()


def applied(r: Resources) -> Resources:
    """`r` with every limit it leaves out (memory, cpus, pids) set to the caller's default:
    what a container of a file that names none of them runs with."""
    return r.model_copy(
        update={
            "memory": r.memory or str(default_memory()),
            "cpus": r.cpus if r.cpus is not None else default_cpus(),
            "pids": r.pids if r.pids is not None else default_pids(),
        }
    )


def max_pids() -> int:
    return settings.MAX_PIDS.get()


def pids_issues(source: str, spec: EnvironmentV1) -> list[SpecIssue]:
    """Each container whose `resources.pids` is above the caller's ceiling (max_pids)."""
    ceiling = max_pids()
    parts = [("resources.pids", spec.resources)] + [
        (f"services.{n}.resources.pids", s.resources) for n, s in spec.services.items()
    ]
    return [
        SpecIssue(
            source,
            field=where,
            message=f"{r.pids} processes is above the most a file may ask for ({ceiling})",
            fix=f"ask for {ceiling} or fewer, or let the caller raise it: {MAX_PIDS_ENV}={r.pids}",
        )
        for where, r in parts
        if r.pids is not None and r.pids > ceiling
    ]
