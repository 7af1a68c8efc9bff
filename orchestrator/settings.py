"""Settings read from `ORCHESTRATOR_*` environment variables: one parser each, so a bad value
is a UsageError naming the variable, never a bare int()/float() error from deep inside, and
never ignored (a flag that is neither on nor off is refused, not read as off).

Kept by hand rather than on pydantic-settings: each variable is read when it is used, so a
bad value fails only what needs it and a variable set at run time (the CLI's `--host`, a
test's monkeypatch) counts at once, where a BaseSettings model reads and validates every
variable together on each instantiation (or keeps a stale copy); the parsers here are a few
lines, a model would not be smaller once it is told to be case-sensitive, to read "" as
unset, to split comma lists rather than parse JSON, and to turn its ValidationError into
these messages; and it would put two packages (pydantic-settings, python-dotenv, about 35 ms)
on the import path of every library session."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from typing import TypeVar

from orchestrator.errors import UsageError

T = TypeVar("T")

FILE_TIMEOUT_ENV = "ORCHESTRATOR_FILE_TIMEOUT"


def _read(name: str, parse: Callable[[str], T], valid: Callable[[T], bool], want: str) -> T | None:
    """The variable parsed, None when unset or empty; a UsageError naming it when invalid."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise UsageError(f"{name} must be {want}, got {raw!r}")
    return value


def number(name: str, default: float, *, unit: str = "seconds") -> float:
    """A positive number (`unit` only words the error)."""
    value = _read(name, float, lambda v: 0 < v < float("inf"), f"a positive number of {unit}")
    return default if value is None else value


def whole(name: str, default: int, *, unit: str = "bytes", low: int = 1, high: int = 2**63) -> int:
    """A whole number between `low` and `high`."""
    want = f"a whole number of {unit} ({low} to {high})"
    value = _read(name, int, lambda v: low <= v <= high, want)
    return default if value is None else value


def amount(name: str, default: float, *, unit: str) -> float:
    """A number that may be 0 (`unit` only words the error)."""
    value = _read(name, float, lambda v: 0 <= v < float("inf"), f"0 or a positive number of {unit}")
    return default if value is None else value


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _size(raw: str) -> int:
    unit = raw[-1].lower() if raw[-1].isalpha() else ""
    if unit not in _SIZE_UNITS:
        raise ValueError(raw)
    value = float(raw[: -1 if unit else None]) * _SIZE_UNITS[unit]
    if not 0 <= value < 2**63:  # also inf and nan
        raise ValueError(raw)
    return int(value)


def size(name: str, default: int) -> int:
    """A positive size in bytes, written as 512m, 2g, 1.5G or 1048576."""
    value = _read(name, _size, lambda v: 0 < v < 2**63, "a size like 512m, 16g or 1048576")
    return default if value is None else value


def network(name: str, default: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    value = _read(name, ipaddress.ip_network, lambda _: True, "a network like 10.213.0.0/16")
    return ipaddress.ip_network(default) if value is None else value


def choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _read(name, str, lambda v: v in choices, f"one of {', '.join(choices)}")
    return default if value is None else value


FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")


GUARDIAN_ENV = "ORCHESTRATOR_GUARDIAN"
"""0: no guardian removes what an owner process leaves when it dies (a reaper still does, for
the container backends; nothing does for the local backend's processes)."""


def flag(name: str, default: bool) -> bool:
    """On or off: 1, true, yes, on or 0, false, no, off (any case)."""
    want = f"one of {', '.join(FLAG_ON)} (on) or {', '.join(FLAG_OFF)} (off)"
    value = _read(name, str.lower, lambda v: v in FLAG_ON + FLAG_OFF, want)
    return default if value is None else value in FLAG_ON


def file_timeout() -> float:
    """Seconds a file call may take when the call gives no `timeout=`."""
    return number(FILE_TIMEOUT_ENV, 600.0)


ENGINE_ENV = "ORCHESTRATOR_ENGINE"
ENGINES = ("docker", "podman")
"""The engines an environment may run on, by name (ORCHESTRATOR_ENGINE, or `--host podman`):
docker is the process's Docker engine; podman is Podman through its Docker-compatible API."""


def podman_socket() -> str:
    """Podman's API socket: the system one for root, the user's own (rootless) for anyone
    else, where `podman system service` listens by default."""
    uid = os.geteuid()
    if uid == 0:
        return "unix:///run/podman/podman.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip() or f"/run/user/{uid}"
    return f"unix://{runtime}/podman/podman.sock"


def engine_address(host: str) -> str:
    """An engine as a caller names it: `podman` is Podman's socket (podman_socket); any
    other value is an address as `docker --host` takes it."""
    return podman_socket() if host.strip() == "podman" else host


def named_engine() -> str:
    """The address of ORCHESTRATOR_ENGINE's engine: "" for docker (the process's)."""
    return podman_socket() if choice(ENGINE_ENV, "docker", ENGINES) == "podman" else ""


DOCKER_HOST_ENV = "ORCHESTRATOR_DOCKER_HOST"
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
"""The address the docker CLI's default context reaches."""


def same_engine(a: str, b: str) -> bool:
    """Whether two engine addresses name one engine ("": the docker CLI's default)."""
    return (a or DEFAULT_ENGINE) == (b or DEFAULT_ENGINE)


_engines_named: set[str] = set()
"""Engines a spawn of this process named (`spawn_runtime(..., host=…)`)."""


def engine_named(host: str) -> None:
    """Remember that this process works with the engine at `host` (a spawn named it)."""
    if host:
        _engines_named.add(host)


def may_reach(host: str) -> bool:
    """Whether an engine address read from a file (a snapshot's record) may be reached by
    this process: its own engine, or one a spawn of this process named. Another address
    (`ssh://…` runs ssh, `tcp://…` connects out, `unix://…` any listener's socket) is
    reached only when the caller names it (`-H ADDRESS`, ORCHESTRATOR_DOCKER_HOST): a record
    is a file, and may have been written by anyone who could write beside its archive."""
    return same_engine(host, engine_host()) or host in _engines_named


def engine_host() -> str:
    """The engine this process works with: ORCHESTRATOR_DOCKER_HOST (an address, or
    `podman`), else ORCHESTRATOR_ENGINE's (podman: Podman's socket), else DOCKER_HOST,
    else "" for the docker CLI's default."""
    if chosen := os.environ.get(DOCKER_HOST_ENV, "").strip():
        return engine_address(chosen)
    return named_engine() or os.environ.get("DOCKER_HOST", "").strip()
