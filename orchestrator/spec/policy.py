"""The security policy: what no environment may ask for, checked before anything runs.

Three rules, each in one place:
- every host path an environment names (static assets, mounts, service mounts, build
  contexts and Dockerfiles, the workspace) passes one check: under an allowed root after
  resolving `..` and symlinks, never an engine socket, never a folder holding host secrets
  (`spec.hostpaths`; the policy adds the roots the caller allows);
- capabilities come from an allow-list: every container drops ALL and gets back a small
  documented set; a file may add Docker's other defaults, anything else needs the caller's
  opt-in (never the file's), with a warning;
- host networking needs the caller's opt-in too;
- host variables reach a sandbox only when the file names them (`env_passthrough`) *and* the
  caller allows them: the file alone passes none.
The opt-ins live in `Policy` (or ORCHESTRATOR_* variables), which the environment file
cannot set: whoever runs the sandbox decides, not whoever wrote the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from orchestrator import settings
from orchestrator.errors import PolicyError, SpecError, SpecIssue, UsageError
from orchestrator.paths import open_regular
from orchestrator.spec import egress as _egress
from orchestrator.spec.egress import Egress
from orchestrator.spec.hostpaths import ROOTS_ENV, MountRoots, state_paths, too_broad

# the host-path rule (spec.hostpaths) is part of the policy: callers take these from here too
from orchestrator.spec.hostpaths import UNREADABLE_FIX as UNREADABLE_FIX
from orchestrator.spec.hostpaths import check_host_paths as check_host_paths
from orchestrator.spec.hostpaths import check_workspace as check_workspace
from orchestrator.spec.hostpaths import look_up as look_up
from orchestrator.spec.models import (
    ENV_KEY_RE,
    ISOLATION_LEVELS,
    EnvironmentV1,
    Hardening,
    Isolation,
)
from orchestrator.spec.parts import SECRET_HOST_RE

# the variables' names, for messages (each setting is orchestrator.settings')
CAPS_ENV = settings.ALLOW_CAPS.name
HOST_NETWORK_ENV = settings.ALLOW_HOST_NETWORK.name
ENV_ENV = settings.ALLOW_ENV.name
UNISOLATED_ENV = settings.ALLOW_UNISOLATED.name
EGRESS_ENV = settings.EGRESS.name
ISOLATION_ENV = settings.ISOLATION.name
UNPINNED_ENV = settings.ALLOW_UNPINNED_MOUNTS.name
PULL_ENV = settings.ALLOW_PULL.name
HOST_BUILD_ENV = settings.ALLOW_HOST_BUILD.name
PUBLIC_PORTS_ENV = settings.ALLOW_PUBLIC_PORTS.name

DEFAULT_CAPS = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETPCAP",
    "SETUID",
)
"""What every container keeps after `cap_drop: [ALL]`: enough to own files, switch users
and signal processes. Raw sockets, mknod, chroot and file capabilities are gone, and so is
FSETID: without it a write to a set-user-ID file clears the bit, so root in a sandbox cannot
turn a set-user-ID program of a host folder it writes into its own."""
FILE_CAPS = frozenset({*DEFAULT_CAPS, "SYS_CHROOT"})
"""What an environment file may add on its own: the rest of Docker's default set but MKNOD
(a root sandbox would leave device nodes in the bind-mounted workspace, for a host user to
open), SETFCAP (it would leave a program with file capabilities there, `cap_setuid+ep`,
which makes any host user who runs it root) and NET_RAW (raw frames reach the host's side
of the sandbox's internal bridge, past every network rule): those, like any other, only the
caller grants."""
NEVER_CAPS = frozenset({"ALL"})
CAP_RISKS = {
    "MKNOD": "root in the sandbox can make device nodes, in the host's workspace too, which "
    "give whoever opens them on the host the device itself",
    "NET_RAW": "root in the sandbox can send raw frames, which reach the host over the "
    "internal bridge (its IPv6 link-local address, any of its IPv4 ones) past the egress "
    "rules",
    "FSETID": "root in the sandbox can rewrite a set-user-ID program in a host folder it "
    "writes and keep the bit, making it its own program that runs as that program's owner",
    "SETFCAP": "root in the sandbox can give a program in a host folder it writes file "
    "capabilities (cap_setuid+ep), which make whoever runs it on the host root",
}
"""What a capability granted by opt-in risks, where that is sharper than the general words."""


def _norm_cap(cap: str) -> str:
    cap = cap.strip().upper()
    return cap.removeprefix("CAP_")


def egress_from_env() -> Egress:
    """ORCHESTRATOR_EGRESS parsed ("all" when unset); UsageError naming a bad entry."""
    try:
        return _egress.parse(settings.EGRESS.get())
    except ValueError as exc:
        raise UsageError(f"{EGRESS_ENV}: {exc}") from None


@dataclass(frozen=True)
class Policy:
    """What the caller allows beyond the defaults. The environment file cannot change it.

    Relative paths in an environment file resolve against the file's own folder. Host paths
    must lie under an allowed root (after resolving `..` and symlinks): the environment
    file's folder, the workspace the caller gives (not the private one made when none is
    given: no file can name it), plus `extra_mount_roots` (ORCHESTRATOR_ALLOWED_MOUNT_ROOTS,
    os.pathsep-separated). A root that is, or contains, the system temp folder or a secret
    folder (/, /tmp, /var, ...) never counts."""

    extra_mount_roots: tuple[Path, ...] = field(default=())
    allow_caps: frozenset[str] = field(default=frozenset())
    """Capabilities beyond FILE_CAPS that files may ask for (ORCHESTRATOR_ALLOW_CAPS,
    comma-separated). ALL is never allowed; neither is privileged mode."""
    allow_host_network: bool = False
    """Let files use `network.mode: host` (ORCHESTRATOR_ALLOW_HOST_NETWORK=1)."""
    allow_env: frozenset[str] = field(default=frozenset())
    """Host variables a file's `env_passthrough` may pass into the sandbox
    (ORCHESTRATOR_ALLOW_ENV, comma-separated; "*": any). A variable passes only when the file
    names it (or says "*") and this allows it: the file alone passes none."""
    egress: Egress | Sequence[str] = "all"
    """The most any container may reach outside its environment: "none", "all" or a list of
    allowlist entries (ORCHESTRATOR_EGRESS: none, all, or entries separated by commas). A
    file's `egress` is narrowed to it, never widened; "all" (the default) leaves each file
    its own. A list is parsed when the policy is made (ValueError naming a bad entry)."""
    isolation: Isolation = "runc"
    """The least isolation any container gets (ORCHESTRATOR_ISOLATION: runc or gvisor): a
    file asking for less gets this; a file cannot lower it."""
    allow_public_ports: bool = False
    """Let files publish ports on an address other machines reach (`host_ip` other than
    loopback, such as 0.0.0.0; ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1), with a warning. Without
    it such a port is refused: a file never opens this machine to the network on its own."""
    allow_unisolated: bool = False
    """Let a file choose a backend that isolates nothing, whose commands run on this host as
    the caller (`backend: local`; ORCHESTRATOR_ALLOW_UNISOLATED=1). A caller that names the
    backend itself (`spawn_runtime(..., backend="local")`, `run --on local`) needs nothing."""
    allow_unpinned_mounts: bool = False
    """Mount host folders by path where the engine cannot take the descriptor this process
    checked (a rootless engine, one in a VM, this process in a container;
    ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS=1): a sandbox that can write near such a folder could
    swap it for a link between the check and the mount. Off: such a start is refused."""
    allow_pull: bool = False
    """Let the engine pull an image it does not have (ORCHESTRATOR_ALLOW_PULL=1): the file's
    `image`, a build's bases, the gateway's base. Off: nothing is ever pulled, and a
    missing image is an error naming it, before anything starts."""
    allow_host_build: bool = False
    """Build a file's images when the caller requires gVisor (ORCHESTRATOR_ISOLATION=gvisor;
    ORCHESTRATOR_ALLOW_HOST_BUILD=1): `docker build` runs each RUN step on the host's
    kernel, not gVisor's. Off: such a file must name a built image."""

    secrets: Mapping[str, tuple[str, Sequence[str]]] | tuple[CallerSecret, ...] = field(
        default=(), repr=False
    )
    """The values of the secrets files name (`secrets:`), by name, each with the hosts it may
    ever be sent to: {NAME: (VALUE, [HOST, ...])} (ORCHESTRATOR_SECRETS_FILE: a file of
    NAME@HOST,HOST=VALUE lines, readable by its owner alone). A file's `secrets.NAME.hosts`
    may only narrow the caller's hosts: the file never chooses where a value goes. A value
    is 16 to 4096 characters of letters, digits and `-._~` (what no common encoding
    rewrites, so an answer that repeats it is found). The sandbox sees a placeholder; the
    egress gateway puts the value in (docs/network.md)."""
    gateway_trust: str = ""
    """A PEM file of certificates the egress gateway trusts, besides Debian's, for the hosts
    it sends secrets to (ORCHESTRATOR_GATEWAY_TRUST)."""

    @classmethod
    def from_env(cls) -> Policy:
        """The policy the caller's settings give (orchestrator.settings: flags, variables)."""
        return cls(
            extra_mount_roots=settings.ALLOWED_MOUNT_ROOTS.get(),
            allow_caps=frozenset(_norm_cap(c) for c in settings.ALLOW_CAPS.get()),
            allow_host_network=settings.ALLOW_HOST_NETWORK.get(),
            allow_env=frozenset(settings.ALLOW_ENV.get()),
            allow_unisolated=settings.ALLOW_UNISOLATED.get(),
            allow_unpinned_mounts=settings.ALLOW_UNPINNED_MOUNTS.get(),
            allow_pull=settings.ALLOW_PULL.get(),
            allow_host_build=settings.ALLOW_HOST_BUILD.get(),
            allow_public_ports=settings.ALLOW_PUBLIC_PORTS.get(),
            egress=egress_from_env(),
            isolation=cast(Isolation, settings.ISOLATION.get()),
            secrets=secrets_from_file(settings.SECRETS_FILE.get()),
            gateway_trust=settings.GATEWAY_TRUST.get(),
        )

    def __post_init__(self) -> None:
        given: list[tuple[str, str, Sequence[str]]] = (
            [(name, value, hosts) for name, (value, hosts) in self.secrets.items()]
            if isinstance(self.secrets, Mapping)
            else list(self.secrets)
        )
        held: list[CallerSecret] = []
        for name, value, listed in given:
            hosts = (listed,) if isinstance(listed, str) else tuple(listed)
            problem = secret_problem(name, value, hosts)
            if problem:
                raise UsageError(f"the secret {name!r}: {problem}")
            held.append((name, value, tuple(sorted(set(hosts)))))
        object.__setattr__(self, "secrets", tuple(sorted(held)))
        parsed = isinstance(self.egress, tuple) and all(
            isinstance(r, _egress.Rule) for r in self.egress
        )
        if not parsed and self.egress not in ("none", "all"):
            # a list (or tuple) of entries, as a caller writes it: parsed once, here
            entries = (
                self.egress
                if isinstance(self.egress, str)
                else [str(e) for e in cast(Sequence[object], self.egress)]
            )
            object.__setattr__(self, "egress", _egress.parse(entries))

    def secret(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        """The caller's value of secret `name` and the hosts it may go to, or None."""
        for held, value, hosts in cast(tuple[CallerSecret, ...], self.secrets):
            if held == name:
                return value, hosts
        return None

    def isolation_of(self, spec: EnvironmentV1, name: str) -> Isolation:
        """How container `name` ("main" or a service) is isolated: its own `isolation` (a
        service's, else the file's), raised to this policy's when that is stronger."""
        svc = spec.services.get(name)
        asked = svc.isolation if svc is not None and svc.isolation else spec.isolation
        return max(asked, self.isolation, key=ISOLATION_LEVELS.index)

    def egress_of(self, spec: EnvironmentV1, name: str) -> tuple[Egress, list[str]]:
        """What container `name` ("main" or a service) may reach: its own `egress` (a
        service's, else the file's `network.egress`) narrowed to this policy's, and a note
        (naming the field) for each entry of the file this policy took away."""
        own = spec.services[name].egress if name in spec.services else None
        asked = _egress.parse(own) if own is not None else spec.network.egress_setting()
        got, notes = _egress.narrow(asked, cast(Egress, self.egress))  # parsed: __post_init__
        where = f"services.{name}.egress" if own is not None else "network.egress"
        return got, [f"{where}: {note}" for note in notes]

    def setup_egress_of(self, spec: EnvironmentV1) -> tuple[Egress | None, list[str]]:
        """What the sandbox may reach while setup runs: the file's `setup.egress` narrowed
        to this policy's (None: the file sets none, and setup runs under network.egress),
        and a note for each entry this policy took away."""
        if spec.setup.egress is None:
            return None, []
        asked = _egress.parse(spec.setup.egress)
        got, notes = _egress.narrow(asked, cast(Egress, self.egress))
        return got, [f"setup.egress: {note}" for note in notes]

    def narrow_egress(self, asked: Egress) -> tuple[Egress, list[str]]:
        """What a caller's change of a running environment's egress gives under this
        policy (`rt.set_egress`): the stricter of the two, and a note for what it dropped."""
        return _egress.narrow(asked, cast(Egress, self.egress))

    def mount_roots(self, env_dir: Path, workspace: Path | None) -> MountRoots:
        """The folders host paths may lie under: `env_dir` (the environment file's folder,
        which relative paths resolve against), the caller's `workspace` (None: a private
        one, which no file can name, so no root) and `extra_mount_roots`."""
        labelled = [(env_dir, "the environment file's folder")]
        if workspace is not None:
            labelled.append((workspace, "the workspace"))
        labelled += [(r, ROOTS_ENV) for r in self.extra_mount_roots]
        out = MountRoots()
        for root, label in labelled:
            real = look_up(root, home=True).real
            if real in out.labels:
                continue
            if too_broad(real):
                held = [p for p in state_paths() if p.is_relative_to(real)]
                what = f"holds the state folder {held[0]}" if held else None
                what = what or "a system, secret or shared temp folder"
                out.ignored.append(f"{real} ({label}: {what})")
                continue
            out.append(real)
            out.labels[real] = label
        return out

    def allows_env(self, name: str) -> bool:
        return "*" in self.allow_env or name in self.allow_env


def passed_env(names: Sequence[str], policy: Policy, host: Mapping[str, str]) -> dict[str, str]:
    """The host variables that reach a sandbox: those the file names in `env_passthrough`
    ("*": any) that the caller's policy also allows."""
    wanted = host.keys() if "*" in names else [n for n in names if n in host]
    return {k: host[k] for k in wanted if policy.allows_env(k)}


def env_passthrough_warnings(names: Sequence[str], policy: Policy) -> list[str]:
    """What the file asked to pass through and the caller did not allow (and how to allow
    it), or that every host variable passes."""
    out = []
    refused = [n for n in dict.fromkeys(names) if n != "*" and not policy.allows_env(n)]
    if refused:
        listed = ",".join(refused)
        out.append(
            f"env_passthrough: host variable(s) {', '.join(refused)} not passed into the "
            "sandbox: only the caller may pass host variables through; to pass them, the "
            f"caller sets {ENV_ENV}={listed} or Policy(allow_env={{...}})"
        )
    if "*" in names and "*" not in policy.allow_env:
        allowed = ", ".join(sorted(policy.allow_env)) or "none"
        out.append(
            f"env_passthrough: '*' passes only the host variables the caller allows ({allowed}); "
            f"to pass more, the caller sets {ENV_ENV}=NAME,... or Policy(allow_env={{...}})"
        )
    elif "*" in names:
        out.append(
            f"WARNING: env_passthrough passes every host variable by policy opt-in "
            f"({ENV_ENV}=*): the sandbox sees the caller's whole environment, secrets included"
        )
    return out


@dataclass
class HardeningReport:
    issues: list[SpecIssue] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_hardening(
    source: str, prefix: str, opts: Hardening, policy: Policy, report: HardeningReport
) -> list[str]:
    """Refuse privileged mode, host namespaces, devices and capabilities outside the
    allow-list; return the normalized capabilities to add."""

    def bad(name: str, message: str, fix: str) -> None:
        report.issues.append(SpecIssue(source, field=prefix + name, message=message, fix=fix))

    if opts.privileged:
        bad("privileged", "privileged containers are not allowed", "remove `privileged: true`")
    for ns in ("pid", "ipc", "uts"):
        if getattr(opts, ns) == "host":
            bad(ns, f"the host {ns} namespace is not allowed", f"remove `{ns}: host`")
    if opts.devices:
        bad("devices", "host devices are not allowed", "remove `devices`")
    caps = []
    for cap in dict.fromkeys(_norm_cap(c) for c in opts.cap_add):
        if cap in NEVER_CAPS:
            bad("cap_add", f"capability {cap} is never allowed", "name the capabilities you need")
        elif cap in FILE_CAPS:
            caps.append(cap)
        elif cap in policy.allow_caps:
            caps.append(cap)
            risk = CAP_RISKS.get(cap, "code in the sandbox can use it against the host kernel")
            report.warnings.append(
                f"WARNING: {prefix}cap_add grants {cap} by policy opt-in ({CAPS_ENV}): {risk}"
            )
        else:
            why = f" ({CAP_RISKS[cap]})" if cap in CAP_RISKS else ""
            bad(
                "cap_add",
                f"capability {cap} is not allowed{why}; a file may add "
                f"{', '.join(sorted(FILE_CAPS - set(DEFAULT_CAPS)))} on its own",
                f"drop it, or let the caller opt in with {CAPS_ENV}={cap} "
                f"(Policy(allow_caps={{{cap!r}}}) in the library)",
            )
    return [c for c in caps if c not in DEFAULT_CAPS]


def raise_if(issues: list[SpecIssue], others: Sequence[SpecIssue] = ()) -> None:
    """Raise every problem at once: PolicyError when the policy refuses something (`issues`,
    then the file's `others` with them), SpecError when only `others` are found."""
    if issues:
        raise PolicyError([*issues, *others])
    if others:
        raise SpecError(list(others))


SECRETS_ENV = settings.SECRETS_FILE.name
SECRET_MIN, SECRET_MAX = 16, 4096
"""A secret's length: its placeholder has the same (so a body keeps its length), and a
shorter one would be a guessable stand-in."""
SECRET_VALUE = re.compile(r"[A-Za-z0-9._~-]+")
"""What a value may hold: characters JSON, URL, HTML and shell quoting leave as they are, so
the relay finds a value an answer repeats (a key with `"` or `/` would come back escaped)."""
SECRET_HOST = re.compile(SECRET_HOST_RE)
CallerSecret = tuple[str, str, tuple[str, ...]]
"""A secret as the caller holds it: its name, its value, the hosts it may ever go to."""


def secret_problem(name: str, value: str, hosts: Sequence[str]) -> str:
    """What is wrong with a secret, never quoting its value; "" when nothing is."""
    if not re.fullmatch(ENV_KEY_RE, name):
        return "not a variable name (letters, digits and _, not starting with a digit)"
    if not SECRET_VALUE.fullmatch(value):
        return (
            "its value may hold letters, digits and -._~ alone (what an answer that repeats "
            "it cannot escape)"
        )
    if not SECRET_MIN <= len(value) <= SECRET_MAX:
        return f"its value must have {SECRET_MIN} to {SECRET_MAX} characters"
    if not hosts or not all(SECRET_HOST.fullmatch(h) for h in hosts):
        return (
            "name the hosts it may go to, as whole lower-case host names "
            "(NAME@api.example.com,other.example.com=VALUE)"
        )
    return ""


def secrets_from_file(path: str) -> tuple[CallerSecret, ...]:
    """The NAME@HOST,HOST=VALUE lines of the caller's secrets file ("" : none): blank lines
    and lines starting with # are skipped, the value is everything after the first `=`.
    The file must be the caller's own and readable by no one else. A UsageError names the
    line, never a value."""
    if not path:
        return ()
    try:
        fd = open_regular(Path(path))
    except OSError as exc:
        raise UsageError(f"{SECRETS_ENV}: cannot open {path}: {exc.strerror}") from None
    if fd < 0:  # (a link, a FIFO, a device: never opened to read)
        raise UsageError(f"{SECRETS_ENV}: cannot open {path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise UsageError(
                f"{SECRETS_ENV}: {path} must be yours and readable by you alone (chmod 600 {path})"
            )
        raw = handle.read(1024 * 1024 + 1)
    if len(raw) > 1024 * 1024:
        raise UsageError(f"{SECRETS_ENV}: {path} is over 1 MiB")
    out: dict[str, CallerSecret] = {}
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        name, at, listed = key.partition("@")
        name = name.strip()
        hosts = tuple(h.strip() for h in listed.split(",") if h.strip())
        problem = "not NAME@HOST,HOST=VALUE" if not sep or not at else ""
        problem = problem or secret_problem(name, value, hosts)
        if problem:
            raise UsageError(f"{SECRETS_ENV}: {path}, line {number}: {problem}")
        out[name] = (name, value, tuple(sorted(set(hosts))))
    return tuple(sorted(out.values()))
