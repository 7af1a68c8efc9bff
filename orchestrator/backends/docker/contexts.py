"""The template context of each container of a Compose project: a service of the file (its
mounts, hardening, ports, limits, build), the environment's own containers (the egress
gateway, the port forwarder), the networks each joins, and the engine runtime each runs on.
`compile_project` (render.py) puts them together."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.backends.container.copyin import (
    drops_privileges,
    entrypoint_words,
    health_context,
)
from orchestrator.backends.container.mounts import (
    ResolvedMount,
    reserved_target_issues,
    static_mounts,
    volume_issues,
)
from orchestrator.backends.docker import gateway
from orchestrator.backends.docker.buildcheck import dockerfile_issues
from orchestrator.backends.docker.buildplan import build_paths, host_build_issue, image_build
from orchestrator.backends.docker.compiled import CompileOptions
from orchestrator.backends.docker.network import GATEWAY, RULES_DIR, RULES_MOUNT, NetPlan
from orchestrator.backends.docker.relay import SECRETS_DIR, SECRETS_MOUNT
from orchestrator.errors import SpecIssue
from orchestrator.spec.limits import applied
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import Build, PortMap, Resources, Service
from orchestrator.spec.policy import (
    DEFAULT_CAPS,
    UNREADABLE_FIX,
    HardeningReport,
    check_hardening,
    check_host_paths,
)
from orchestrator.spec.ports import check_ports
from orchestrator.spec.resolve import resolve_user


def compose_ports(ports: Sequence[PortMap]) -> list[str]:
    """Published ports in Compose's short form (`ip:host:container/protocol`)."""
    out = []
    for p in ports:
        host = "" if p.host is None else str(p.host)
        ip = f"[{p.host_ip}]" if ":" in p.host_ip else p.host_ip
        out.append(f"{ip}:{host}:{p.container}/{p.protocol}")
    return out


INFRA_LIMITS = Resources(memory="256m", cpus=0.5, pids=1024)
"""What each of the environment's own containers (the egress gateway, the port forwarder)
is held to: counted by admission with the file's containers (`CompiledProject.limits`).
The gateway's plain-HTTP front runs a thread per connection (two while Squid serves one),
400 connections at most (templates/gateway/front.py)."""


def compose_limits(r: Resources) -> dict[str, Any]:
    """A container's limits in Compose's words: the file's, and the caller's default for
    each of memory, cpus and pids that it leaves out (spec/limits.py)."""
    r = applied(r)
    out: dict[str, Any] = {}
    if r.memory:
        out["mem_limit"] = r.memory
        out["memswap_limit"] = r.memory  # no swap: over the limit means OOM-killed, not slow
    if r.cpus:
        out["cpus"] = r.cpus
    if r.pids:
        out["pids_limit"] = r.pids
    if r.tmp:
        out["tmpfs"] = f"/tmp:size={r.tmp},mode=1777"
    if r.disk:
        out["storage_opt"] = {"size": r.disk}
    return out


def image_build_of(
    env: Environment,
    build: Build | None,
    container: dict[str, Any],
    opts: CompileOptions,
    refused: list[SpecIssue],
    problems: list[SpecIssue],
) -> dict[str, Any] | None:
    """The build of one container's image (its tag, and how it runs: buildplan.py), with
    what the caller's policy refuses added to `refused`, and its Dockerfile's problems to
    `problems`."""
    if build is None:
        return None
    plan = image_build(env, build, container["name"], opts.policy, container["limits"])
    issue = host_build_issue(env, plan.where, opts.policy)
    refused += [issue] if issue else []
    problems += dockerfile_issues(plan)
    return {"tag": plan.tag, "plan": plan}


