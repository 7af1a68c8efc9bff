"""The pieces an environment file (v1) is made of, shared by its main sandbox and its services:
build, static assets, mounts and volumes, setup, ports, network, resources and healthcheck,
each a strict model (`Strict`: unknown keys refused, a docstring per field), and the field
types and patterns they use. `spec.models` puts them together (and exports them too)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from orchestrator.spec import egress
from orchestrator.spec.egress import Egress
from orchestrator.spec.published import Protocol as Protocol
from orchestrator.spec.published import PublishedPort as PublishedPort

NAME_RE = r"^[a-z0-9][a-z0-9_.-]*$"
Isolation = Literal["runc", "gvisor"]
"""How a container is kept from the host's kernel: runc (namespaces and cgroups of the host
kernel) or gvisor (gVisor's own kernel in user space between the sandbox and the host's)."""
ISOLATION_LEVELS: tuple[Isolation, ...] = ("runc", "gvisor")
"""Weakest first."""
MEMORY_RE = r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$"
DURATION_RE = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"
ENV_KEY_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _scalar_to_str(value: object) -> object:
    """YAML reads ``FOO: 1`` as a number; an environment value is text either way."""
    if isinstance(value, bool):
        return value  # let validation reject it: `yes`/`on` are too easy to write by mistake
    if isinstance(value, int | float):
        return str(value)
    return value


EnvValue = Annotated[str, BeforeValidator(_scalar_to_str)]
EnvKey = Annotated[str, Field(pattern=ENV_KEY_RE)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Build(Strict):
    """Build the main image from a Dockerfile instead of using a ready image."""

    context: str = "."
    """Build context, relative to the environment file's folder."""
    dockerfile: str | None = None
    """Dockerfile path inside the context (default: Dockerfile)."""
    args: dict[str, EnvValue] = Field(default_factory=dict)
    """Build arguments."""


class Workspace(Strict):
    """How the host workspace folder reaches the sandbox."""

    mount: bool = True
    """Bind-mount the workspace read-write at `workdir`."""


class StaticAsset(Strict):
    """A read-only folder or file shipped with the environment (tests, fixtures, data)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Name used by the `{{static:NAME}}` placeholder in commands."""
    path: str = Field(min_length=1)
    """Host path, relative to the environment file's folder."""
    save_path: str = Field(min_length=1)
    """Where it appears: `/static/<save_path>` in containers, a per-runtime folder locally."""

    @field_validator("save_path")
    @classmethod
    def _relative(cls, value: str) -> str:
        parts = value.strip("/").split("/")
        if value.startswith("/") or ".." in parts or not value.strip("/"):
            raise ValueError("save_path must be a relative path without '..'")
        return value.strip("/")


class Mount(Strict):
    """An extra bind mount."""

    source: str = Field(min_length=1)
    """Host path; a relative one resolves against the environment file's folder. It must lie
    under an allowed root (the file's folder, a workspace the caller gives, or
    ORCHESTRATOR_ALLOWED_MOUNT_ROOTS)."""
    target: str = Field(pattern=r"^/")
    """Absolute path in the sandbox."""
    read_only: bool = False
    """Mount read-only."""


class VolumeMount(Strict):
    """A named volume of the environment's own, mounted in a container."""

    volume: str = Field(pattern=NAME_RE, max_length=64)
    """Its name: every container of the environment that names it shares it. The engine
    makes it when the environment starts (filled with what the image holds at `target`, as
    Compose fills a new volume) and removes it with the environment. No snapshot or suspend
    keeps it, a reuse pool does not reset it, and `resources.disk` does not bound it."""
    target: str = Field(pattern=r"^/")
    """Absolute path in the container."""
    read_only: bool = False
    """Mount read-only."""


def _egress(value: str | list[str] | None) -> str | list[str] | None:
    if value is not None:
        egress.parse(value)  # ValueError naming the bad entry
    return value


EgressSetting = Annotated[str | list[str] | None, AfterValidator(_egress)]
"""A file's egress: none, all, or the entries of an allowlist (see spec/egress.py)."""


class Setup(Strict):
    """Commands run once when the environment comes up, before any other command."""

    commands: list[str] = Field(default_factory=list)
    """Always run (unless spawned with disable_setup)."""
    eval_commands: list[str] = Field(default_factory=list)
    """Run after `commands`, only when spawned for evaluation."""
    resume_commands: list[str] = Field(default_factory=list)
    """Run after `commands`, only when resuming from a snapshot."""
    egress: EgressSetting = None
    """What the sandbox may reach outside the environment while these commands run (none,
    all, or an allowlist, as `network.egress` says); after them, `network.egress` holds
    again, and whatever setup left open through the gateway is cut. Unset: setup runs
    under `network.egress`. The caller's policy narrows it as it does `network.egress`
    (docs/network.md, "Egress by phase")."""


class PortMap(Strict):
    """Publish a container port on the host."""

    container: int = Field(ge=1, le=65535)
    """Port inside the sandbox."""
    host: int | None = Field(default=None, ge=1, le=65535)
    """Host port; omit for an ephemeral one (reported by `rt.ports` and `orchestrator ps`)."""
    host_ip: str = "127.0.0.1"
    """Host address to bind; loopback by default so nothing is exposed beyond this machine
    (any other address is refused unless the caller allows it:
    ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1)."""
    protocol: Literal["tcp", "udp"] = "tcp"
    """Transport protocol."""


