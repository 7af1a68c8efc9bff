"""Compile an Environment into a Swarm stack file (the swarm backend). Pure, like the Compose
compiler, and held to the same security policy. What Swarm cannot do is a spec error naming
the field: building on deploy, bind mounts of this machine's folders (the nodes do not have
them), host networking, published ports, process and disk limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.backends.container.copyin import (
    GATE,
    drops_privileges,
    entrypoint_words,
    gated_services,
    health_context,
)
from orchestrator.backends.container.layout import KEEP_ALIVE, USER_LABEL, container_bind_host
from orchestrator.backends.container.mounts import service_workdir_issues, static_mounts
from orchestrator.backends.container.templating import jinja as _jinja
from orchestrator.errors import SpecIssue
from orchestrator.spec.limits import applied
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import EnvironmentV1, Resources
from orchestrator.spec.policy import (
    DEFAULT_CAPS,
    HardeningReport,
    Policy,
    check_hardening,
    check_host_paths,
    env_passthrough_warnings,
    raise_if,
)
from orchestrator.spec.resolve import IMAGE_USER, MAIN, resolve_env, resolve_user

NO_NEW_PRIVILEGES = (
    "swarm backend: Swarm services do not take no-new-privileges, so a setuid program in the "
    "image can still raise a command's privileges inside its container (capabilities stay "
    "dropped)"
)


@dataclass(frozen=True)
class StackOptions:
    project: str
    labels: Mapping[str, str] = field(default_factory=dict)
    env_vars: Mapping[str, str] = field(default_factory=dict)
    host_env: Mapping[str, str] | None = None
    policy: Policy = field(default_factory=Policy.from_env)


@dataclass(frozen=True)
class CompiledStack:
    project: str
    stack_yaml: str
    warnings: tuple[str, ...]
    env: dict[str, str]
    user: str
    """Who commands run as in the main sandbox ("uid:gid" or a name of the image)."""
    healthchecked: tuple[str, ...]
    """Services with a healthcheck: the spawn waits for them to be healthy."""


def _limits(r: Resources) -> tuple[dict[str, Any], str | None]:
    """A task's limits: the file's memory and cpus, else the caller's defaults
    (spec/limits.py). Not its processes: Swarm services on this engine cannot limit them
    (a declared `pids` is refused above; the default one is not applied, docs/scale-out.md)."""
    full = applied(r)
    limits: dict[str, Any] = {"memory": full.memory, "cpus": str(full.cpus)}
    tmp = f"/tmp:size={r.tmp},mode=1777" if r.tmp else None
    return limits, tmp


def compile_stack(env: Environment, opts: StackOptions) -> CompiledStack:
    """Render the stack, or raise SpecError listing everything Swarm cannot do here."""
    spec = env.spec
    issues: list[SpecIssue] = []

    def refuse(where: str, message: str, fix: str) -> None:
        issues.append(
            SpecIssue(
                env.source,
                field=where,
                message=message,
                fix=fix,
            )
        )

    report = HardeningReport(warnings=[*env.notices, NO_NEW_PRIVILEGES])
    parts: list[tuple[str, Any]] = [
        ("", spec),
        *((f"services.{n}.", s) for n, s in spec.services.items()),
    ]
    for prefix, part in parts:
        if part.build is not None:
            refuse(
                prefix + "build",
                "Swarm does not build images when it deploys",
                "build the image first, make it reach every node (docs/scale-out.md) and "
                "name it in `image`",
            )
        if part.mounts:
            refuse(
                prefix + "mounts",
                "bind mounts name folders of this machine, which Swarm's nodes do not have",
                "ship files in static_assets or move them with rt.upload",
            )
        if isinstance(part, EnvironmentV1) and part.workdir is None:
            refuse(
                "workdir",
                "a Swarm task's image is read on the node that runs it, after placement",
                "name the workdir",
            )
        if isinstance(part, EnvironmentV1) and part.user == IMAGE_USER:
            refuse(
                "user",
                "a Swarm task's image is read on the node that runs it, after placement",
                "name the user (a name, uid or uid:gid)",
            )
        if part.volumes:
            refuse(
                prefix + "volumes",
                "a named volume lives on one node, and Swarm may place the containers that "
                "share it on others",
                "use the docker backend, or move files with rt.upload",
            )
        if part.resources.pids:
            refuse(
                prefix + "resources.pids",
                "Swarm services on this engine cannot limit processes",
                "remove it for the swarm backend (Docker Engine 23 adds the limit to Swarm)",
            )
        if part.resources.disk:
            refuse(
                prefix + "resources.disk",
                "Swarm services cannot limit a container's disk",
                "remove it for the swarm backend, or bound /tmp with resources.tmp",
            )
        ports = part.network.ports if prefix == "" else part.ports
        if ports:
            refuse(
                prefix + ("network.ports" if prefix == "" else "ports"),
                "the swarm backend publishes no ports",
                "reach the sandbox with rt.execute, or use the docker backend",
            )
    if spec.network.mode == "host":
        refuse(
            "network.mode",
            "Swarm tasks cannot share a node's network",
            "use bridge (the stack's own overlay network)",
        )

    egress = {}
    for name in [MAIN, *spec.services]:
        egress[name], notes = opts.policy.egress_of(spec, name)
        report.warnings += notes
    for name, got in egress.items():
        own = name in spec.services and spec.services[name].egress is not None
        where = f"services.{name}.egress" if own else "network.egress"
        if isinstance(got, tuple):
            refuse(
                where,
                "the swarm backend has no egress gateway to enforce an allowlist",
                "use none or all on the swarm backend, or the docker backend for an allowlist",
            )
        elif got != egress[MAIN]:
            refuse(
                where,
                "a Swarm stack has one network: every container has the same egress there",
                "give every container the same (none or all), or use the docker backend",
            )
    setup, notes = opts.policy.setup_egress_of(spec)
    report.warnings += notes
    if setup is not None and setup != egress[MAIN]:
        refuse(
            "setup.egress",
            "the swarm backend has no egress gateway to change what the sandbox reaches "
            "while setup runs",
            "drop setup.egress (or make it network.egress), or use the docker backend",
        )
    if spec.secrets:
        refuse(
            "secrets",
            "the swarm backend has no egress gateway to put the secrets' values in",
            "drop `secrets`, or use the docker backend",
        )
    for name in [MAIN, *spec.services]:
        if opts.policy.isolation_of(spec, name) == "gvisor":
            own = name in spec.services and spec.services[name].isolation is not None
            refuse(
                f"services.{name}.isolation" if own else "isolation",
                "a Swarm service cannot choose its engine runtime, so gVisor cannot run it"
                + (
                    " (the caller's policy asks for gvisor)"
                    if opts.policy.isolation == "gvisor"
                    else ""
                ),
                "use the docker backend for gvisor",
            )
    if spec.keep_after_cleanup:
        refuse(
            "keep_after_cleanup",
            "a removed Swarm stack keeps no containers",
            "remove it for the swarm backend",
        )

    # the static assets are copied in from this machine: the same path rules as mounts
    roots = opts.policy.mount_roots(env.base_dir, None)
    report.issues += check_host_paths(
        env.source, [(m.origin, m.source) for m in static_mounts(env)], roots
    )
    main_caps = check_hardening(env.source, "", spec, opts.policy, report)
    report.warnings += env_passthrough_warnings(spec.env_passthrough, opts.policy)
    user = resolve_user(spec.user, opts.host_env)
    bind_host, notice = container_bind_host(spec, "bridge")
    if notice:
        report.warnings.append(notice)
    container_env = resolve_env(spec, opts.env_vars, opts.host_env, bind_host, policy=opts.policy)
    labels = dict(sorted(opts.labels.items()))
    limits, tmp = _limits(spec.resources)
    main = {
        "image": spec.image,
        "workdir": spec.workdir,
        "env": container_env,
        "caps": [*DEFAULT_CAPS, *main_caps],
        "limits": limits,
        "tmp": tmp,
        "constraints": list(spec.placement),
        "labels": dict(sorted({**labels, USER_LABEL: user}.items())) if labels else {},
    }
    issues += service_workdir_issues(env)
    gated = gated_services(env, copied=True)  # nothing of this machine is mounted
    services = []
    for name, svc in sorted(spec.services.items()):
        caps = check_hardening(env.source, f"services.{name}.", svc, opts.policy, report)
        limits, tmp = _limits(svc.resources)
        svc_user = resolve_user(svc.user, opts.host_env) if svc.user else None
        services.append(
            {
                "name": name,
                "image": svc.image,
                "command": svc.command,
                "command_is_list": isinstance(svc.command, list),
                "entrypoint": entrypoint_words(svc.entrypoint),
                "gated": name in gated,
                "workdir": svc.workdir,
                "env": dict(sorted(svc.env.items())),
                "user": svc_user,
                "drops": drops_privileges(svc_user, svc.workdir),
                "caps": [*DEFAULT_CAPS, *caps],
                "limits": limits,
                "tmp": tmp,
                "constraints": list(svc.placement),
                "labels": labels,
                **health_context(svc, svc_user),
            }
        )
    raise_if(report.issues, issues)  # every problem in one error
    context = {
        "project": opts.project,
        "labels": labels,
        "main": main,
        "services": services,
        "entry": KEEP_ALIVE,
        "gate": GATE,
        "internal": egress[MAIN] != "all",
    }
    rendered = _jinja().get_template("stack.yaml.j2").render(context)
    stack = "".join(line for line in rendered.splitlines(keepends=True) if line.strip())
    return CompiledStack(
        project=opts.project,
        stack_yaml=stack,
        warnings=tuple(report.warnings),
        env=container_env,
        user=user,
        healthchecked=tuple(n for n, s in sorted(spec.services.items()) if s.healthcheck),
    )
