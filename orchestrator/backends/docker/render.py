"""Compile an Environment into a Compose project (compose.yaml + the sandbox entry script)
through the Jinja templates. Pure: same input, byte-identical output; runs nothing."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.backends.container.binds import Pins
from orchestrator.backends.container.copyin import (
    GATE,
    drops_privileges,
    entrypoint_words,
    gated_services,
    health_context,
)
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
    ResolvedMount,
    reserved_target_issues,
    resolve_mounts,
    service_workdir_issues,
    static_mounts,
    volume_issues,
)
from orchestrator.backends.container.seccomp import profile_text
from orchestrator.backends.container.templating import jinja as _jinja
from orchestrator.backends.docker import gateway
from orchestrator.backends.docker.binding import SECCOMP_FILE, Binding, volume_labels
from orchestrator.backends.docker.buildcheck import dockerfile_issues
from orchestrator.backends.docker.buildplan import (
    ImageBuild,
    build_paths,
    gateway_build,
    host_build_issue,
    image_build,
)
from orchestrator.backends.docker.network import (
    GATEWAY,
    RULES_FILE,
    RULES_MOUNT,
    NetPlan,
    egress_dns,
    egress_network,
    plan_network,
)
from orchestrator.errors import SpecIssue
from orchestrator.paths import make_folders, write_file
from orchestrator.sandbox.options import BuildChoice
from orchestrator.spec.egress import describe
from orchestrator.spec.limits import Limits, applied, pids_issues
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import Build, Mount, PortMap, Resources, Service
from orchestrator.spec.policy import (
    DEFAULT_CAPS,
    HOST_NETWORK_ENV,
    UNREADABLE_FIX,
    HardeningReport,
    Policy,
    check_hardening,
    check_host_paths,
    check_workspace,
    env_passthrough_warnings,
    raise_if,
)
from orchestrator.spec.ports import check_ports
from orchestrator.spec.resolve import LOOPBACK, MAIN, resolve_env, resolve_user


@dataclass(frozen=True)
class CompileOptions:
    project: str
    workspace: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    extra_mounts: Sequence[Mount] = ()
    extra_ports: Sequence[PortMap] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)
    subnet: str | None = None
    host_env: Mapping[str, str] | None = None
    platform: str = sys.platform
    policy: Policy = field(default_factory=Policy.from_env)
    main_image: str = ""
    """Run this image for the main sandbox instead of the file's image or build (a snapshot
    of a container's filesystem being resumed)."""
    service_images: Mapping[str, str] = field(default_factory=dict)
    """Run these images (by service) instead of the file's image or build (a suspended
    environment being woken); services not named run as the file says."""
    private_workspace: bool = False
    """`workspace` is the private one made for this run (or a stand-in for it), not the
    caller's: no file can name it, so it is no allowed root for host paths."""
    remote: bool = False
    """The engine may be another machine: nothing of this one is bind-mounted (the executor
    and the static assets are copied in once the containers run; the workspace lives in the
    main container), and a mount of a host folder is a spec error."""
    build: BuildChoice = "auto"
    """How the images the file builds are got (see `build_images`): "auto" builds one whose
    tag is missing, "always" builds through the engine's cache, "never" builds none."""
    leave_by: str = field(default_factory=egress_network)
    """An existing network egress leaves by (ORCHESTRATOR_EGRESS_NETWORK; empty: one made
    for each environment that needs it)."""
    resolvers: tuple[str, ...] = field(default_factory=egress_dns)
    """Resolvers of the gateway and of `all` containers (ORCHESTRATOR_EGRESS_DNS; empty:
    the engine's)."""
    pins: Pins | None = None
    """A start's pins (binding.py): host folders and files mounted as checked. None: their
    paths are rendered (`render`, `validate`, or a caller that accepted unpinned mounts)."""
    pin_refused: str = ""
    """Why this start cannot pin on its engine; every host mount is then a problem."""
    unpinned_warning: str = ""
    """Said when this start mounts host paths unpinned (the caller accepted it)."""


