"""Settings every backend derives the same way from a spec: environment variables, the
command user, the bind host, and `{{static:NAME}}` placeholders."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from orchestrator.spec.models import STATIC_PLACEHOLDER, EnvironmentV1

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAIN = "main"
KEEP_ALIVE = "trap 'exit 0' TERM INT HUP; while :; do sleep 86400 & wait $!; done"
"""The main sandbox's PID 1 where no entry script is mounted (a remote engine, a Swarm);
the same loop as templates/entry.sh.j2."""
"""The Compose service of the sandbox itself (every other one is an extra service)."""


def resolve_env(
    spec: EnvironmentV1,
    env_vars: Mapping[str, str] | None,
    host_env: Mapping[str, str] | None = None,
    bind_host: str | None = None,
) -> dict[str, str]:
    """host (only what the file passes through) < file `env` < spawn `env_vars`."""
    host = os.environ if host_env is None else host_env
    out: dict[str, str] = {}
    if "*" in spec.env_passthrough:
        out.update(host)
    else:
        out.update({k: host[k] for k in spec.env_passthrough if k in host})
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
