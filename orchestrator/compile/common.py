"""Settings every backend derives the same way from a spec: environment variables, the
command user, the bind host, and `{{static:NAME}}` placeholders."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from orchestrator.spec.models import STATIC_PLACEHOLDER, EnvironmentV1
from orchestrator.spec.policy import Policy, passed_env

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAIN = "main"
"""The Compose service of the sandbox itself (every other one is an extra service)."""
KEEP_ALIVE = (
    "trap 'exit 0' TERM INT HUP; f=/dev/shm/.orchestrator-keep-alive; "
    'if rm -f "$f" && mkfifo -m 600 "$f" && exec 3<>"$f"; then rm -f "$f"; '
    "while :; do read -r _ <&3; done; fi; "
    "while :; do sleep 86400 & wait $!; done"
)
"""What keeps the main sandbox alive (the child of its init; templates/entry.sh.j2 runs
it too): a shell blocked reading a FIFO only it holds, so it has no child process and runs
no program of the image after the start. A reset kills everything else, and a root sandbox
that replaces a program the keep-alive would start again has nothing to replace. Where
`mkfifo` or /dev/shm is missing, it sleeps in a loop instead."""


def resolve_env(
    spec: EnvironmentV1,
    env_vars: Mapping[str, str] | None,
    host_env: Mapping[str, str] | None = None,
    bind_host: str | None = None,
    *,
    policy: Policy | None = None,
) -> dict[str, str]:
    """host (what the file's `env_passthrough` names *and* the caller's `policy` allows;
    ORCHESTRATOR_ALLOW_ENV when no policy is given) < file `env` < spawn `env_vars`."""
    host = os.environ if host_env is None else host_env
    out = passed_env(spec.env_passthrough, policy or Policy.from_env(), host)
    out.update(spec.env)
    out["ORCHESTRATOR_BIND_HOST"] = bind_host or spec.network.bind_host
    out.update(env_vars or {})
    return dict(sorted(out.items()))


def resolve_user(user: str, host_env: Mapping[str, str] | None = None) -> str:
    """ "host" -> HUID:HGID (or the caller's ids), "root" -> 0:0, otherwise as written."""
    if user == "root":
        return "0:0"
    if user == "host":
        host = os.environ if host_env is None else host_env
        uid = host.get("HUID") or str(os.getuid())
        gid = host.get("HGID") or str(os.getgid())
        return f"{uid}:{gid}"
    return user


def container_bind_host(spec: EnvironmentV1, network_mode: str) -> tuple[str, str | None]:
    """In bridge mode a loopback bind address cannot be reached through published ports,
    so it becomes 0.0.0.0. Returns (bind host, notice or None)."""
    asked = spec.network.bind_host
    if network_mode == "bridge" and asked in LOOPBACK:
        return "0.0.0.0", (
            f"network.bind_host {asked} rewritten to 0.0.0.0: in bridge mode a "
            "loopback address is unreachable through published ports"
        )
    return asked, None


def substitute_static(command: str, path_of: Callable[[str], str]) -> str:
    """Replace every `{{static:NAME}}` with the asset's path on this backend."""
    return STATIC_PLACEHOLDER.sub(lambda m: path_of(m.group(1)), command)
