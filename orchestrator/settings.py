"""Every `ORCHESTRATOR_*` setting, in one model (`CATALOG`): its name, type, default and doc,
read in one place (`Setting.get`, orchestrator/setting.py), from the first of three layers
with a value: a flag of the command line (the CLI passes its values on so, never through
os.environ), the environment variable, the default. `orchestrator config` shows each value
and where it came from; docs/settings.md is made from this model. A bad value is a
UsageError naming the variable (exit 2 at the CLI), never ignored (a flag neither on nor off
is refused, not read as off). Below them: the engine this process works with.

Our own parsers rather than pydantic-settings: each setting is read when it is used, so a
bad value fails only what needs it and a variable set at run time counts at once (a
BaseSettings model validates every variable together, or keeps a stale copy); it would not
be smaller once told to be case-sensitive, to read "" as unset, to split comma lists and to
word these errors; and it would add pydantic-settings and python-dotenv (about 35 ms) to
every library session's imports. The in-container executor (backends/container/executor/)
runs on the sandbox's Python without this package, and reads its own few variables."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from orchestrator.setting import Catalog, Setting, checked, items
from orchestrator.setting import child_environ as child_environ  # the flags' layer: set by
from orchestrator.setting import clear_flags as clear_flags  # the CLI, passed on to the
from orchestrator.setting import use_flag as use_flag  # processes we start

MiB, GiB = 1024**2, 1024**3
MEMORY_SHARE = 0.75
"""Share of the host's memory admitted by default."""
ENGINES = ("docker", "podman")
_NETWORK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")


def host_memory() -> int:
    """MemTotal of /proc/meminfo in bytes (the physical pages where there is none)."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh.read(64 * 1024).splitlines():
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _state_dir(raw: str) -> Path:
    path = Path(os.path.expanduser(raw))  # an unknown ~user stays, and is refused
    if not path.is_absolute():
        raise ValueError(raw)
    return path


def _xdg_state() -> Path:
    """platformdirs' Unix rule for our state folder: written out for the cases it answers
    plainly (an absolute XDG_STATE_HOME; none, and an absolute HOME), since loading it costs
    5 ms of every `ps` and `logs`; any other case is its own (held equal by a unit test)."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "orchestrator"
    home = os.environ.get("HOME", "")
    if not xdg.strip() and os.path.isabs(home):
        return Path(home) / ".local" / "state" / "orchestrator"
    from platformdirs.unix import Unix

    return Path(Unix("orchestrator").user_state_dir)


def _addresses(raw: str) -> tuple[str, ...]:
    return tuple(str(ipaddress.ip_address(a)) for a in items(raw))


CATALOG = Catalog()
_c = CATALOG