SECRET_HOST_RE = (
    r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)+$"
)
"""A host a secret may be sent to: a whole name, lower-case (no `*.`, no address, no port:
each is reached over HTTPS on 443)."""


class SecretUse(Strict):
    """Where one secret may be sent, within the hosts the caller allows it. Its value is the
    caller's (`Policy.secrets`, ORCHESTRATOR_SECRETS_FILE), never the file's: the sandbox gets
    a placeholder in the
    variable of the secret's name, and the egress gateway puts the value in place of the
    placeholder in the header values of HTTPS requests to these hosts alone."""

    hosts: list[Annotated[str, Field(pattern=SECRET_HOST_RE, max_length=253)]] = Field(
        min_length=1, max_length=32
    )
    """The hosts (names, as the allowlist writes them) this secret may go to, over HTTPS."""


class Network(Strict):
    """Networking of the main sandbox."""

    mode: Literal["bridge", "host", "none"] = "bridge"
    """bridge: own network; host: the host's network (Linux only, and only when the caller
    opts in with ORCHESTRATOR_ALLOW_HOST_NETWORK=1); none: no network at all."""
    ports: list[PortMap] = Field(default_factory=list)
    """Ports to publish (bridge mode only)."""
    egress: EgressSetting = None
    """What the sandbox (and each service without its own `egress`) may reach outside the
    environment: none (the default: nothing, and no outside name resolves), all, or an
    allowlist of host names (`*.` for any name under one), addresses and ranges, each with
    an optional :PORT (names default to 80 and 443). An allowlist is enforced outside the
    sandbox, by the environment's egress gateway (HTTP and HTTPS through its proxy, which
    the usual proxy variables name); see docs/network.md. Published ports never open
    egress. The caller's policy (ORCHESTRATOR_EGRESS) may narrow this, never widen it."""
    outbound: bool | None = None
    """The older shorthand of `egress`: true is `egress: all`, false `egress: none`."""
    bind_host: str = "0.0.0.0"
    """Address servers in the sandbox should listen on; exported as ORCHESTRATOR_BIND_HOST.
    In bridge mode a loopback value is rewritten to 0.0.0.0 so published ports reach it."""

    @model_validator(mode="after")
    def _egress(self) -> Network:
        if self.outbound is not None and self.egress is not None:
            raise ValueError(
                "give `egress` only: `outbound` is its older shorthand (true is all, false none)"
            )
        return self

    def egress_setting(self) -> Egress:
        """The parsed setting of the file (outbound migrated), before any policy."""
        if self.egress is None:
            return "all" if self.outbound else "none"
        return egress.parse(self.egress)


MIN_MEMORY = 6 * 1024 * 1024
"""The engine refuses memory limits under 6 MiB."""
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def size_bytes(value: str) -> int:
    """Bytes of a size written as 512m, 2g, 1.5G or 1048576."""
    unit = value[-1].lower() if value[-1].isalpha() else ""
    number = value[: -1 if unit else None]
    return int(float(number) * _UNITS[unit])


def _positive_size(value: str | None, minimum: int = 1) -> str | None:
    if value is None:
        return None
    size = size_bytes(value)
    if size == 0:
        raise ValueError("0 is not a limit (the engine would read it as 'no limit'); omit it")
    if size < minimum:
        raise ValueError(f"must be at least {minimum // (1024 * 1024)}m")
    return value


class Resources(Strict):
    """Limits enforced by the container runtime."""

    memory: str | None = Field(default=None, pattern=MEMORY_RE)
    """Memory limit, e.g. 512m or 2g (at least 6m; omitted: the caller's default,
    ORCHESTRATOR_DEFAULT_MEMORY, 1g). A process over it is killed and reported as
    out-of-memory."""
    cpus: float | None = Field(default=None, gt=0)
    """CPU limit, in cores (omitted: the caller's default, ORCHESTRATOR_DEFAULT_CPUS, 1)."""
    pids: int | None = Field(default=None, gt=0)
    """Maximum number of processes and threads (contains fork bombs; omitted: the caller's
    default, ORCHESTRATOR_DEFAULT_PIDS, 1024)."""
    tmp: str | None = Field(default=None, pattern=MEMORY_RE)
    """Size of a private tmpfs at /tmp, e.g. 256m. Its pages count against
    `memory`, so a sandbox cannot fill the host's disk through /tmp."""
    disk: str | None = Field(default=None, pattern=MEMORY_RE)
    """Size limit of the container's writable layer, e.g. 2g. Needs an engine
    whose storage driver enforces it (overlay2 on xfs with pquota, btrfs, zfs); elsewhere the
    start fails with an error that says so. Bind mounts (the workspace) are not counted."""

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        return _positive_size(value, MIN_MEMORY)

    @field_validator("tmp", "disk")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        return _positive_size(value)


class Healthcheck(Strict):
    """A Compose healthcheck; the environment waits until it passes."""

    test: list[str] | str
    """Command, as in Compose: ["CMD", ...], ["CMD-SHELL", "..."] or a shell string."""
    interval: str = Field(default="1s", pattern=DURATION_RE)
    """Time between checks."""
    timeout: str = Field(default="5s", pattern=DURATION_RE)
    """Time one check may take."""
    retries: int = Field(default=30, ge=1)
    """Failures in a row before the service is unhealthy."""
    start_period: str = Field(default="0s", pattern=DURATION_RE)
    """Grace period during which failures do not count."""
