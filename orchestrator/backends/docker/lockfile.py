"""Lock files on the Compose backend (spec/lockfile.py says what a lock is): made from the
project the file compiles to and the engine's ids (`make`), and checked against both before
anything starts (`pins`): a run gets each locked image by its id, whatever its name names by
then (said in a warning); a file changed since its lock, a build whose inputs or bases
changed, or an id the engine lacks is a SpecError naming what changed and the fix. The
gateway is never taken from a lock (it is this program's, not the file's): a difference is
reported, as one of the orchestrator's version or templates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator._resources import templates_version
from orchestrator._version import __version__
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.docker.buildcheck import problems
from orchestrator.backends.docker.buildplan import ImageBuild
from orchestrator.backends.docker.compiled import CompiledProject
from orchestrator.backends.docker.fingerprint import content_digest
from orchestrator.errors import SpecError, SpecIssue
from orchestrator.paths import read_regular
from orchestrator.spec.loader import Environment
from orchestrator.spec.lockfile import UPDATE, Lock, LockedBuild, LockedImage, lock_path, read_lock

DOCKERFILE_LIMIT = 1024 * 1024


@dataclass(frozen=True)
class Pins:
    """What a start under a lock runs: the main image's id ("" when it builds its own or no
    lock says), each service's, and what to tell the caller."""

    main: str = ""
    services: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def make(env: Environment, compiled: CompiledProject, engine: Engine) -> Lock:
    """The lock of `env` as the engine resolves it now (SpecError for an image it lacks: a
    lock names what the engine has)."""
    images, builds, gateway = {}, {}, None
    issues = []
    for where, image in compiled.images:
        ident = engine.image_id(image)
        if ident is None:
            issues.append(_missing(env, where, image))
        else:
            images[where] = LockedImage(image=image, id=ident)
    for plan in compiled.builds:
        if plan.ours:  # the gateway's: reported by a lock, never used from one
            ident = engine.image_id(plan.tag)
            gateway = LockedImage(image=plan.tag, id=ident) if ident else None
            continue
        bases = {}
        for base in bases_of(plan):
            ident = engine.image_id(base)
            if ident is None:
                issues.append(_missing(env, f"{plan.where}.dockerfile", base))
            else:
                bases[base] = ident
        builds[plan.where] = LockedBuild(inputs=inputs_of(env, plan), bases=bases)
    if issues:
        raise SpecError(issues)
    return Lock(
        file=Path(env.source).name,
        orchestrator=__version__,
        templates=templates_version(),
        images=images,
        builds=builds,
        gateway=gateway,
    )


def pins(env: Environment, compiled: Callable[[], CompiledProject], engine: Engine) -> Pins:
    """The images a start of `env` runs under its lock (none: no lock), after checking the
    lock against the file (`compiled`: its project, unpinned) and the engine."""
    path = lock_path(env.source)
    lock = read_lock(path) if path is not None else None
    if lock is None or path is None:
        return Pins()
    project = compiled()
    issues, warnings = [], []
    fix = UPDATE.format(file=env.source)
    named = dict(project.images)

    def issue(key: str, message: str, how: str = fix) -> None:
        issues.append(SpecIssue(str(path), field=key, message=message, fix=how))

    for where in sorted(set(named) | set(lock.images)):
        locked, image = lock.images.get(where), named.get(where)
        if locked is None or image is None or locked.image != image:
            was = f"locked as {locked.image}" if locked else "not in the lock"
            now = f"names {image}" if image else "names no image (a build, or no such service)"
            issue(f"images.{where}", f"the file's {where} {now}, {was}: the file changed")
            continue
        if not engine.has_image(locked.id):
            issue(
                f"images.{where}",
                f"the lock pins {image} as {locked.id}, which this engine does not have",
                f"put that image on the engine (docker load), or {fix}",
            )
            continue
        current = engine.image_id(image)
        if current != locked.id:
            warnings.append(
                f"{env.source}: {where}: {image} names {current or 'no image'} now; the lock's "
                f"{locked.id} runs ({fix})"
            )
    plans = {plan.where: plan for plan in project.builds if not plan.ours}
    for where in sorted(set(plans) | set(lock.builds)):
        plan, build = plans.get(where), lock.builds.get(where)
        if plan is None or build is None:
            issue(f"builds.{where}", f"{where} is {'not ' if plan is None else ''}a build of the "
                  f"file but {'is' if build else 'not'} in the lock: the file changed")  # fmt: skip
            continue
        try:
            changed = inputs_of(env, plan) != build.inputs
        except SpecError as exc:
            issues += exc.issues
            continue
        if changed:
            issue(
                f"builds.{where}",
                f"the inputs of {where} (its context, Dockerfile or args) changed since the lock",
            )
            continue
        for base in sorted(set(bases_of(plan)) | set(build.bases)):
            locked_id, current = build.bases.get(base), engine.image_id(base)
            if locked_id is None or current != locked_id:
                issue(
                    f"builds.{where}.bases",
                    f"{where} starts from {base}, which names {current or 'no image'} now and "
                    f"{locked_id or 'nothing'} in the lock",
                )
    warnings += _drift(env, lock, project)
    if issues:
        raise SpecError(issues)
    return Pins(
        main=lock.images["image"].id if "image" in named else "",
        services={
            where.removeprefix("services.").removesuffix(".image"): lock.images[where].id
            for where in named
            if where.startswith("services.") and where.endswith(".image")
        },
        warnings=tuple(warnings),
    )