_c.section("Engine", "Which engine runs the sandboxes, and how it is called.")
ENGINE = _c.choice(
    "ORCHESTRATOR_ENGINE", "docker", ENGINES,
    "The engine by name (`--engine`): docker is the process's Docker engine; podman is "
    "Podman through its Docker-compatible API (the system socket as root, the user's own "
    "rootless one otherwise).",
)  # fmt: skip
DOCKER_HOST = _c.text(
    "ORCHESTRATOR_DOCKER_HOST", "an engine address, or podman",
    "The engine every call goes to (`--host`, `--context`), any `docker --host` address; "
    "before ORCHESTRATOR_ENGINE, then DOCKER_HOST, then the docker CLI's default.",
)  # fmt: skip
ENGINE_TIMEOUT = _c.number(
    "ORCHESTRATOR_ENGINE_TIMEOUT", 120.0, "Bound of each engine and Compose call."
)
UP_TIMEOUT = _c.number(
    "ORCHESTRATOR_UP_TIMEOUT", 900.0,
    "Bound of a start (`compose up`, builds included), and of each service becoming ready.",
)  # fmt: skip
UP_PATH = _c.choice(
    "ORCHESTRATOR_UP_PATH", "auto", ("auto", "compose"),
    "auto: a project on a Docker engine of this machine starts and goes through the Engine "
    "API where the file holds only what it makes exactly as Compose does; compose: always "
    "through Compose.",
)  # fmt: skip
EXEC_MODE = _c.choice(
    "ORCHESTRATOR_EXEC_MODE", "auto", ("auto", "executor", "plain"),
    "How commands reach a container: auto (the executor, falling back to plain where it "
    "cannot run), executor, or plain `docker exec`.",
)  # fmt: skip
GVISOR_RUNTIME = _c.text(
    "ORCHESTRATOR_GVISOR_RUNTIME", "a runtime's name",
    "The name gVisor's runsc is registered under in the engine.", default="runsc",
)  # fmt: skip
GVISOR_SEALED_RUNTIME = _c.text(
    "ORCHESTRATOR_GVISOR_SEALED_RUNTIME", "a runtime's name",
    "The name runsc with no network stack (--network=none) is registered under: a gVisor "
    "sandbox with no network runs on it where the engine has it, and only such a sandbox "
    "can be checkpointed with its memory.", default="runsc-sealed",
)  # fmt: skip
ROOTLESS_WITHOUT_LIMITS = _c.flag(
    "ORCHESTRATOR_ROOTLESS_WITHOUT_LIMITS", False,
    "Run on a rootless Podman on cgroup v1, which cannot hold resource limits, without them.",
)  # fmt: skip
SWARM_HOST = _c.text(
    "ORCHESTRATOR_SWARM_HOST", "an engine address",
    "The Swarm manager (docs/scale-out.md); unset: this machine's engine.",
)  # fmt: skip
SWARM_NODE_HOST = _c.text(
    "ORCHESTRATOR_SWARM_NODE_HOST", "a template with {addr} and {hostname}",
    "How to reach a Swarm node's engine to exec into its task, e.g. tcp://{addr}:2376; "
    "unset: only tasks on the manager's own node.",
)  # fmt: skip

_c.section(
    "Policy",
    "What the caller allows beyond the defaults (`Policy.from_env()`): the environment file "
    "cannot set these (docs/security.md).",
)
ALLOWED_MOUNT_ROOTS: Setting[tuple[Path, ...]] = _c.add(
    Setting(
        "ORCHESTRATOR_ALLOWED_MOUNT_ROOTS", f"folders separated by {os.pathsep}", (),
        "Host folders a file's mounts, static assets and builds may name, besides the file's "
        "own folder and the workspace.",
        lambda raw: tuple(Path(p) for p in raw.split(os.pathsep) if p),
    )
)  # fmt: skip
ALLOW_CAPS = _c.names(
    "ORCHESTRATOR_ALLOW_CAPS", "capabilities separated by commas",
    "Capabilities a file may add beyond its own (Docker's defaults but MKNOD, NET_RAW and "
    "SETFCAP), each with a warning; never ALL.",
)  # fmt: skip
ALLOW_HOST_NETWORK = _c.flag(
    "ORCHESTRATOR_ALLOW_HOST_NETWORK", False, "Let a file use `network.mode: host`."
)
ALLOW_ENV = _c.names(
    "ORCHESTRATOR_ALLOW_ENV", "variable names separated by commas, or *",
    "Host variables a file's `env_passthrough` may pass into the sandbox; the file alone "
    "passes none.",
)  # fmt: skip
ALLOW_UNISOLATED = _c.flag(
    "ORCHESTRATOR_ALLOW_UNISOLATED", False,
    "Let a file choose a backend that isolates nothing (`backend: local`).",
)  # fmt: skip
ALLOW_UNPINNED_MOUNTS = _c.flag(
    "ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS", False,
    "Mount host folders by path where the engine cannot take the descriptor this process "
    "checked (a rootless engine, one in a VM, this process in a container).",
)  # fmt: skip
ALLOW_PULL = _c.flag(
    "ORCHESTRATOR_ALLOW_PULL", False,
    "Let the engine pull an image it does not have (else a missing image is an error).",
)  # fmt: skip
ALLOW_HOST_BUILD = _c.flag(
    "ORCHESTRATOR_ALLOW_HOST_BUILD", False,
    "Build a file's images under ORCHESTRATOR_ISOLATION=gvisor (builds run on the host's kernel).",
)  # fmt: skip
ALLOW_PUBLIC_PORTS = _c.flag(
    "ORCHESTRATOR_ALLOW_PUBLIC_PORTS", False,
    "Let a file publish ports on an address other machines reach (0.0.0.0), with a warning.",
)  # fmt: skip
EGRESS: Setting[str | tuple[str, ...]] = _c.add(
    Setting(
        "ORCHESTRATOR_EGRESS", "none, all, or allowlist entries separated by commas", "all",
        "The most any container may reach outside its environment: a file's egress is "
        "narrowed to it, never widened (docs/network.md).",
        lambda raw: raw if raw in ("none", "all") else items(raw),
    )
)  # fmt: skip
ISOLATION = _c.choice(
    "ORCHESTRATOR_ISOLATION", "runc", ("runc", "gvisor"),
    "The least isolation any container gets: a file asking for less gets this.",
)  # fmt: skip

