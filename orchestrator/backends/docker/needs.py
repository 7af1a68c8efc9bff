"""What the engine must give a project, asked before anything of it is built or made: the
runtimes it names (gVisor's), and on Podman, whose Docker-compatible API does not do all
Docker does, a sandbox without network, limits that hold, and mount paths it reads right."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator import settings
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.docker.render import GVISOR_RUNTIME_ENV, CompiledProject
from orchestrator.errors import BackendUnavailable

NO_LIMITS_ENV = settings.ROOTLESS_WITHOUT_LIMITS.name


def require_runtimes(compiled: CompiledProject, name: str, engine: Engine) -> dict[str, list[str]]:
    """Refuse, before anything is made, a project whose runtime (gVisor's) the engine
    does not have: the engine would start no container of it, or fall back to none. The
    engine's runtimes with their arguments (asked only for a project that names one: else
    none)."""
    if not compiled.runtimes:
        return {}
    have = engine.runtimes()
    missing = [r for r in compiled.runtimes if r not in have]
    if missing:
        raise BackendUnavailable(
            f"{name}: `isolation: gvisor` needs the engine runtime "
            f"{', '.join(missing)}, which this engine does not have (it has "
            f"{', '.join(sorted(have)) or 'none'}): install gVisor's runsc and register it "
            "in the engine's daemon.json (scripts/bootstrap does both where it may; see "
            f"docs/isolation.md), or name the registered one in {GVISOR_RUNTIME_ENV}"
        )
    return have


PODMAN_UNMOUNTABLE = frozenset('",\n\r')
"""What Podman's API cannot take in a mount's source or target: it reads each mount back as
a CSV line of options (`"` breaks the parse, and `,` starts another option: a target
`/m,src=/etc` would mount the host's /etc)."""


def _mount_paths(compose_yaml: str, directory: Path | None) -> list[str]:
    """Every path a mount of the project names (the project folder, whose files the
    relative sources are; each volume's source and target, each tmpfs), for the check
    above. A file that cannot be read gives every string in it: nothing is let through
    unread."""
    paths = [str(directory)] if directory else []
    try:
        doc = YAML(typ="safe").load(compose_yaml) or {}
        services = doc.get("services") or {}
        for svc in services.values():
            for volume in svc.get("volumes") or []:
                if isinstance(volume, dict):
                    paths += [str(volume.get(k, "")) for k in ("source", "target")]
                else:
                    paths.append(str(volume))
            tmpfs = svc.get("tmpfs") or []
            paths += [str(t) for t in ([tmpfs] if isinstance(tmpfs, str) else tmpfs)]
    except (YAMLError, AttributeError, TypeError):
        paths.append(compose_yaml)
    return paths


def require_engine(
    compiled: CompiledProject, name: str, engine: Engine, directory: Path | None = None
) -> None:
    """Refuse, before anything is built or made, what Podman's Docker-compatible API does
    not do as Docker does (docs/isolation.md): it runs a sandbox without a network. The
    environment's networks would hold no egress rule there: Podman ignores `internal`, runs
    no healthcheck of its own and, beside Docker, has its bridges' traffic dropped; and it
    ignores `runtime:`. Rootless on cgroup v1 it ignores every resource limit: refused
    unless the caller accepts that (ORCHESTRATOR_ROOTLESS_WITHOUT_LIMITS=1). A mount whose
    source or target Podman would misread (the project folder `directory`, the workspace,
    the workdir, each mount and static asset) is refused by name."""
    facts = engine.facts()
    if facts.kind != "podman":
        return
    for path in _mount_paths(compiled.compose_yaml, directory):
        if PODMAN_UNMOUNTABLE & set(path):
            raise BackendUnavailable(
                f"{name}: Podman cannot mount {path!r}: its API reads a mount as a list split "
                "at commas (a comma in a path would add options, or name another host "
                "folder), and a double quote or a line break breaks it. Use paths without "
                "those characters (mounts, workdir, static assets, the state folder: "
                "ORCHESTRATOR_STATE_DIR), or run it on Docker"
            )
    networked = (
        compiled.network_mode != "none"
        or compiled.has_network
        or compiled.published
        or bool(compiled.infra)
    )
    unlimited = facts.rootless and facts.cgroup_v1 and not settings.ROOTLESS_WITHOUT_LIMITS.get()
    needs = [
        what
        for what, needed in (
            ("a network (services, published ports, or egress other than none)", networked),
            ("`isolation: gvisor` (Podman's API ignores `runtime:`)", bool(compiled.runtimes)),
            (
                "its resource limits (memory, cpus, pids), which rootless Podman on cgroup v1 "
                f"ignores without a word ({NO_LIMITS_ENV}=1 runs it without them)",
                unlimited,
            ),
        )
        if needed
    ]
    if needs:
        where = (
            " (on Podman a sandbox runs without network: network: {mode: none}, or the "
            "default egress none with no ports and no services)"
            if networked
            else ""
        )
        raise BackendUnavailable(
            f"{name}: this file needs {' and '.join(needs)}, which the Podman engine does "
            f"not give here{where}. Run it on Docker (see docs/isolation.md)"
        )