def _drift(env: Environment, lock: Lock, project: CompiledProject) -> list[str]:
    """What differs and is reported, never refused: the gateway, orchestrator's version and
    templates."""
    said = []
    gateway = next((p.tag for p in project.builds if p.ours), None)
    if gateway is not None and lock.gateway is not None and lock.gateway.image != gateway:
        said.append(f"the egress gateway is {gateway} now, not the locked one")
    if lock.orchestrator != __version__ or lock.templates != templates_version():
        said.append(
            f"locked by orchestrator {lock.orchestrator} (templates {lock.templates}); this is "
            f"{__version__} (templates {templates_version()})"
        )
    return [f"{env.source}.lock: {s}" for s in said]


_hashed: dict[tuple[str, str], str] = {}
"""Content hashes already made in this process, by the build's tag (its fingerprint: any
change to its context, times and inodes included, makes another) and the lock's name: a
pool's spawns under one lock hash a context once, not once each."""


def inputs_of(env: Environment, plan: ImageBuild) -> str:
    """The hash of what the build is made of (fingerprint.content_digest), the lock beside
    the file left out; SpecError when its context is too large or cannot be read."""
    path = lock_path(env.source)
    skip = frozenset([path.name] if path is not None else [])
    key = (plan.tag, path.name if path is not None else "")
    if plan.complete and key in _hashed:  # (complete: the tag covers the whole context)
        return _hashed[key]
    try:
        digest = content_digest(plan.context, plan.dockerfile, plan.args, skip=skip)
        if plan.complete and len(_hashed) < 256:
            _hashed[key] = digest
        return digest
    except (OSError, ValueError) as exc:
        raise SpecError(
            SpecIssue(
                env.source,
                field=plan.where,
                message=f"cannot hash what the build is made of for a lock: {exc}",
                fix="make its context smaller (or readable), or do not lock this file",
            )
        ) from None


def bases_of(plan: ImageBuild) -> list[str]:
    """The images a build starts from (FROM, COPY --from), from its Dockerfile as read."""
    data = read_regular(plan.context / (plan.dockerfile or "Dockerfile"), DOCKERFILE_LIMIT)
    if data is None or len(data) > DOCKERFILE_LIMIT:
        return []  # (the build says what is wrong with it)
    _, images = problems(data.decode("utf-8", "replace"), plan.args)
    return sorted(set(images))


def _missing(env: Environment, where: str, image: str) -> SpecIssue:
    return SpecIssue(
        env.source,
        field=where,
        message=f"image {image} is not on this engine: a lock names the ids the engine has",
        fix="get it onto the engine first (docker pull or load, or build it), then "
        f"`orchestrator lock {env.source}`",
    )