_c.section("Limits", "What one container, call or file may take when it says nothing.")
DEFAULT_MEMORY = _c.size(
    "ORCHESTRATOR_DEFAULT_MEMORY", GiB,
    "Memory of a container whose file names none (at least 6m).", shown="1g",
)  # fmt: skip
DEFAULT_CPUS = _c.number(
    "ORCHESTRATOR_DEFAULT_CPUS", 1.0, "CPUs of a container whose file names none.", unit="CPUs"
)
DEFAULT_PIDS = _c.whole(
    "ORCHESTRATOR_DEFAULT_PIDS", 1024, "Processes of a container whose file names none.",
    unit="processes", high=2**22,
)  # fmt: skip
MAX_PIDS = _c.whole(
    "ORCHESTRATOR_MAX_PIDS", 4096,
    "The most processes a file may ask for one container (`resources.pids`): a file could "
    "otherwise lift its own ceiling to the host's whole process table.",
    unit="processes", high=2**22,
)  # fmt: skip
OUTPUT_LIMIT = _c.whole(
    "ORCHESTRATOR_OUTPUT_LIMIT", 10 * MiB,
    "Bytes of stdout, and of stderr, a command's result keeps when the call gives no "
    "`output_limit=`.", shown="10485760 (10 MiB)",
)  # fmt: skip
FILE_LIMIT = _c.whole(
    "ORCHESTRATOR_FILE_LIMIT", 100 * MiB,
    "Bytes `read_file` or `download` takes when the call gives no `limit=`.",
    shown="104857600 (100 MiB)",
)  # fmt: skip
FILE_TIMEOUT = _c.number(
    "ORCHESTRATOR_FILE_TIMEOUT", 600.0, "Bound of a file call that gives no `timeout=`."
)
USAGE_EVERY = _c.number(
    "ORCHESTRATOR_USAGE_EVERY", 1.0,
    "Seconds between the readings of each live environment's accounting (`rt.usage()`: "
    "memory over time and the highest process count are integrated from them).",
)  # fmt: skip
SETUP_TIMEOUT = _c.number("ORCHESTRATOR_SETUP_TIMEOUT", 900.0, "Bound of a file's setup commands.")
SNAPSHOT_LIMIT = _c.whole(
    "ORCHESTRATOR_SNAPSHOT_LIMIT", GiB,
    "Bytes a workspace's archive (a snapshot, a reset's baseline) may hold when the call "
    "gives no `limit=`.", shown="1073741824 (1 GiB)",
)  # fmt: skip
CHECKPOINT_LIMIT = _c.whole(
    "ORCHESTRATOR_CHECKPOINT_LIMIT", 4 * GiB,
    "Bytes a checkpoint's memory image may hold (gVisor's, `checkpoint(memory=True)`).",
    shown="4294967296 (4 GiB)",
)  # fmt: skip
MAX_SPEC_BYTES = _c.whole(
    "ORCHESTRATOR_MAX_SPEC_BYTES", 128 * 1024,
    "Largest environment file parsed (real ones are a few KiB; YAML parsing costs ~6 s/MiB).",
    shown="131072 (128 KiB)",
)  # fmt: skip
BUILD_CONTEXT_LIMIT = _c.size(
    "ORCHESTRATOR_BUILD_CONTEXT_LIMIT", 2 * GiB,
    "Bytes a build's context may hold (its private copy is that large).", shown="2g",
)  # fmt: skip

