"""Migration of the legacy flat format (no `version`, `type: docker|local`) to v1.

The legacy format nests the container settings under `docker:` and the variables under
`environment:`. Each function here maps one legacy section; `migrate_legacy` returns the v1
mapping plus the legacy location of each v1 field, so errors still point at the right line.
"""

from __future__ import annotations

from typing import Any

from orchestrator.spec.policy import ENV_ENV

LEGACY_KEYS = frozenset({"type", "docker", "environment", "local"})

Loc = tuple[str | int, ...]


def looks_legacy(data: dict[str, Any]) -> bool:
    return "version" not in data and bool(LEGACY_KEYS & set(data))


def _mounts(extra: Any) -> list[Any]:
    """`extra_mounts` was either {host: container | {bind, mode}} or a list of "src:dst[:ro]"."""
    if isinstance(extra, dict):
        out: list[Any] = []
        for source, spec in extra.items():
            if isinstance(spec, dict):
                target = spec.get("bind", spec.get("target"))
                read_only = str(spec.get("mode", "rw")).lower() == "ro" or bool(
                    spec.get("read_only", False)
                )
            else:
                target, read_only = spec, False
            out.append({"source": str(source), "target": target, "read_only": read_only})
        return out
    if isinstance(extra, list):
        out = []
        for item in extra:
            if isinstance(item, str) and ":" in item:
                parts = item.split(":")
                out.append(
                    {"source": parts[0], "target": parts[1], "read_only": parts[2:] == ["ro"]}
                )
            else:
                out.append(item)
        return out
    return [] if extra is None else extra  # let validation report the wrong type


def _network(value: Any, notices: list[str]) -> dict[str, Any]:
    if value in (None, "", "bridge", "default"):
        return {"mode": "bridge", "egress": "all"}
    if value in ("host", "none"):
        return {"mode": value}
    notices.append(
        f"legacy network {value!r} (a named Docker network) became a private bridge network"
    )
    return {"mode": "bridge", "egress": "all"}


def _unmapped(
    out: dict[str, Any], where: dict[Loc, Loc], section: str, keys: dict[str, Any]
) -> None:
    """Legacy keys with no v1 meaning flow through as `section.key`, so validation reports
    each one at its own line instead of the migration dropping it unseen."""
    for key, value in keys.items():
        out.setdefault(f"{section}.{key}", value)
        where[(f"{section}.{key}",)] = (section, key)


def migrate_legacy(data: dict[str, Any]) -> tuple[dict[str, Any], dict[Loc, Loc], list[str]]:
    """Return (v1 mapping, v1 location -> legacy location, notices)."""
    notices: list[str] = []
    where: dict[Loc, Loc] = {}
    out: dict[str, Any] = {"version": 1}
    known = {"type", "name", "description", "docker", "environment", "setup", "commands", "local"}
    for key in data:
        if key not in known:
            out[key] = data[key]  # unknown keys flow through so validation names them
    out["name"] = data.get("name")
    where[("name",)] = ("name",)
    if "description" in data:
        out["description"] = data["description"]
    out["backend"] = data.get("type", "docker")
    where[("backend",)] = ("type",)

    docker = data.get("docker") or {}
    if isinstance(docker, dict):
        for old, new in (("image", "image"), ("workdir", "workdir"), ("user", "user")):
            if docker.get(old) is not None:
                out[new] = docker[old]
                where[(new,)] = ("docker", old)
        if "mount_workspace" in docker:
            out["workspace"] = {"mount": docker["mount_workspace"]}
            where[("workspace", "mount")] = ("docker", "mount_workspace")
        if "extra_mounts" in docker:
            out["mounts"] = _mounts(docker["extra_mounts"])
            where[("mounts",)] = ("docker", "extra_mounts")
        out["network"] = _network(docker.get("network"), notices)
        where[("network",)] = ("docker", "network")
        leftover = set(docker) - {
            "image",
            "workdir",
            "user",
            "mount_workspace",
            "extra_mounts",
            "network",
        }
        _unmapped(out, where, "docker", {k: docker[k] for k in sorted(leftover)})

    environment = data.get("environment") or {}
    if isinstance(environment, dict):
        if "env" in environment:
            out["env"] = environment["env"]
            where[("env",)] = ("environment", "env")
        if environment.get("include_os_env"):
            out["env_passthrough"] = ["*"]
            where[("env_passthrough",)] = ("environment", "include_os_env")
            notices.append(
                "legacy include_os_env: true became env_passthrough: ['*'], which passes only "
                f"the host variables the caller allows ({ENV_ENV}=NAME,... or "
                "Policy(allow_env={...})): none by default"
            )
    local = data.get("local")
    if isinstance(local, dict):  # nothing of it has a v1 meaning: name each key, drop none
        _unmapped(out, where, "local", local)
    elif local is not None:
        out["local"] = local
        where[("local",)] = ("local",)
    if "setup" in data:
        out["setup"] = data["setup"]
        where[("setup",)] = ("setup",)
    if "commands" in data:
        cmds = data["commands"]
        out["commands"] = {k: str(v) for k, v in cmds.items()} if isinstance(cmds, dict) else cmds
        where[("commands",)] = ("commands",)
    if out.get("user") is None and out["backend"] == "docker":
        out["user"] = "host"
    return out, where, notices
