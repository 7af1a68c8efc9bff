"""Mount merge rules.

Mounts merge by container path, lowest priority first: the workspace mount, then the file's
`mounts`, then mounts passed when spawning. Static assets are read-only at /static/<save_path>
and no other mount may shadow them. A mount target strictly inside `workdir` is an error
(it would hide part of the workspace).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SpecIssue
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import Mount

STATIC_ROOT = "/static"


@dataclass(frozen=True)
class ResolvedMount:
    source: Path
    target: str
    read_only: bool
    origin: str
    """Field path the mount came from, for error messages."""


def _inside(child: str, parent: str) -> bool:
    """True when `child` is strictly below `parent` (/workspace2 is not inside /workspace)."""
    parent = parent.rstrip("/") or "/"
    return child != parent and (child + "/").startswith(parent.rstrip("/") + "/")


def static_mounts(env: Environment) -> list[ResolvedMount]:
    return [
        ResolvedMount(
            (env.base_dir / a.path).resolve(),
            f"{STATIC_ROOT}/{a.save_path}",
            True,
            f"static_assets.{i}",
        )
        for i, a in enumerate(env.spec.static_assets)
    ]


def resolve_mounts(
    env: Environment, workspace: Path, extra: list[Mount]
) -> tuple[list[ResolvedMount], list[SpecIssue]]:
    """Merge every mount of the main sandbox; return them sorted by target, and the issues
    (the policy check of every source is the compiler's: `check_host_paths`)."""
    spec = env.spec
    issues: list[SpecIssue] = []
    merged: dict[str, ResolvedMount] = {}
    workdir = posixpath.normpath(spec.workdir)
    if spec.workspace.mount:
        merged[workdir] = ResolvedMount(workspace, workdir, False, "workspace")
    layers = [("mounts", spec.mounts), ("spawn mounts", extra)]
    for origin, mounts in layers:
        for i, spec_mount in enumerate(mounts):
            target = posixpath.normpath(spec_mount.target)
            where = f"{origin}.{i}" if origin == "mounts" else f"{origin}[{i}]"
            if _inside(target, workdir):
                issues.append(
                    SpecIssue(
                        env.source,
                        None,
                        None,
                        where + ".target",
                        f"mount target {target} is inside workdir {workdir}",
                        "put files inside the workspace instead, or mount outside the workdir",
                    )
                )
                continue
            source = Path(spec_mount.source).expanduser()
            if not source.is_absolute():
                source = workspace / source
            merged[target] = ResolvedMount(source.resolve(), target, spec_mount.read_only, where)
    statics = static_mounts(env)
    for s in statics:
        for m in merged.values():
            if m.target == s.target or _inside(s.target, m.target) or _inside(m.target, s.target):
                issues.append(
                    SpecIssue(
                        env.source,
                        None,
                        None,
                        m.origin,
                        f"mount at {m.target} would shadow static asset {s.target}",
                        "static assets are read-only and may not "
                        "be shadowed; choose another target",
                    )
                )
        if not s.source.exists():
            issues.append(
                SpecIssue(
                    env.source,
                    None,
                    None,
                    s.origin + ".path",
                    f"asset path does not exist: {s.source}",
                    "",
                )
            )
    user_mounts = [m for m in merged.values() if m.origin != "workspace"]
    for m in user_mounts:
        if not m.source.exists():
            issues.append(
                SpecIssue(
                    env.source,
                    None,
                    None,
                    m.origin + ".source",
                    f"mount source does not exist: {m.source}",
                    "create it first, or fix the path (relative paths resolve "
                    "against the workspace)",
                )
            )
    return sorted([*merged.values(), *statics], key=lambda m: m.target), issues