_c.section("Admission", "How many environments run at once (docs/admission.md).")
ADMISSION = _c.flag("ORCHESTRATOR_ADMISSION", True, "Off: every spawn starts at once, unqueued.")
MAX_MEMORY = _c.size(
    "ORCHESTRATOR_MAX_MEMORY", 0,
    "Memory the limits of admitted containers may add up to.",
    shown="75% of MemTotal", compute=lambda: int(host_memory() * MEMORY_SHARE),
)  # fmt: skip
MAX_CPUS = _c.number(
    "ORCHESTRATOR_MAX_CPUS", float("inf"),
    "CPUs the limits of admitted containers may add up to (a CPU limit is a ceiling on time "
    "that containers share: one over it is slowed, never killed).", unit="CPUs",
    shown="no bound",
)  # fmt: skip
ADMISSION_TIMEOUT = _c.number(
    "ORCHESTRATOR_ADMISSION_TIMEOUT", 600.0, "How long a spawn waits for room."
)

_c.section("Network", "Subnets, and how a sandbox's allowed traffic leaves (docs/network.md).")
SUBNET_POOL = _c.add(
    Setting(
        "ORCHESTRATOR_SUBNET_POOL", "a network like 10.213.0.0/16",
        ipaddress.ip_network("10.213.0.0/16"),
        "The pool each project's network takes its subnet from.", ipaddress.ip_network,
        shown="10.213.0.0/16",
    )
)  # fmt: skip
SUBNET_PREFIX = _c.whole(
    "ORCHESTRATOR_SUBNET_PREFIX", 27,
    "Prefix length of each project's subnet (at most the pool's bits less 2).",
    unit="prefix bits", high=128,
)  # fmt: skip
EGRESS_NETWORK = _c.add(
    Setting(
        "ORCHESTRATOR_EGRESS_NETWORK", "a network's name (letters, digits, '_', '.', '-')", "",
        "An existing network to leave by, instead of one made for each environment.",
        checked(str, lambda v: bool(_NETWORK_NAME.match(v))),
    )
)  # fmt: skip
EGRESS_DNS: Setting[tuple[str, ...]] = _c.add(
    Setting(
        "ORCHESTRATOR_EGRESS_DNS", "addresses separated by commas", (),
        "Resolvers the gateway and `all` containers use instead of the engine's.",
        _addresses,
    )
)  # fmt: skip
SECRETS_FILE = _c.text(
    "ORCHESTRATOR_SECRETS_FILE", "a file of NAME@HOST,HOST=VALUE lines",
    "The values of the secrets files name (`secrets:`) and the hosts each may go to, "
    "readable by its owner alone; the sandbox sees placeholders, the egress gateway puts "
    "the values in (docs/network.md).",
)  # fmt: skip
GATEWAY_TRUST = _c.text(
    "ORCHESTRATOR_GATEWAY_TRUST", "a PEM file",
    "Certificates the egress gateway trusts, besides Debian's, for the hosts it sends "
    "secrets to.",
)  # fmt: skip
GATEWAY_BASE = _c.text(
    "ORCHESTRATOR_GATEWAY_BASE", "an image",
    "The image the egress gateway is built on; unset: orchestrator/gateway-base:bookworm-relay "
    "where the engine has it, else debian:bookworm-slim.",
)  # fmt: skip

