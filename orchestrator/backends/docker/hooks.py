"""What the registry and the CLI ask of the docker backend class, without starting anything:
check a file (its policy and mount rules, compiled against a scratch workspace), prepare it
once before many spawns (build its images), render its Compose project."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from orchestrator.backends.container.engine import Engine, is_remote
from orchestrator.backends.container.identity import LABEL_DIGEST, LABEL_ENV, LABEL_MANAGED
from orchestrator.backends.docker import gateway, lockfile
from orchestrator.backends.docker.render import (
    CompiledProject,
    CompileOptions,
    compile_project,
    gvisor_runtime,
)
from orchestrator.errors import OrchestratorError
from orchestrator.paths import projects_dir
from orchestrator.sandbox.backend import Amounts
from orchestrator.sandbox.options import BuildChoice, SpawnOptions
from orchestrator.settings import engine_host
from orchestrator.spec.loader import Environment, require_main_image
from orchestrator.spec.lockfile import Lock
from orchestrator.spec.policy import Policy


def _scratch_compile(
    env: Environment, policy: Policy, project: str, workspace: Path | None = None
) -> CompiledProject:
    require_main_image(env)
    if workspace is not None:
        return compile_project(
            env, CompileOptions(project=project, workspace=workspace, policy=policy)
        )
    with tempfile.TemporaryDirectory(prefix="orch-check-") as ws:  # as a spawn's private one
        options = CompileOptions(
            project=project, workspace=Path(ws), policy=policy, private_workspace=True
        )
        return compile_project(env, options)


def check(env: Environment, policy: Policy, workspace: Path | None = None) -> list[str]:
    """Spec, policy and mount errors of the Compose project (raised), and its warnings; its
    lock checked against it and the engine, when it has one."""
    compiled = _scratch_compile(env, policy, "validate", workspace)
    locked = lockfile.pins(env, lambda: compiled, Engine.at(engine_host()))
    return [*compiled.warnings, *locked.warnings]


def prepare(env: Environment, policy: Policy, *, build: BuildChoice = "auto") -> None:
    """Check (its lock too), then get the images the file builds as `build` says, so spawns
    starting together do not each build them."""
    from orchestrator.backends.docker.start import build_images

    compiled = _scratch_compile(env, policy, f"orch-prepare-{os.getpid()}")
    lockfile.pins(env, lambda: compiled, Engine.at(engine_host()))
    build_images(env, dataclasses.replace(compiled, build=build))


def lock(env: Environment, policy: Policy) -> Lock:
    """The lock of `env` as this engine resolves it now (docker/lockfile.py)."""
    compiled = _scratch_compile(env, policy, f"orch-lock-{os.getpid()}")
    return lockfile.make(env, compiled, Engine.at(engine_host()))


def pins(env: Environment, policy: Policy, host: str) -> lockfile.Pins:
    """What a start on engine `host` runs under the file's lock (none: no lock)."""
    return lockfile.pins(
        env, lambda: _scratch_compile(env, policy, f"orch-pins-{os.getpid()}"), Engine.at(host)
    )


def requested(env: Environment, options: SpawnOptions) -> Amounts:
    """The limits of every container the spawn with `options` would run: the file's main
    sandbox and services, and the environment's own gateway and forwarder when its egress
    and ports need them, exactly as the project compiled for it says (compiled here as the
    spawn will compile it, but without walking any build context: the images stand in)."""
    require_main_image(env)
    built = {n for n, s in env.spec.services.items() if s.build is not None}
    host = options.host or engine_host()
    opts = CompileOptions(
        project=f"orch-{env.name}-admission",
        workspace=options.workspace or projects_dir() / "admission" / "workspace",
        private_workspace=options.workspace is None,
        extra_mounts=options.mounts,
        extra_ports=options.ports,
        env_vars=options.env_vars,
        policy=options.policy,
        main_image="admission" if env.spec.build is not None else "",
        service_images=dict.fromkeys(built, "admission"),
        remote=is_remote(host),
    )
    return Amounts.total(compile_project(env, opts).limits.values())


