"""The versioned environment-file schema (v1), as strict pydantic models.

Every model forbids unknown keys and documents each field; ``orchestrator schema`` prints the
JSON Schema generated from these classes, so editors can complete and check environment files.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator.errors import UsageError
from orchestrator.procutil import UnknownUser, in_range
from orchestrator.spec.parts import (
    DURATION_RE,
    ENV_KEY_RE,
    ISOLATION_LEVELS,
    MEMORY_RE,
    MIN_MEMORY,
    NAME_RE,
    Build,
    EgressSetting,
    EnvKey,
    EnvValue,
    Healthcheck,
    Isolation,
    Mount,
    Network,
    PortMap,
    Protocol,
    PublishedPort,
    Resources,
    SecretUse,
    Setup,
    StaticAsset,
    Strict,
    VolumeMount,
    Workspace,
    size_bytes,
)

__all__ = [  # the schema: these models, and the pieces of spec.parts they are made of
    "DURATION_RE",
    "ENV_KEY_RE",
    "ISOLATION_LEVELS",
    "MEMORY_RE",
    "MIN_MEMORY",
    "NAME_RE",
    "PARTIAL",
    "RESERVED_PREFIX",
    "STATIC_PLACEHOLDER",
    "SUPPORTED_VERSIONS",
    "USER_RE",
    "Build",
    "EgressSetting",
    "EnvKey",
    "EnvValue",
    "EnvironmentV1",
    "Hardening",
    "Healthcheck",
    "Isolation",
    "Mount",
    "Network",
    "PortMap",
    "Protocol",
    "PublishedPort",
    "Resources",
    "SecretUse",
    "Service",
    "Setup",
    "StaticAsset",
    "Strict",
    "VolumeMount",
    "Workspace",
    "size_bytes",
]

RESERVED_PREFIX = "orchestrator-"
"""Service names the environment's own containers (egress gateway, port forwarder) take."""
STATIC_PLACEHOLDER = re.compile(r"\{\{\s*static:([A-Za-z0-9_.-]+)\s*\}\}")
"""`{{static:NAME}}` in the file's own commands: the path of static asset NAME."""
USER_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$"
"""A name, name:group, uid or uid:gid (looked up in the container's own passwd and group
files), or `host` / `root`."""


def _user_ids(value: str | None) -> str | None:
    """A user's numeric parts within the engine's range (see procutil.MAX_ID)."""
    for part, what in zip((value or "").split(":"), ("uid", "gid"), strict=False):
        try:
            if part.isdigit():
                in_range(int(part), what)
        except UnknownUser as exc:
            raise ValueError(f"{exc}: the engine's range") from None
    return value


SUPPORTED_VERSIONS = (1,)
PARTIAL: dict[str, bool] = {"partial": True}
"""Validation context of the valid rest of an invalid file (spec/partial.py): the file's
cross-checks, reported already, are skipped so that later stages still look at the rest."""


class Hardening(Strict):
    """Container options the security policy checks. Anything risky is refused by default."""

    privileged: bool = False
    """Privileged mode (always refused by the default policy)."""
    cap_add: list[str] = Field(default_factory=list)
    """Extra Linux capabilities. Every container drops ALL and keeps a small set (CHOWN,
    DAC_OVERRIDE, FOWNER, KILL, SETUID, SETGID, SETPCAP, NET_BIND_SERVICE, AUDIT_WRITE); a
    file may add SYS_CHROOT. Anything else needs the caller's opt-in
    (ORCHESTRATOR_ALLOW_CAPS): MKNOD (device nodes would reach the host through the
    workspace), SETFCAP and FSETID (a program with file capabilities, or a rewritten
    set-user-ID one, would give privileges to a host user who runs it), NET_RAW (raw frames
    would reach the host past the network rules); ALL never."""
    devices: list[str] = Field(default_factory=list)
    """Host devices (refused by the default policy)."""
    pid: Literal["private", "host"] = "private"
    """PID namespace; host is refused."""
    ipc: Literal["private", "host"] = "private"
    """IPC namespace; host is refused."""
    uts: Literal["private", "host"] = "private"
    """UTS namespace; host is refused."""


