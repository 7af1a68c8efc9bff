"""Compile an Environment into a Compose project (compose.yaml + the sandbox entry script)
through the Jinja templates. Pure: same input, byte-identical output; runs nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.backends.container.copyin import GATE, gated_services
from orchestrator.backends.container.layout import (
    IO_DIR,
    IO_MOUNT,
    KEEP_ALIVE,
    SANDBOX_DIR,
    SANDBOX_MOUNT,
    USER_LABEL,
    container_bind_host,
)
from orchestrator.backends.container.mounts import (
    reserved_target_issues,
    resolve_mounts,
    service_workdir_issues,
    volume_issues,
)
from orchestrator.backends.container.seccomp import profile_text
from orchestrator.backends.container.templating import jinja as _jinja
from orchestrator.backends.docker.binding import SECCOMP_FILE, Binding, volume_labels
from orchestrator.backends.docker.buildplan import build_paths, gateway_build
from orchestrator.backends.docker.compiled import CompiledProject, CompileOptions
from orchestrator.backends.docker.contexts import (
    GVISOR_RUNTIME_ENV,
    INFRA_LIMITS,
    attach_network,
    compose_limits,
    compose_ports,
    gvisor_runtime,
    image_build_of,
    infra_contexts,
    runtime_of,
    service_context,
)
from orchestrator.backends.docker.network import RULES_FILE, plan_network
from orchestrator.backends.docker.relay import BUNDLE, CA_MOUNT, plan_secrets
from orchestrator.errors import SpecIssue
from orchestrator.spec.egress import describe
from orchestrator.spec.limits import Limits, pids_issues
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import PortMap
from orchestrator.spec.policy import (
    DEFAULT_CAPS,
    HOST_NETWORK_ENV,
    HardeningReport,
    check_hardening,
    check_host_paths,
    check_workspace,
    env_passthrough_warnings,
    raise_if,
)
from orchestrator.spec.ports import check_ports
from orchestrator.spec.resolve import LOOPBACK, MAIN, resolve_env, resolve_user

__all__ = [
    "GVISOR_RUNTIME_ENV",
    "CompileOptions",
    "CompiledProject",
    "compile_project",
    "gvisor_runtime",
    "runtime_of",
]


def _exposed(ports: Sequence[PortMap], where: str) -> list[str]:
    """Warnings for ports the caller publishes beyond this machine (a file's own are
    refused unless the caller allows them: spec/ports.py)."""
    return [
        f"WARNING: {where}: port {p.container} is published on {p.host_ip}, reachable "
        "from other machines; use 127.0.0.1 unless that is intended"
        for p in ports
        if p.host_ip not in LOOPBACK
    ]


def _network_mode(env: Environment, opts: CompileOptions, report: HardeningReport) -> str:
    mode = env.spec.network.mode
    if mode == "host" and not opts.policy.allow_host_network:
        report.issues.append(
            SpecIssue(
                env.source,
                field="network.mode",
                message="host networking is not allowed: the sandbox would share the host's "
                "network, including every service listening on 127.0.0.1",
                fix=f"use bridge with `ports`, or let the caller opt in with {HOST_NETWORK_ENV}=1",
            )
        )
    elif mode == "host":
        report.warnings.append(
            f"WARNING: network.mode host allowed by policy opt-in ({HOST_NETWORK_ENV}): the "
            "sandbox shares the host's network and reaches every host service"
        )
    if mode == "host" and not opts.platform.startswith("linux"):
        report.warnings.append(
            f"network.mode host works only on Linux; using bridge on {opts.platform}"
        )
        mode = "bridge"
    return mode


def compile_project(env: Environment, opts: CompileOptions) -> CompiledProject:
    """Apply the merge, network and policy rules and render the project. Raises SpecError
    (PolicyError for policy violations) listing every problem found."""
    spec = env.spec
    mounts, issues = resolve_mounts(env, opts.workspace, list(opts.extra_mounts))
    roots = opts.policy.mount_roots(
        env.base_dir, None if opts.private_workspace else opts.workspace
    )
    report = HardeningReport(warnings=list(env.notices))
    report.issues += check_workspace(opts.workspace) if spec.workspace.mount else []
    report.issues += reserved_target_issues(env, mounts)
    report.issues += volume_issues(env, "", spec.volumes, mounts)
    report.issues += check_host_paths(
        env.source,
        [
            *((m.origin + ".source", m.source) for m in mounts if m.origin != "workspace"),
            *build_paths(env, spec.build, "build"),
        ],
        roots,
    )
    main_caps = check_hardening(env.source, "", spec, opts.policy, report)
    report.issues += pids_issues(env.source, spec)
    report.warnings += env_passthrough_warnings(spec.env_passthrough, opts.policy)
    mode = _network_mode(env, opts, report)
    warnings = report.warnings
    main_ports = [*spec.network.ports, *opts.extra_ports]
    if mode != "bridge" and main_ports:
        warnings.append(f"network.ports ignored: the main sandbox uses {mode} networking")
        main_ports = []
    if main_ports:  # the file's own: refused beyond loopback unless the caller allows it
        check_ports(env.source, "network.ports", spec.network.ports, opts.policy, report)
    warnings += _exposed(main_ports[len(spec.network.ports) :], "ports")  # the caller's
    bind_host, notice = container_bind_host(spec, mode)
    if notice:
        warnings.append(notice)
    main_egress, notes = opts.policy.egress_of(spec, MAIN)
    setup_egress, _ = opts.policy.setup_egress_of(spec)  # (plan_network says its notes)
    if setup_egress not in (None, main_egress) and mode != "bridge":
        issues.append(
            SpecIssue(
                env.source,
                field="setup.egress",
                message=f"the sandbox uses {mode} networking: no egress applies to it, in "
                "setup or after",
                fix="drop setup.egress, or use network.mode bridge",
            )
        )
    if (
        mode == "bridge"
        and not spec.services
        and not main_ports
        and main_egress == "none"
        and setup_egress in (None, "none")
    ):
        mode = "none"  # nothing to reach and nothing reachable: no network at all
        warnings += notes  # (plan_network says them for a sandbox it networks)
    has_network = bool(spec.services) or mode == "bridge"
    gated = gated_services(env, copied=opts.remote)
    issues += service_workdir_issues(env)
    services = [
        service_context(env, name, svc, opts, report, roots, gated)
        for name, svc in sorted(spec.services.items())
    ]
    if opts.remote:  # no folder of this machine reaches the containers
        for m in [*mounts, *(m for s in services for m in s["mounts"])]:
            if not (m.origin == "workspace" or m.origin.startswith("static_assets")):
                issues.append(
                    SpecIssue(
                        env.source,
                        field=m.origin,
                        message=f"{m.source} is a folder of this machine; the engine "
                        "(ORCHESTRATOR_DOCKER_HOST) may be another one",
                        fix="ship files in static_assets or move them with rt.upload",
                    )
                )
        mounts = []
        for svc_context in services:
            svc_context["mounts"] = []
    raise_if(report.issues, issues)  # every problem in one error
    builds: list[SpecIssue] = []
    refused: list[SpecIssue] = []
    for svc_context in services:  # only now: a refused context is never walked or read
        if svc_context["name"] not in opts.service_images:
            svc_context["build"] = image_build_of(
                env, spec.services[svc_context["name"]].build, svc_context, opts, refused, builds
            )
    main_limits = compose_limits(spec.resources)
    main_build = (
        None
        if opts.main_image
        else image_build_of(
            env, spec.build, {"name": MAIN, "limits": main_limits}, opts, refused, builds
        )
    )
    raise_if(refused, builds)

    networked = [MAIN] if mode == "bridge" else []
    networked += [svc["name"] for svc in services]
    port_specs = {MAIN: main_ports, **{n: spec.services[n].ports for n in spec.services}}
    net = plan_network(
        env,
        opts.policy,
        networked=networked,
        ports=port_specs,
        compose_ports={n: compose_ports(p) for n, p in port_specs.items()},
        subnet=opts.subnet,
        leave_by=opts.leave_by,
        resolvers=opts.resolvers,
    )
    warnings += net.warnings
    raise_if([], net.issues)
    held, refused_secrets, notes = plan_secrets(
        env, opts.policy, proxied=net.proxied, egress=net.egress.get(MAIN), remote=opts.remote
    )
    warnings += notes
    raise_if([], refused_secrets)
    if held is not None:
        warnings += [
            f"services.{name} goes through the egress gateway too, which ends TLS to "
            f"{', '.join(held.hosts)} with a CA only the sandbox trusts: its requests there fail"
            for name in net.proxied
            if name != MAIN
        ]
    binding = Binding(
        env,
        opts.pins,
        opts.pin_refused,
        private=opts.workspace if opts.private_workspace and spec.workspace.mount else None,
        warning=opts.unpinned_warning,
    )
    for svc_context in services:
        attach_network(svc_context, svc_context["name"], net)
        svc_context["runtime"] = runtime_of(opts.policy.isolation_of(spec, svc_context["name"]))
        svc_context["mounts"], svc_context["seccomp"] = binding.container(
            svc_context["mounts"],
            gvisor=svc_context["runtime"] is not None,
            caps=svc_context["caps"],
        )
    main_runtime = runtime_of(opts.policy.isolation_of(spec, MAIN))
    main_mounts, main_seccomp = binding.container(
        mounts, gvisor=main_runtime is not None, caps=main_caps
    )
    raise_if([], binding.issues)
    warnings += binding.warnings
    user = resolve_user(spec.user, opts.host_env)
    container_env = resolve_env(spec, opts.env_vars, opts.host_env, bind_host, policy=opts.policy)
    container_env.update(net.env.get(MAIN, {}))
    if held is not None:
        container_env.update(held.sandbox_env(container_env))
    infra = infra_contexts(net, opts, secrets=held is not None)
    main_context: dict[str, Any] = {
        "image": opts.main_image or spec.image,
        "pinned": bool(opts.main_image),  # (a snapshot's or a lock's: never pulled)
        "build": main_build,
        "workdir": spec.workdir,
        "user": user,
        "env": container_env,
        "mounts": main_mounts,
        "seccomp": main_seccomp,
        "volumes": spec.volumes,
        "ports": compose_ports(main_ports) if net.direct_ports else [],
        "limits": main_limits,
        "caps": [*DEFAULT_CAPS, *main_caps],
        "network_mode": mode,
        "runtime": main_runtime,
        "networks": net.members.get(MAIN, []),
        "late": net.late.get(MAIN, []),
        "dns": list(net.dns.get(MAIN, ())),
        "dns_options": list(net.dns_options.get(MAIN, ())),
        "labels": dict(sorted({**opts.labels, USER_LABEL: user}.items())) if opts.labels else {},
    }
    context = {
        "project": opts.project,
        "labels": dict(sorted(opts.labels.items())),
        "main": main_context,
        "services": services,
        "infra": infra,
        "has_network": has_network,
        "internal": net.default_internal,
        "networks": net.networks,
        "volumes": sorted(
            {v.volume for v in spec.volumes}
            | {v.volume for svc in spec.services.values() for v in svc.volumes}
        ),
        "pinned": {
            name: {"device": v["device"], "labels": volume_labels(opts.labels, v["source"])}
            for name, v in binding.volumes.items()
        },
        "seccomp_path": f"./{SECCOMP_FILE}",
        "pull_policy": "missing" if opts.policy.allow_pull else "never",
        "subnet": opts.subnet,
        "sandbox_dir": SANDBOX_DIR,
        "sandbox_mount": SANDBOX_MOUNT,
        "io_dir": IO_DIR,
        "io_mount": IO_MOUNT,
        "remote": opts.remote,
        "keep_alive": KEEP_ALIVE,
        "gate": GATE,
    }
    jinja = _jinja()
    rendered = jinja.get_template("compose.yaml.j2").render(context)
    compose = "".join(line for line in rendered.splitlines(keepends=True) if line.strip())
    entry = jinja.get_template("entry.sh.j2").render(
        project=opts.project,
        keep_alive=KEEP_ALIVE,
        ca=CA_MOUNT if held is not None else "",
        bundle=BUNDLE,
    )
    names = [MAIN, *(s["name"] for s in services)]
    service_resources = [(n, spec.services[n].resources) for n in names[1:]]
    files = {f"{SANDBOX_DIR}/entry.sh": entry}
    if main_seccomp or any(svc["seccomp"] for svc in services):
        files[SECCOMP_FILE] = profile_text()
    if net.rules is not None:
        files[RULES_FILE] = net.rules
    folders = () if opts.remote else tuple(f"{IO_DIR}/{name}" for name in names)
    return CompiledProject(
        project=opts.project,
        compose_yaml=compose,
        files=files,
        warnings=tuple(warnings),
        mounts=tuple(mounts),
        env=container_env,
        user=user,
        network_mode=mode,
        has_network=has_network,
        published=bool(net.forwarder)
        or any([main_ports, *(spec.services[n].ports for n in spec.services)]),
        folders=folders,
        builds=tuple(b["plan"] for b in [main_build, *(s["build"] for s in services)] if b)
        + tuple(gateway_build(opts.policy) for _ in infra[:1]),
        infra=tuple(i["name"] for i in infra),
        runtimes=tuple(sorted({c["runtime"] for c in [main_context, *services] if c["runtime"]})),
        runtime_of={
            name: c["runtime"]
            for name, c in zip(names, [main_context, *services], strict=True)
            if c["runtime"]
        },
        egress={n: describe(e) for n, e in net.egress.items()},
        proxied=tuple(net.proxied),
        build=opts.build,
        defuse=tuple(binding.after),
        writable=tuple(binding.writable),
        images=tuple(
            (where, c["image"])
            for where, c in [
                ("image", main_context),
                *((f"services.{svc['name']}.image", svc) for svc in services),
            ]
            if c["image"] and not c["build"]
        ),
        pull=opts.policy.allow_pull,
        source=env.source,
        secrets=held,
        late_networks={name: tuple(nets) for name, nets in net.late.items()},
        limits={
            **{name: Limits.of(r) for name, r in [(MAIN, spec.resources), *service_resources]},
            **{i["name"]: Limits.of(INFRA_LIMITS) for i in infra},
        },
    )
