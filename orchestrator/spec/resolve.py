"""Settings every backend derives the same way from a spec: environment variables, the
command user, the bind host, and `{{static:NAME}}` placeholders."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from orchestrator.errors import UsageError
from orchestrator.procutil import MAX_ID, UnknownUser, numeric_ids
from orchestrator.spec.models import STATIC_PLACEHOLDER, EnvironmentV1
from orchestrator.spec.policy import Policy, passed_env
from orchestrator.spec.published import LOOPBACK as LOOPBACK
from orchestrator.spec.published import MAIN as MAIN

IMAGE_USER = "image"
"""`user: image`: the image's USER, read by the backend once the sandbox's container exists."""


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
    """ "host" -> HUID:HGID (or the caller's ids), "root" -> 0:0, otherwise as written
    ("image" too: IMAGE_USER, which the backend resolves)."""
    if user == "root":
        return "0:0"
    if user == "host":
        host = os.environ if host_env is None else host_env
        uid = host.get("HUID") or str(os.getuid())
        gid = host.get("HGID") or str(os.getgid())
        try:  # the one reader of numeric ids: ASCII digits, within the engine's range
            ids = numeric_ids(f"{uid}:{gid}")
        except UnknownUser:
            ids = None
        if ids is None:
            raise UsageError(
                f"HUID:HGID {uid}:{gid} are not numeric ids: `user: host` runs as them, "
                f"numbers from 0 to {MAX_ID} (unset them for your own ids)"
            )
        return f"{uid}:{gid}"
    return user


def substitute_static(command: str, path_of: Callable[[str], str]) -> str:
    """Replace every `{{static:NAME}}` with the asset's path on this backend."""
    return STATIC_PLACEHOLDER.sub(lambda m: path_of(m.group(1)), command)