class Service(Hardening):
    """An extra container (database, web server, ...) reachable from the main one by its name."""

    image: str | None = None
    """Image to run."""
    build: Build | None = None
    """Or build it."""
    command: list[str] | str | None = None
    """Command (default: the image's)."""
    entrypoint: list[str] | str | None = None
    """Entrypoint, replacing the image's, as in Compose: the image's command is then dropped
    too, unless `command` gives one (default: the image's)."""
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    """Environment variables."""
    ports: list[PortMap] = Field(default_factory=list)
    """Ports to publish on the host."""
    depends_on: dict[
        Annotated[str, Field(pattern=NAME_RE)],
        Literal["started", "healthy", "completed_successfully"],
    ] = Field(default_factory=dict)
    """Other services this one starts after, as Compose's `depends_on` conditions: started,
    healthy (the other needs a healthcheck) or completed_successfully (the other is a
    `job`). The main sandbox waits for every service either way; the docker backend orders
    the services' starts by this, the swarm backend starts them together."""
    healthcheck: Healthcheck | None = None
    """Wait for this check to pass before the environment is ready."""
    user: str | None = Field(default=None, pattern=USER_RE)
    """User to run as: a name, name:group, uid or uid:gid of its image, host or root
    (default: the image's)."""
    workdir: str | None = Field(default=None, pattern=r"^/")
    """Working folder of this service, as `workdir` is the main sandbox's: created before
    the service's command starts and owned by its `user`; its command, `rt.service(NAME)`
    commands and relative file paths start here (default: the image's WORKDIR, or /). With
    a `user` other than root, the service's PID 1 is root's, as the main sandbox's, and its
    command is started as that user, which needs setpriv (util-linux) or python3 in the
    image, and /bin/sh."""
    resources: Resources = Field(default_factory=Resources)
    """Limits."""
    mounts: list[Mount] = Field(default_factory=list)
    """Extra bind mounts."""
    volumes: list[VolumeMount] = Field(default_factory=list)
    """Named volumes of the environment (shared with the containers that name them too)."""
    static_assets: bool = True
    """Mount the environment's static assets here too, read-only at /static, as in the main
    sandbox."""
    egress: EgressSetting = None
    """What this service may reach outside the environment, as `network.egress` says (default:
    the file's `network.egress`)."""
    isolation: Isolation | None = None
    """How this service is kept from the host's kernel, as `isolation` says (default: the
    file's `isolation`)."""
    placement: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Swarm placement constraints for this service, e.g. node.labels.db==true (swarm
    backend; the others ignore them)."""
    job: bool = False
    """A one-shot job (a migration, a seed, a download) that runs to completion during the
    start, as Compose's `service_completed_successfully`: the start waits for it (within
    ORCHESTRATOR_UP_TIMEOUT) and fails, with its exit code and last log lines, unless it
    exits 0; no command runs in the main sandbox before it has. Without it, a service must
    keep running: one that exits during the start, or within a second of starting, fails
    the start."""

    @field_validator("command", "entrypoint")
    @classmethod
    def _words(cls, value: list[str] | str | None) -> list[str] | str | None:
        if isinstance(value, str):
            try:
                shlex.split(value)  # as Compose splits it: a bad one fails here, not at up
            except ValueError as exc:
                raise ValueError(f"cannot be split into words ({exc}); give a list") from None
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return _user_ids(value)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        if value is None:
            return None
        normal = "/" + posixpath.normpath(value).lstrip("/")  # (as the engine reads it)
        if normal == "/":
            raise ValueError("workdir / would give the whole file system to the service's user")
        return normal

    @model_validator(mode="after")
    def _image_or_build(self) -> Service:
        if (self.image is None) == (self.build is None):
            raise ValueError("a service needs exactly one of `image` or `build`")
        if self.job and self.healthcheck is not None:
            raise ValueError(
                "a `job` runs to completion and is never healthy: remove its healthcheck "
                "(or `job`, for a service that keeps running)"
            )
        return self


def _normal_workdir(value: str | None) -> str | None:
    if value is None:
        return None
    return "/" + posixpath.normpath(value).lstrip("/")  # (as the engine reads it: `//a` is `/a`)


def _cycle(edges: dict[str, list[str]]) -> list[str]:
    """A circle in `edges` (node -> the nodes it waits for), or [] (no recursion: a file
    may chain thousands)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for start in edges:
        if start in state:
            continue
        path, todo = [start], [iter(edges.get(start, []))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(edges.get(nxt, [])))
    return []


