"""The readers of a Compose service's values (words, durations, sizes, environments, ports)
and the keys a service may carry without effect (`IGNORED`) or not at all (`REFUSED`)."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.spec.compose.model import MAX_PORT_RANGE, MAX_PORTS


def words(value: Any) -> list[str] | str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value)


def duration(value: Any) -> str | None:
    """A Compose duration (1m30s, 500ms, 10) as one v1 unit (90s, 500ms, 10s)."""
    if value is None:
        return None
    text = str(value).strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return f"{text}s"
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s|us|ns)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return text  # the schema names the bad value
    scale = {"h": 3600000.0, "m": 60000.0, "s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 1e-6}
    ms = sum(float(n) * scale[u] for n, u in parts)
    return f"{ms / 1000:g}s" if ms >= 1000 and ms % 1000 == 0 else f"{ms:g}ms"


def size(value: Any) -> str | None:
    """A Compose size (512m, 1gb, 2GiB, 1073741824) as a v1 size."""
    if value is None:
        return None
    text = str(value).strip()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([bkmgBKMG])?(?:i?[bB])?", text)
    return f"{m.group(1)}{(m.group(2) or '').lower()}" if m else text


def env_pairs(value: Any) -> tuple[dict[str, Any], list[str]]:
    """`environment:` as a mapping or a list of KEY=VALUE; a bare KEY (take it from the host)
    comes back in the second list."""
    passed: list[str] = []
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if v is None:
                passed.append(str(k))
            else:  # Compose writes a YAML boolean as its text
                out[str(k)] = str(v).lower() if isinstance(v, bool) else v
        return out, passed
    out = {}
    for item in value or []:
        key, sep, val = str(item).partition("=")
        if sep:
            out[key] = val
        else:
            passed.append(key)
    return out, passed


PORT = re.compile(
    r"^(?:(?:\[?(?P<ip>[0-9a-fA-F.:]+?)\]?:)?(?P<host>[0-9]+(?:-[0-9]+)?)?:)?"
    r"(?P<container>[0-9]+(?:-[0-9]+)?)(?:/(?P<proto>tcp|udp))?$"
)


PORT_KEYS = frozenset({"target", "published", "host_ip", "protocol"})
"""The long form's keys that are kept (`mode`, `name`, `app_protocol` change nothing here)."""


def port_maps(value: Any, limit: int) -> tuple[list[Any], list[str]]:
    """Compose ports (short or long form) as v1 PortMaps, at most `limit` of them (ValueError
    past it); the second list says what could not be read (the schema sees the raw value
    then)."""
    out: list[Any] = []
    bad: list[str] = []

    def add(entry: Any) -> None:
        if len(out) >= limit:
            raise ValueError(f"more than {MAX_PORTS} ports published in all")
        out.append(entry)

    for item in value or []:
        if isinstance(item, dict):
            published = str(item.get("published") or "")
            if "-" in published.strip("-"):
                raise ValueError(f"published range {published} in the long form: use the short")
            entry: dict[str, Any] = {"container": item.get("target")}
            if published:
                entry["host"] = int(published)
            if item.get("host_ip"):
                entry["host_ip"] = item["host_ip"]
            if item.get("protocol"):
                entry["protocol"] = item["protocol"]
            add(entry)
            continue
        m = PORT.match(str(item))
        if m is None:
            bad.append(str(item))
            add(item)
            continue
        c_lo, _, c_hi = m.group("container").partition("-")
        h = m.group("host")
        h_lo, _, h_hi = h.partition("-") if h else ("", "", "")
        count = int(c_hi or c_lo) - int(c_lo) + 1
        if count < 1 or count > MAX_PORT_RANGE or (h_hi and int(h_hi) - int(h_lo) + 1 != count):
            bad.append(str(item))
            add(item)
            continue
        for k in range(count):
            entry = {"container": int(c_lo) + k}
            if h_lo:
                entry["host"] = int(h_lo) + k
            if m.group("ip"):
                entry["host_ip"] = m.group("ip")
            if m.group("proto"):
                entry["protocol"] = m.group("proto")
            add(entry)
    return out, bad


def is_host_path(source: str) -> bool:
    return source.startswith((".", "/", "~")) or source == ""


IGNORED: dict[str, str] = {
    "container_name": "each environment names its own containers, so that many can run at once",
    "hostname": "a container is reached by its service name",
    "domainname": "a container is reached by its service name",
    "restart": "an environment lives as long as its owner; a service that exits fails the "
    "start, or shows as lost",
    "labels": "the environment's containers carry its own labels",
    "logging": "each container's log is json-file, 16 MB at most (`orchestrator logs`)",
    "stdin_open": "each command gets its own stdin through exec",
    "tty": "each command asks for a terminal itself (`orchestrator shell`)",
    "platform": "images are built and run for this machine",
    "stop_signal": "an environment's containers are removed, not stopped gracefully",
    "stop_grace_period": "an environment's containers are removed, not stopped gracefully",
    "pull_policy": "images are never pulled: they must be on the engine or built",
    "extra_hosts": "host names are not added: services reach each other by name",
    "dns": "name resolution is the environment's own (it enforces egress)",
    "dns_search": "name resolution is the environment's own (it enforces egress)",
    "dns_opt": "name resolution is the environment's own (it enforces egress)",
    "mac_address": "addresses are the engine's",
    "ulimits": "limits are set by `resources` (memory, cpus, pids)",
    "shm_size": "/dev/shm keeps the engine's default size",
    "group_add": "supplementary groups come from the image's /etc/group",
    "read_only": "the root filesystem stays writable (nothing of the host is in it)",
    "oom_score_adj": "out-of-memory handling is the engine's",
    "oom_kill_disable": "out-of-memory handling is the engine's",
    "mem_reservation": "only limits are set, not reservations",
    "memswap_limit": "swap follows the memory limit",
    "mem_swappiness": "swap follows the memory limit",
    "cpu_shares": "only `cpus` limits are set",
    "cpu_quota": "only `cpus` limits are set",
    "cpu_period": "only `cpus` limits are set",
    "cpuset": "only `cpus` limits are set",
    "cpu_count": "only `cpus` limits are set",
    "cpu_percent": "only `cpus` limits are set",
    "blkio_config": "block-device weights are the engine's",
    "storage_opt": "storage is the engine's",
    "annotations": "not used by the engine",
    "attach": "logs are read with `orchestrator logs`",
    "develop": "a development-only setting",
    "scale": "one container per service",
    "secrets": "secrets are not mounted; pass values in `environment`",
    "configs": "configs are not mounted; use a bind mount",
    "links": "a container is reached by its service name",
    "external_links": "a container is reached by its service name",
    "volumes_from": "each container has only its own mounts",
}
"""Service keys that have no effect here, and why."""

REFUSED: dict[str, tuple[str, str]] = {
    "userns_mode": ("a host user namespace takes away the sandbox's", "remove it"),
    "cgroup_parent": ("a cgroup chosen by the file escapes the environment's limits", "remove it"),
    "cgroup": ("the host's cgroup namespace", "remove it"),
    "sysctls": ("kernel settings are not set by files", "remove them"),
    "device_cgroup_rules": ("device access is refused", "remove it"),
    "gpus": ("devices are not given to sandboxes", "remove it"),
    "isolation": ("Windows isolation", "remove it"),
    "credential_spec": ("Windows credentials", "remove it"),
}
"""Service keys that would weaken the sandbox and have no v1 field for the policy, with the
reason and the fix."""