PLACEHOLDER_NOTE = (
    "# Workspace: a stand-in. `orchestrator up` and `run` without --workspace mount a private\n"
    "# folder made for each environment ({projects}/<id>/workspace); it is shown\n"
    "# here as {path}. Render with --workspace DIR to see a given folder instead.\n"
)
"""Said at the top of a rendering whose workspace stands in for a spawn's private one."""


def render(env: Environment, workspace: Path | None, policy: Policy) -> dict[str, str]:
    """compose.yaml first, then the project's other files (the sandbox entry script).
    `workspace` None: what a spawn without one runs, its private workspace shown by a
    stand-in in the project folder, and a comment at the top saying so."""
    require_main_image(env)
    project = f"orch-{env.name}-preview"
    labels = {LABEL_MANAGED: "1", LABEL_ENV: env.name, LABEL_DIGEST: env.digest}
    private = workspace is None
    ws = projects_dir() / project / "workspace" if workspace is None else workspace
    options = CompileOptions(
        project=project, workspace=ws, labels=labels, policy=policy, private_workspace=private
    )
    compiled = compile_project(env, options)
    note = PLACEHOLDER_NOTE.format(path=ws, projects=projects_dir()) if private else ""
    if private and not env.spec.workspace.mount:
        note = ""  # no workspace is mounted: nothing stands in
    return {"compose.yaml": note + compiled.compose_yaml, **compiled.files}


def doctor() -> list[tuple[str, str]]:
    """The egress gateway's image, and whether `isolation: gvisor` can run; on Podman,
    what its engine does not run (it lists runtimes it then ignores)."""
    try:
        facts = Engine.at().facts()
    except OrchestratorError as exc:
        return [("warn", f"could not ask the engine what it is: {exc}")]
    if facts.kind == "podman":
        checks = [
            (
                "warn",
                "Podman: sandboxes without network only; files with services, published "
                "ports, an egress allowlist or `isolation: gvisor` are refused here (they run "
                "on Docker; docs/isolation.md)",
            )
        ]
        if facts.rootless and facts.cgroup_v1:
            checks.append(
                (
                    "warn",
                    "rootless Podman on cgroup v1 ignores every resource limit: environments "
                    "are refused unless ORCHESTRATOR_ROOTLESS_WITHOUT_LIMITS=1 accepts that",
                )
            )
        return checks
    return [_gateway_check(), _gvisor_check()]


def _gvisor_check() -> tuple[str, str]:
    name = gvisor_runtime()
    try:
        registered = Engine.at().runtimes()
    except OrchestratorError as exc:
        return "warn", f"could not ask the engine for its runtimes: {exc}"
    args = registered.get(name)
    if args is None:
        return "warn", (
            f"gVisor: the engine has no runtime {name!r}, so `isolation: gvisor` is refused: "
            "install runsc and register it (scripts/bootstrap-gvisor; docs/isolation.md)"
        )
    platform = next((a.split("=", 1)[1] for a in args if a.startswith("--platform=")), "default")
    network = next((a.split("=", 1)[1] for a in args if a.startswith("--network=")), "sandbox")
    return "pass", (
        f"gVisor: runtime {name!r} registered (platform {platform}, network {network}): "
        "`isolation: gvisor` can run"
    )


def _gateway_check() -> tuple[str, str]:
    """The egress gateway's image: there, buildable with nothing fetched, or to be pulled."""
    engine = Engine.at()

    def present(image: str) -> bool:
        try:
            return engine.has_image(image)
        except (OrchestratorError, OSError):  # an engine that does not answer: doctor says so
            return False

    tag = gateway.tag()
    if present(tag):
        return "pass", f"egress gateway image {tag} present (allowlists and published ports)"
    base = gateway.base_image(present)
    if present(base):
        return "pass", (
            f"egress gateway image {tag} is built from {base} on first use (a few seconds, "
            "nothing fetched)"
        )
    return "warn", (
        f"egress gateway image {tag} is missing, and so is its base {base}: an environment "
        "with an egress allowlist or a published port is refused until it is there (images "
        "are pulled only when the caller allows it: ORCHESTRATOR_ALLOW_PULL=1, which then "
        "installs squid and socat from Debian); run scripts/build-images gateway (or set "
        f"{gateway.BASE_ENV} to a local Debian image that has them)"
    )