@dataclass(frozen=True)
class CompiledProject:
    project: str
    compose_yaml: str
    files: dict[str, str]
    """Extra files, relative to the project folder (the sandbox entry script)."""
    warnings: tuple[str, ...]
    mounts: tuple[ResolvedMount, ...]
    env: dict[str, str]
    user: str
    network_mode: str
    """bridge | host | none: how the main sandbox is networked after the rules applied."""
    has_network: bool
    """Whether the project defines its own network (needs an address pool)."""
    published: bool
    """Whether any port is published on the host."""
    folders: tuple[str, ...] = ()
    """Empty folders, relative to the project folder: each container's own transfer folder
    (IO_DIR/<service>, bind-mounted into that container alone)."""
    builds: tuple[ImageBuild, ...] = ()
    """The images it builds (the main one not when `main_image` replaces it)."""
    build: BuildChoice = "auto"
    """CompileOptions.build: how to get them before `up`."""
    infra: tuple[str, ...] = ()
    """The environment's own containers (egress gateway, port forwarder), by service."""
    runtimes: tuple[str, ...] = ()
    """Engine runtimes it needs beyond the default (gVisor's), which `up` checks first."""
    runtime_of: dict[str, str] = field(default_factory=dict)
    """Each container that needs one of `runtimes`, by service: `up` checks after that the
    engine did run it there (an engine that ignores `runtime:` must not pass for gVisor)."""
    egress: dict[str, str] = field(default_factory=dict)
    """Each networked container's egress after the caller's policy (none, all, entries)."""
    defuse: tuple[Path, ...] = ()
    """Host folders to make harmless after the run besides the workspace (binding.py)."""
    writable: tuple[Path, ...] = ()
    """Every host folder a container writes (a download never follows a link there)."""
    images: tuple[tuple[str, str], ...] = ()
    """(field, image) of each image it runs and does not build, for the check that the
    engine has them before anything starts (build.missing_images)."""
    pull: bool = False
    """The caller lets the engine pull missing images (Policy.allow_pull)."""
    source: str = ""
    """The environment file (for errors found after compiling)."""
    late_networks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Networks a service's container joins after it is created, before it starts, with no
    alias (a shared egress network: see network.py), by their engine names."""
    limits: dict[str, Limits] = field(default_factory=dict)
    """What each container is held to, by service (the environment's own too): what
    admission counts (`Runtime.requested`)."""

    def write(self, directory: Path) -> Path:
        """Write the project into `directory` (created, private); return compose.yaml's path.
        Every folder is 0700 and compose.yaml 0600, whatever the umask, but what containers
        read through a bind mount (SANDBOX_DIR, the gateway's rules): readable by any user
        of the container, behind the project folder that only we may enter."""
        make_folders(directory)
        make_folders(directory / SANDBOX_DIR, 0o755)
        for rel in self.folders:  # private: only root (the executor) passes in a container
            make_folders(directory / rel)
        for rel, text in self.files.items():
            make_folders((directory / rel).parent)
            write_file(directory / rel, text, 0o644)
        compose = directory / "compose.yaml"
        write_file(compose, self.compose_yaml)
        return compose


def _ports(ports: Sequence[PortMap]) -> list[str]:
    out = []
    for p in ports:
        host = "" if p.host is None else str(p.host)
        ip = f"[{p.host_ip}]" if ":" in p.host_ip else p.host_ip
        out.append(f"{ip}:{host}:{p.container}/{p.protocol}")
    return out


INFRA_LIMITS = Resources(memory="256m", cpus=0.5, pids=256)
"""What each of the environment's own containers (the egress gateway, the port forwarder)
is held to: counted by admission with the file's containers (`CompiledProject.limits`)."""


def _limits(r: Resources) -> dict[str, Any]:
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


def _build(
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


def _service(
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
        "ports": _ports(svc.ports),
        "user": user,
        "drops": drops_privileges(user, svc.workdir),
        "limits": _limits(svc.resources),
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


def _attach(context: dict[str, Any], name: str, net: NetPlan) -> None:
    """Put a container's networks, resolvers and proxy variables into its context."""
    context["networks"] = net.members.get(name, [])
    context["late"] = net.late.get(name, [])
    context["dns"] = list(net.dns.get(name, ()))
    context["dns_options"] = list(net.dns_options.get(name, ()))
    context["env"] = dict(sorted({**context["env"], **net.env.get(name, {})}.items()))
    if not net.direct_ports:
        context["ports"] = []


def _infra(net: NetPlan, opts: CompileOptions) -> list[dict[str, Any]]:
    """The contexts of the environment's own containers: both run the gateway image, with
    every capability dropped but those Squid needs to drop its own root."""
    out = []
    if net.gateway is not None:
        out.append(
            {
                **net.gateway,
                "command": ["proxy", *net.gateway["listen"]],  # where its clients reach it
                "late": net.late.get(GATEWAY, []),
                "caps": ["SETUID", "SETGID", "CHOWN"],
                "healthcheck": None,  # the start waits for it once (Project._wait_gateway)
                "mounts": [(RULES_FILE, RULES_MOUNT)],
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
        context["limits"] = _limits(INFRA_LIMITS)
        context["image"] = gateway.tag()
        context["labels"] = dict(sorted({**opts.labels, **context.get("labels", {})}.items()))
        context.setdefault("dns_options", [])
        context.setdefault("late", [])
    return out


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
    if mode == "bridge" and not spec.services and not main_ports and main_egress == "none":
        mode = "none"  # nothing to reach and nothing reachable: no network at all
        warnings += notes  # (plan_network says them for a sandbox it networks)
    has_network = bool(spec.services) or mode == "bridge"
    gated = gated_services(env, copied=opts.remote)
    issues += service_workdir_issues(env)
    services = [
        _service(env, name, svc, opts, report, roots, gated)
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
            svc_context["build"] = _build(
                env, spec.services[svc_context["name"]].build, svc_context, opts, refused, builds
            )
    main_limits = _limits(spec.resources)
    main_build = (
        None
        if opts.main_image
        else _build(env, spec.build, {"name": MAIN, "limits": main_limits}, opts, refused, builds)
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
        compose_ports={n: _ports(p) for n, p in port_specs.items()},
        subnet=opts.subnet,
        leave_by=opts.leave_by,
        resolvers=opts.resolvers,
    )
    warnings += net.warnings
    raise_if([], net.issues)
    binding = Binding(
        env,
        opts.pins,
        opts.pin_refused,
        private=opts.workspace if opts.private_workspace and spec.workspace.mount else None,
        warning=opts.unpinned_warning,
    )
    for svc_context in services:
        _attach(svc_context, svc_context["name"], net)
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
    infra = _infra(net, opts)
    main_context: dict[str, Any] = {
        "image": opts.main_image or spec.image,
        "build": main_build,
        "workdir": spec.workdir,
        "user": user,
        "env": container_env,
        "mounts": main_mounts,
        "seccomp": main_seccomp,
        "volumes": spec.volumes,
        "ports": _ports(main_ports) if net.direct_ports else [],
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
    entry = jinja.get_template("entry.sh.j2").render(project=opts.project, keep_alive=KEEP_ALIVE)
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
        late_networks={name: tuple(nets) for name, nets in net.late.items()},
        limits={
            **{name: Limits.of(r) for name, r in [(MAIN, spec.resources), *service_resources]},
            **{i["name"]: Limits.of(INFRA_LIMITS) for i in infra},
        },
    )