_c.section("State", "Where records live, and who removes what a dead process left.")
STATE_DIR = _c.add(
    Setting(
        "ORCHESTRATOR_STATE_DIR", "an absolute path (or start with ~)", Path(),
        "The state folder: project folders, records, snapshots.", _state_dir,
        shown="$XDG_STATE_HOME/orchestrator (~/.local/state/orchestrator)", compute=_xdg_state,
    )
)  # fmt: skip
GUARDIAN = _c.flag(
    "ORCHESTRATOR_GUARDIAN", True,
    "Off: no guardian removes what an owner leaves when it dies (the next reap still does).",
)  # fmt: skip
GUARDIAN_LOG = _c.text(
    "ORCHESTRATOR_GUARDIAN_LOG", "a file", "A file the guardians append their errors to."
)

_c.section("Conformance suite", "The images `orchestrator.testing` runs its checks in.")
PYTHON_IMAGE = _c.text(
    "ORCHESTRATOR_PYTHON_IMAGE", "an image", "An image with Python 3.",
    default="orchestrator-test/python:3.11",
)  # fmt: skip
BUSYBOX_IMAGE = _c.text(
    "ORCHESTRATOR_BUSYBOX_IMAGE", "an image", "An image with busybox (its `ip`).",
    default="orchestrator-test/busybox:1",
)  # fmt: skip
HARBOR_IMAGE = _c.text(
    "ORCHESTRATOR_HARBOR_IMAGE", "an image",
    "An image with Harbor and this package's dependencies (`scripts/build-images harbor`).",
    default="orchestrator-test/harbor:0.26.0",
)  # fmt: skip

# ----- the engine this process works with ---------------------------------------------------
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
"""The address the docker CLI's default context reaches."""


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


def chosen_engine() -> str:
    """The engine this process is told to use (ORCHESTRATOR_DOCKER_HOST, else
    ORCHESTRATOR_ENGINE's: podman is Podman's socket), "" when neither names one."""
    if chosen := DOCKER_HOST.get():
        return engine_address(chosen)
    return podman_socket() if ENGINE.get() == "podman" else ""


def engine_host() -> str:
    """The engine this process works with: `chosen_engine()`, else DOCKER_HOST, else "" for
    the docker CLI's default."""
    return chosen_engine() or os.environ.get("DOCKER_HOST", "").strip()


def same_engine(a: str, b: str) -> bool:
    """Whether two engine addresses name one engine ("": the docker CLI's default)."""
    return (a or DEFAULT_ENGINE) == (b or DEFAULT_ENGINE)


_engines_named: set[str] = set()
"""Engines a spawn of this process named (`spawn_runtime(..., host=…)`)."""


def engine_named(host: str) -> None:
    """Remember that this process works with the engine at `host` (a spawn named it)."""
    if host:
        _engines_named.add(host)


def engine_sockets() -> tuple[str, ...]:
    """The local sockets of every engine this process may work with (the default, DOCKER_HOST,
    the chosen one, Podman's, those a spawn named): what no environment may mount."""
    named = [DEFAULT_ENGINE, os.environ.get("DOCKER_HOST", "").strip(), chosen_engine()]
    named += [podman_socket(), *sorted(_engines_named)]
    return tuple(dict.fromkeys(a.removeprefix("unix://") for a in named if a.startswith("unix://")))


def may_reach(host: str) -> bool:
    """Whether an engine address read from a file (a snapshot's record) may be reached by
    this process: its own engine, or one a spawn of this process named. Another address
    (`ssh://…` runs ssh, `tcp://…` connects out, `unix://…` any listener's socket) is
    reached only when the caller names it (`-H ADDRESS`, ORCHESTRATOR_DOCKER_HOST): a record
    is a file, and may have been written by anyone who could write beside its archive."""
    return same_engine(host, engine_host()) or host in _engines_named