def service_context(
    env: Environment,
    name: str,
    svc: Service,
    opts: CompileOptions,
    report: HardeningReport,
    roots: list[Path],
    gated: Collection[str],
) -> dict[str, Any]:
    mounts = []
    for i, m in enumerate(svc.mounts):
        where = f"services.{name}.mounts.{i}"
        found = env.host_path(m.source)
        if found.error is not None:
            report.issues.append(
                SpecIssue(
                    env.source,
                    field=where + ".source",
                    message=f"cannot look at mount source {m.source!r}: {found.error}",
                    fix=UNREADABLE_FIX,
                )
            )
            continue
        mounts.append(ResolvedMount(found.real, m.target, m.read_only, where))
    report.issues += reserved_target_issues(env, mounts)
    report.issues += volume_issues(env, f"services.{name}.", svc.volumes, mounts)
    report.issues += check_host_paths(
        env.source,
        [
            *((m.origin + ".source", m.source) for m in mounts),
            *build_paths(env, svc.build, f"services.{name}.build"),
        ],
        roots,
    )
    caps = check_hardening(env.source, f"services.{name}.", svc, opts.policy, report)
    check_ports(env.source, f"services.{name}.ports", svc.ports, opts.policy, report)
    command = svc.command
    user = resolve_user(svc.user, opts.host_env) if svc.user else None
    return {
        "name": name,
        "image": opts.service_images.get(name) or svc.image,
        "pinned": name in opts.service_images,  # (a snapshot's or a lock's: never pulled)
        "build": None,  # fingerprinted once the policy has passed its context (compile_project)
        "command": command,
        "command_is_list": isinstance(command, list),
        "entrypoint": entrypoint_words(svc.entrypoint),
        "depends_on": {
            dep: "service_started" if dep in gated and cond == "healthy" else f"service_{cond}"
            for dep, cond in sorted(svc.depends_on.items())
        },
        "gated": name in gated,
        "workdir": svc.workdir,
        "env": dict(sorted(svc.env.items())),
        "ports": compose_ports(svc.ports),
        "user": user,
        "drops": drops_privileges(user, svc.workdir),
        "limits": compose_limits(svc.resources),
        "caps": [*DEFAULT_CAPS, *caps],
        # the static assets are checked once, with the main sandbox's
        "mounts": [*(static_mounts(env) if svc.static_assets else []), *mounts],
        "volumes": svc.volumes,
        **health_context(svc, user),
        "job": svc.job,
    }


GVISOR_RUNTIME_ENV = settings.GVISOR_RUNTIME.name
"""The name gVisor's runsc is registered under in the engine (default runsc)."""


def gvisor_runtime() -> str:
    return settings.GVISOR_RUNTIME.get()


def runtime_of(isolation: str) -> str | None:
    """The engine runtime a container of that isolation runs under (None: the default)."""
    return gvisor_runtime() if isolation == "gvisor" else None


def attach_network(context: dict[str, Any], name: str, net: NetPlan) -> None:
    """Put a container's networks, resolvers and proxy variables into its context."""
    context["networks"] = net.members.get(name, [])
    context["late"] = net.late.get(name, [])
    context["dns"] = list(net.dns.get(name, ()))
    context["dns_options"] = list(net.dns_options.get(name, ()))
    context["env"] = dict(sorted({**context["env"], **net.env.get(name, {})}.items()))
    if not net.direct_ports:
        context["ports"] = []


def infra_contexts(
    net: NetPlan, opts: CompileOptions, *, secrets: bool = False
) -> list[dict[str, Any]]:
    """The contexts of the environment's own containers: both run the gateway image, with
    every capability dropped but those Squid needs to drop its own root (and the secrets
    relay to read its files as their owner). With `secrets`, the gateway mounts the
    relay's folder too."""
    out = []
    if net.gateway is not None:
        mounts = [(RULES_DIR, RULES_MOUNT)]
        if secrets:
            mounts.append((SECRETS_DIR, SECRETS_MOUNT))
        out.append(
            {
                **net.gateway,
                "command": ["proxy", *net.gateway["listen"]],  # where its clients reach it
                "late": net.late.get(GATEWAY, []),
                "caps": ["SETUID", "SETGID", "CHOWN"],
                "healthcheck": None,  # the start waits for it once (Project.wait_gateway)
                "mounts": mounts,
                "ports": [],
                "labels": {},
            }
        )
    if net.forwarder is not None:
        out.append(
            {
                **net.forwarder,
                "command": ["forward", *net.forwarder["args"]],
                "caps": ["NET_BIND_SERVICE"],
                "healthcheck": None,
                "mounts": [],
            }
        )
    for context in out:
        context["seccomp"] = False
        context["limits"] = compose_limits(INFRA_LIMITS)
        context["image"] = gateway.tag()
        context["labels"] = dict(sorted({**opts.labels, **context.get("labels", {})}.items()))
        context.setdefault("dns_options", [])
        context.setdefault("late", [])
    return out
