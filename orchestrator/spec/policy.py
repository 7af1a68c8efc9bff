"""The security policy: what no environment may ask for, checked before anything runs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import PolicyError, SpecIssue
from orchestrator.spec.models import Hardening

FORBIDDEN_CAPS = frozenset({"ALL", "SYS_ADMIN", "CAP_SYS_ADMIN", "CAP_ALL"})
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock")
ROOTS_ENV = "ORCHESTRATOR_ALLOWED_MOUNT_ROOTS"


@dataclass(frozen=True)
class Policy:
    """Mount sources must lie under one of `allowed_mount_roots` (after resolving `..` and
    symlinks). The defaults are the environment file's folder, the workspace and the system
    temp dir; extra roots come from ORCHESTRATOR_ALLOWED_MOUNT_ROOTS (os.pathsep-separated)."""

    extra_mount_roots: tuple[Path, ...] = field(default=())

    @classmethod
    def from_env(cls) -> Policy:
        raw = os.environ.get(ROOTS_ENV, "")
        return cls(tuple(Path(p) for p in raw.split(os.pathsep) if p))

    def mount_roots(self, env_dir: Path, workspace: Path | None) -> list[Path]:
        roots = [env_dir, Path(tempfile.gettempdir()), *self.extra_mount_roots]
        if workspace is not None:
            roots.append(workspace)
        return [r.resolve() for r in roots]


def check_hardening(source: str, prefix: str, opts: Hardening) -> list[SpecIssue]:
    """Refuse privileged mode, host namespaces, devices and dangerous capabilities."""
    issues = []

    def bad(name: str, message: str, fix: str) -> None:
        issues.append(SpecIssue(source, None, None, prefix + name, message, fix))

    if opts.privileged:
        bad("privileged", "privileged containers are not allowed", "remove `privileged: true`")
    for ns in ("pid", "ipc", "uts"):
        if getattr(opts, ns) == "host":
            bad(ns, f"the host {ns} namespace is not allowed", f"remove `{ns}: host`")
    if opts.devices:
        bad("devices", "host devices are not allowed", "remove `devices`")
    for cap in opts.cap_add:
        if cap.upper() in FORBIDDEN_CAPS:
            bad(
                "cap_add",
                f"capability {cap} is not allowed",
                "ask only for the narrow capability you need, e.g. NET_ADMIN",
            )
    return issues


def check_mount_sources(
    source: str, mounts: Iterable[tuple[str, Path]], roots: list[Path]
) -> list[SpecIssue]:
    """`mounts` are (field path, resolved host path) pairs."""
    issues = []
    for field_path, path in mounts:
        real = path.resolve()
        if str(real) in DOCKER_SOCKETS or real.name in ("docker.sock", "containerd.sock"):
            message = f"mounting the container engine's socket ({real}) is not allowed"
            fix = "a sandbox must never control the engine; remove this mount"
        elif not any(real == r or real.is_relative_to(r) for r in roots):
            allowed = ", ".join(str(r) for r in roots)
            message = f"mount source {real} is outside the allowed roots"
            fix = f"use a path under {allowed}, or add its folder to {ROOTS_ENV}"
        else:
            continue
        issues.append(SpecIssue(source, None, None, field_path, message, fix))
    return issues


def raise_if(issues: list[SpecIssue]) -> None:
    if issues:
        raise PolicyError(issues)