class EnvironmentV1(Hardening):
    """A sandbox: what it runs, what it sees, and how it is reached. Schema version 1."""

    version: Literal[1]
    """Schema version of this file."""
    name: str = Field(pattern=NAME_RE, max_length=40)
    """Environment name: lower-case letters, digits, '_', '.', '-'."""
    description: str = ""
    """What this environment is for."""
    backend: str = Field(default="docker", pattern=NAME_RE, max_length=64)
    """The backend that runs it: a registered name (`orchestrator schema` lists them). Built
    in: docker, a Compose project; swarm, a stack on a Docker Swarm (ORCHESTRATOR_SWARM_HOST,
    see docs/scale-out.md); local, plain subprocesses on the host (trusted code only). A
    plugin adds its own through the `orchestrator.runtimes` entry-point group."""
    image: str | None = None
    """Image of the main sandbox (container backends need this or `build`)."""
    build: Build | None = None
    """Or build the main image."""
    workdir: Annotated[str | None, AfterValidator(_normal_workdir)] = Field(
        default="/workspace", pattern=r"^/"
    )
    """Working folder in the sandbox; commands start here (normalized: /. and /tmp/.. are /).
    null: the image's WORKDIR (or /), as Compose starts commands, with `workspace: {mount:
    false}` (docker backend)."""
    workspace: Workspace = Field(default_factory=Workspace)
    """How the host workspace reaches the sandbox."""
    static_assets: list[StaticAsset] = Field(default_factory=list)
    """Read-only assets, at /static/<save_path>."""
    mounts: list[Mount] = Field(default_factory=list)
    """Extra bind mounts (they override the workspace mount at the same path)."""
    volumes: list[VolumeMount] = Field(default_factory=list)
    """Named volumes of the environment, shared with the services that name them too
    (docker backend)."""
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict)
    """Environment variables for every command."""
    env_passthrough: list[str] = Field(default_factory=list)
    """Host variables this environment asks for ("*": any). Only those the caller allows
    pass (`Policy(allow_env=...)`, ORCHESTRATOR_ALLOW_ENV=NAME,...): the file alone passes
    none, and each one named but not allowed is a warning."""
    setup: Setup = Field(default_factory=Setup)
    """Setup commands."""
    network: Network = Field(default_factory=Network)
    """Networking."""
    isolation: Isolation = "runc"
    """How the sandbox (and each service without its own `isolation`) is kept from the
    host's kernel: runc (the engine's default runtime: the host kernel's namespaces and
    cgroups) or gvisor (gVisor's runsc: system calls meet gVisor's kernel, not the host's;
    the engine must have it registered, see docs/isolation.md). The caller's policy
    (ORCHESTRATOR_ISOLATION) may require gvisor for every file; a file cannot lower it."""
    resources: Resources = Field(default_factory=Resources)
    """Limits."""
    user: str = Field(default="host", pattern=USER_RE)
    """User commands run as: a name, name:group, uid or uid:gid (resolved in the sandbox's own
    passwd and group files), host (HUID/HGID or the caller's ids), root, or image (the image's
    USER, root when it names none, as Compose runs it; docker backend)."""
    secrets: dict[EnvKey, SecretUse] = Field(default_factory=dict, max_length=32)
    """Secrets the sandbox uses but never sees, by variable name, each with the hosts it may
    be sent to: `OPENAI_API_KEY: {hosts: [api.openai.com]}`. The caller gives the values and
    the hosts each may ever go to (ORCHESTRATOR_SECRETS_FILE), which these may only narrow;
    the sandbox's variable holds a placeholder, which the egress
    gateway replaces by the value in HTTPS requests to those hosts (they must be in
    `network.egress`). See docs/network.md."""
    services: dict[Annotated[str, Field(pattern=NAME_RE)], Service] = Field(default_factory=dict)
    """Extra containers, reachable from the main one by name."""
    commands: dict[str, str] = Field(default_factory=dict)
    """Named command templates for harnesses (free-form, carried as-is)."""
    placement: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Swarm placement constraints for the main sandbox, e.g. node.labels.gpu==true or
    node.role==worker (swarm backend; the others ignore them)."""
    keep_after_cleanup: bool = False
    """Keep the containers (stopped) after cleanup, for inspection; `orchestrator cleanup --all`
    removes them later."""

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return _user_ids(value) or value

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> EnvironmentV1:
        if info.context is PARTIAL:
            return self  # the valid rest of an invalid file: these were said already
        if self.image is not None and self.build is not None:
            raise ValueError("give one of `image` or `build`, not both")
        if "main" in self.services:
            raise ValueError("`main` is the name of the sandbox itself; rename that service")
        taken = sorted(n for n in self.services if n.startswith(RESERVED_PREFIX))
        if taken:
            raise ValueError(
                f"service names starting with {RESERVED_PREFIX!r} are the environment's own "
                f"(its egress gateway and port forwarder); rename {', '.join(taken)}"
            )
        for name, svc in self.services.items():
            for dep, condition in svc.depends_on.items():
                other = self.services.get(dep)
                if other is None or dep == name:
                    known = ", ".join(n for n in self.services if n != name) or "none"
                    raise ValueError(
                        f"services.{name}.depends_on: {dep!r} is not another service "
                        f"(known: {known})"
                    )
                if condition == "healthy" and other.healthcheck is None:
                    raise ValueError(
                        f"services.{name}.depends_on.{dep}: healthy needs a healthcheck on {dep}"
                    )
                if condition == "completed_successfully" and not other.job:
                    raise ValueError(
                        f"services.{name}.depends_on.{dep}: completed_successfully needs "
                        f"`job: true` on {dep}"
                    )
        if self.workdir is None and self.workspace.mount:
            raise ValueError(
                "workdir: null (the image's WORKDIR) needs `workspace: {mount: false}`: the "
                "workspace is mounted at the workdir, which is not known before the start"
            )
        cycle = _cycle({n: list(svc.depends_on) for n, svc in self.services.items()})
        if cycle:
            raise ValueError(f"services wait for each other in a circle: {' -> '.join(cycle)}")
        clash = sorted(set(self.secrets) & set(self.env))
        if clash:
            raise ValueError(
                f"{', '.join(clash)} is both a secret and an `env` variable: a secret's "
                "variable holds its placeholder; drop it from `env`"
            )
        names = [a.name for a in self.static_assets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"static asset names must be unique: {', '.join(dupes)}")
        return self

    def file_commands(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Every command the file itself holds, with its location (setup and `commands`):
        the only text where `{{static:NAME}}` is resolved."""
        setup = self.setup
        located: list[tuple[tuple[str | int, ...], str]] = []
        for key in ("commands", "eval_commands", "resume_commands"):
            located += [(("setup", key, i), c) for i, c in enumerate(getattr(setup, key))]
        located += [(("commands", name), c) for name, c in self.commands.items()]
        return located

    def static_asset(self, name: str) -> StaticAsset:
        for asset in self.static_assets:
            if asset.name == name:
                return asset
        known = ", ".join(a.name for a in self.static_assets) or "none"
        raise UsageError(f"no static asset named {name!r} (known: {known})")
