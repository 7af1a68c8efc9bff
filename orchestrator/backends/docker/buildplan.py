"""The images an environment builds: each build's tag (a fingerprint of what it reads, see
fingerprint.py), and what it runs under (build.py, buildcheck.py): the network, memory and
CPUs of the container the image is for, and whether the caller lets it pull its bases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.backends.docker import gateway
from orchestrator.backends.docker.fingerprint import fingerprint
from orchestrator.backends.docker.network import GATEWAY
from orchestrator.errors import SpecIssue
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import Build
from orchestrator.spec.policy import HOST_BUILD_ENV, ISOLATION_ENV, Policy, look_up
from orchestrator.spec.resolve import MAIN


def build_paths(env: Environment, build: Build | None, where: str) -> list[tuple[str, Path]]:
    """The host paths a build reads: its context and its Dockerfile."""
    if build is None:
        return []
    ctx = look_up(Path(build.context), env.base_dir).real
    dockerfile = ctx / (build.dockerfile or "Dockerfile")
    return [(f"{where}.context", ctx), (f"{where}.dockerfile", dockerfile)]


@dataclass(frozen=True)
class ImageBuild:
    """One image the environment builds, the tag it is built under, and how."""

    service: str
    tag: str
    """orchestrator-build/<env>-<service>:<fingerprint> (see fingerprint.py)."""
    context: Path
    dockerfile: str | None
    args: dict[str, str]
    complete: bool
    """The tag covers the whole context: an image under it is up to date. False: the
    context was too large to hash, and only the engine (its layer cache) can tell."""
    ours: bool = False
    """The environment's own image (the egress gateway's), not one of the file's: built
    when missing, whatever the file's build choice."""
    source: str = ""
    """The environment file, for errors found when the build runs."""
    where: str = "build"
    """The field that names the build (build, services.NAME.build)."""
    network: str = "none"
    """The network its RUN steps get: none, unless the container it is for may reach
    anything (`egress: all`: the engine's default)."""
    limits: tuple[tuple[str, Any], ...] = ()
    """mem_limit and cpus of the container it is for, which its RUN steps get too."""
    pull: bool = False
    """The caller lets the engine pull the images it starts from (Policy.allow_pull)."""


def gateway_build(policy: Policy) -> ImageBuild:
    """The build of the gateway image (see gateway.py): our own Dockerfile."""
    return ImageBuild(
        GATEWAY,
        gateway.tag(),
        gateway.context(),
        None,
        {},
        True,
        ours=True,
        network="default",
        pull=policy.allow_pull,
    )


def image_build(
    env: Environment,
    build: Build,
    service: str,
    policy: Policy | None = None,
    limits: dict[str, Any] | None = None,
) -> ImageBuild:
    """The build of one service, tagged by what it reads: a change of the Dockerfile, the
    build args or any entry of the context (path, mode, size, mtime) makes a new tag."""
    ctx = look_up(Path(build.context), env.base_dir).real
    args = dict(sorted(build.args.items()))
    digest, complete = fingerprint(ctx, build.dockerfile, args)
    tag = f"orchestrator-build/{env.name}-{service}:{digest[:20]}"
    policy = policy or Policy.from_env()
    egress, _ = policy.egress_of(env.spec, service)
    kept = tuple((k, v) for k, v in (limits or {}).items() if k in ("mem_limit", "cpus"))
    return ImageBuild(
        service,
        tag,
        ctx,
        build.dockerfile,
        args,
        complete,
        source=env.source,
        where="build" if service == MAIN else f"services.{service}.build",
        network="default" if egress == "all" else "none",
        limits=kept,
        pull=policy.allow_pull,
    )


def host_build_issue(env: Environment, where: str, policy: Policy) -> SpecIssue | None:
    """A build when the caller requires gVisor: its RUN steps would run on the host's
    kernel (the engine's builder has no gVisor), unless the caller allows that."""
    if policy.isolation != "gvisor" or policy.allow_host_build:
        return None
    return SpecIssue(
        env.source,
        field=where,
        message=f"the caller requires gVisor ({ISOLATION_ENV}=gvisor), and a build's RUN steps "
        "run on the host's kernel",
        fix="build the image beforehand and name it with `image:`, or let the caller allow "
        f"builds on the host's kernel: {HOST_BUILD_ENV}=1",
    )


def image_builds(env: Environment) -> list[ImageBuild]:
    """Every image the environment builds (none when it only uses images)."""
    builds = {MAIN: env.spec.build, **{n: s.build for n, s in env.spec.services.items()}}
    return [image_build(env, b, name) for name, b in builds.items() if b is not None]


def build_tag(env: Environment, service: str) -> str:
    """The tag one service's image is built under (ValueError: it builds none)."""
    [tag] = [b.tag for b in image_builds(env) if b.service == service]
    return tag


def build_tags(env: Environment) -> list[str]:
    """The tags of every image the environment builds (none when it only uses images)."""
    return [b.tag for b in image_builds(env)]
