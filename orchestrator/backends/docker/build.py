"""Get the images an environment builds before its project comes up, as `CompiledProject.build`
says: "auto" builds an image whose tag (a fingerprint of what its build reads, see
fingerprint.py) is missing, "always" builds through the engine's layer cache, "never" builds
nothing and names the image that is missing.

Spawns that start together build once: each tag has a lock in this process, and a spawn that
waited on it takes the image a build begun after its own request made. A context too large
to fingerprint is built through the engine's cache once per process ("auto"), again with
"always".

The builder's output is logged line by line on the logger BUILD_LOG (INFO), cleaned of
control characters and bounded in length: the CLI shows it under its spinner or copies it
to stderr; a library caller sees it by configuring that logger."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import procutil, settings
from orchestrator.backends.container.engine import (
    CallFailed,
    Engine,
    docker_errors,
    engine_call,
    up_timeout,
    wrap,
)
from orchestrator.backends.container.identity import SNAPSHOT_UNCLAIMED
from orchestrator.backends.docker import gateway
from orchestrator.backends.docker.buildcheck import (
    PROBLEM_FIX,
    Budget,
    absent,
    private_context,
    problems,
    read_dockerfile,
)
from orchestrator.backends.docker.buildplan import ImageBuild
from orchestrator.backends.docker.render import CompiledProject
from orchestrator.errors import (
    DockerError,
    OrchestratorError,
    SpecError,
    SpecIssue,
    StartupError,
    UsageError,
)
from orchestrator.paths import state_folder
from orchestrator.sandbox.options import BuildChoice
from orchestrator.spec.policy import PULL_ENV

if TYPE_CHECKING:
    from python_on_whales import Image

BUILD_LOG = "orchestrator.build"
"""Logger of the builder's output, one INFO record per line."""
log = logging.getLogger(BUILD_LOG)
LINE_LIMIT = 500
"""Longest builder line logged (characters); the rest is cut."""
READ_LIMIT = 64 * 1024
"""Longest stretch of output without a newline kept before it is cut into a line."""
TAIL_LINES = 30
"""Builder lines kept for the error of a failed build."""
SOURCE_LABEL = "org.orchestrator.build-source"
"""On each image built: which context and Dockerfile it was built from (a hash of them), so
that a new version replaces the older ones of the same build, and only those."""
CONTEXT_LABEL = "org.orchestrator.build-context"
"""On each image built: the folder of its context, which tells whose build it is (`docker
image ls --filter label=...`; a test run removes those of its own folders)."""
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass
class _Slot:
    """One tag's builds in this process."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    began: float | None = None
    """When its last successful build began (time.monotonic)."""


_slots: dict[tuple[str, str], _Slot] = {}
_slots_lock = threading.Lock()


def _slot(host: str, tag: str) -> _Slot:
    with _slots_lock:
        return _slots.setdefault((host, tag), _Slot())


def clean_line(raw: bytes) -> str:
    """One builder line as text safe to print on a terminal: escape sequences and control
    characters removed, at most LINE_LIMIT characters."""
    text = _CONTROLS.sub("", _ESCAPES.sub("", raw.decode("utf-8", "replace").replace("\t", " ")))
    text = text.rstrip()
    return text if len(text) <= LINE_LIMIT else text[: LINE_LIMIT - 1] + "…"


def get_images(compiled: CompiledProject, name: str, *, host: str = "") -> list[str]:
    """Get the images of `compiled` as its `build` choice says (on engine `host`, else the
    process's); return the tags built. UsageError when "never" finds one missing."""
    asked = time.monotonic()
    built = []
    for plan in compiled.builds:
        slot = _slot(host, plan.tag)
        wait = up_timeout() + 30
        if not slot.lock.acquire(timeout=wait):
            raise StartupError(
                f"image {plan.tag} of {name}: another build of it in this process has not "
                f"ended within {wait:g}s; see ORCHESTRATOR_UP_TIMEOUT"
            )
        try:
            if _needed(plan, compiled.build, slot, asked, name, host):
                began = time.monotonic()
                replaced = _ours_under(plan, host)
                _build(plan, name, host)
                slot.began = began
                built.append(plan.tag)
                _drop_older(plan, host)
                _drop_replaced(plan, replaced, host)
        finally:
            slot.lock.release()
    return built


def _needed(
    plan: ImageBuild, choice: BuildChoice, slot: _Slot, asked: float, name: str, host: str
) -> bool:
    if plan.ours:  # the environment's own image: the file's choice is not about it
        choice = "auto"
    if choice == "always":  # unless a build begun since we asked has made it
        return slot.began is None or slot.began < asked
    exists = _exists(plan.tag, host)
    if choice == "never":
        if not exists:
            raise UsageError(
                f"image {plan.tag} (the build of {plan.service!r} in {name}) does not exist "
                "and building is switched off (--no-build, build='never'): run once without "
                "--no-build, or with --build"
            )
        return False
    if not plan.complete:  # too large to fingerprint: the engine's cache decides, once
        return slot.began is None or not exists
    return not exists


def _drop_older(plan: ImageBuild, host: str) -> None:
    """Untag the older versions of this build (same repository and source label), so that
    each build keeps one image, not one per edit. Never forced: an image a container still
    uses stays; a failure leaves it too (it is only disk)."""
    repository = plan.tag.rpartition(":")[0]
    client = Engine.at(host).whales
    try:
        images = engine_call(
            "listing older builds",
            lambda: client.image.list(
                repository, filters=[("label", f"{SOURCE_LABEL}={_source(plan)}")]
            ),
        )
        older = {t for i in images for t in i.repo_tags if t.startswith(repository + ":")}
        for tag in sorted(older - {plan.tag}):
            with contextlib.suppress(OrchestratorError), docker_errors("removing a build"):
                client.image.remove(tag)
    except OrchestratorError as exc:
        log.debug("older builds of %s left: %s", repository, exc)


def _ours_under(plan: ImageBuild, host: str) -> str | None:
    """The id of the image `plan.tag` names now, if it is this build's (its source label);
    None for none, another's, or an engine that cannot say."""
    image = _inspected(plan.tag, host)
    labels = (image.config.labels or {}) if image is not None else {}
    return str(image.id) if image and labels.get(SOURCE_LABEL) == _source(plan) else None


def _drop_replaced(plan: ImageBuild, replaced: str | None, host: str) -> None:
    """Remove the image a rebuild took the tag from (`--build` over an unchanged
    fingerprint), which would otherwise stay behind untagged, one more per rebuild. Only
    while no tag names it (one someone else gave it keeps it), by id and never forced (one a
    container uses stays)."""
    if replaced is None or _ours_under(plan, host) in (replaced, None):
        return
    image = _inspected(replaced, host)
    if image is None or image.repo_tags:
        return
    client = Engine.at(host).whales
    with contextlib.suppress(OrchestratorError):  # not its untagged parents: one may be the
        engine_call(  # user's base image, moved on (the classic builder records it)
            "removing a replaced build", lambda: client.image.remove(replaced, prune=False)
        )


def _inspected(image: str, host: str) -> Image | None:
    """python-on-whales' Image for a tag or id, or None when the engine has none."""
    client = Engine.at(host).whales
    try:
        return engine_call("looking at a build", lambda: client.image.inspect(image))
    except OrchestratorError:
        return None


def _exists(tag: str, host: str) -> bool:
    """Whether the engine has the image: asked on its local socket where it has one (no
    CLI process), else through the CLI."""
    return Engine.at(host).has_image(tag)


def missing_images(compiled: CompiledProject, *, host: str = "") -> list[SpecIssue]:
    """Each image the project runs (not one it builds) that the engine does not have, at
    the field that names it, unless the caller lets the engine pull (Policy.allow_pull):
    asked before anything is made, so a missing image starts nothing and contacts no
    registry."""
    if compiled.pull:
        return []
    return [
        SpecIssue(
            compiled.source,
            field=where,
            message=f"image {image} is not on this engine, and images are never pulled unless "
            "the caller allows it",
            fix="get it onto the engine first (docker pull, docker load, or a `build:`), or let "
            f"the caller allow pulls: {PULL_ENV}=1",
        )
        for where, image in compiled.images
        if not _exists(image, host)
    ]


def _source(plan: ImageBuild) -> str:
    """What stays the same across the versions of one build: its context, Dockerfile and
    args (two files that differ only in args must not untag each other's image)."""
    where = json.dumps([str(plan.context), plan.dockerfile or "Dockerfile", plan.args])
    return hashlib.sha256(where.encode()).hexdigest()[:20]


BUILDS_DIR = "builds"
"""In the state folder: each build's private copy of its context, removed after it."""


def _build(plan: ImageBuild, name: str, host: str) -> None:
    """Build one image with `docker build` from a private copy of its context whose
    Dockerfile was checked (buildcheck.py), its output logged; bounded by the up timeout."""
    if plan.ours:  # the base is picked now, by what this engine has (see gateway.py)
        base = gateway.base_image(lambda tag: _exists(tag, host))
        if not plan.pull and not _exists(base, host):
            raise UsageError(gateway.missing_base(base))
        plan = dataclasses.replace(plan, args={**plan.args, "BASE": base})
    folder = _private_folder()
    try:
        context, dockerfile = _checked_copy(plan, folder, host)
        argv = Engine.at(host).build_argv(
            plan.tag,
            labels={
                SOURCE_LABEL: _source(plan),
                CONTEXT_LABEL: str(plan.context),
                **SNAPSHOT_UNCLAIMED,  # (no LABEL of the file passes it off as a snapshot)
            },
            dockerfile=dockerfile,
            network=plan.network,
            limits=dict(plan.limits),
            args=plan.args,
            context=context,
        )
        log.info("building %s for %s", plan.tag, name)
        try:
            _run_build(argv, plan, name)
        except DockerError as exc:
            if not store_race(str(exc)):
                raise
            log.info("%s: an image its build used was removed meanwhile; building again", plan.tag)
            _run_build(argv, plan, name)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_STORE_RACE = re.compile(
    r"/image/\S+/imagedb/content/sha256/[0-9a-f]{64}: no such file or directory"
)


def store_race(said: str) -> bool:
    """Whether a build failed because an image it used (the classic builder's cache of a
    step another build made alike) was removed as it went: the engine's own race, which
    another process removing its images on a shared engine brings about (seen in CI once);
    built again, the build takes no such image."""
    return _STORE_RACE.search(said) is not None


def _private_folder() -> Path:
    """A new private folder for one build's copy, named after this process (with its start
    time), beside those of builds whose process is gone, which it removes first: a build
    killed half-way leaves its copy for the next one to sweep."""
    root = state_folder(BUILDS_DIR)
    for old in root.iterdir():
        pid, _, rest = old.name.partition("-")
        started, _, _ = rest.partition("-")
        if pid.isdigit() and not procutil.alive(int(pid), started):
            shutil.rmtree(old, ignore_errors=True)
    me = f"{os.getpid()}-{procutil.process_start(os.getpid())}-"
    return Path(tempfile.mkdtemp(prefix=me, dir=root))


def _checked_copy(plan: ImageBuild, folder: Path, host: str) -> tuple[Path, Path]:
    """The build's context and Dockerfile copied privately, the copy's Dockerfile checked:
    nothing it refuses, every image it starts from on the engine (unless the caller lets it
    pull), and none with ONBUILD steps of its own."""
    budget = Budget(settings.BUILD_CONTEXT_LIMIT.get(), up_timeout())
    try:
        context, dockerfile = private_context(
            plan.context, plan.context / (plan.dockerfile or "Dockerfile"), folder, budget
        )
        text = read_dockerfile(dockerfile)
    except (OSError, ValueError) as exc:
        raise SpecError(SpecIssue(plan.source, field=plan.where, message=str(exc))) from None
    found, images = problems(text, plan.args)
    issues = [
        SpecIssue(plan.source, field=f"{plan.where}.dockerfile", message=p, fix=PROBLEM_FIX)
        for p in found
    ]
    missing = [] if plan.pull else absent(images, lambda tag: _exists(tag, host))
    for image in missing:
        issues.append(
            SpecIssue(
                plan.source,
                field=f"{plan.where}.dockerfile",
                message=f"the build starts from {image}, which this engine does not "
                "have, and images are never pulled unless the caller allows it",
                fix="get it onto the engine first (docker pull, docker load, or a build), "
                f"or let the caller allow pulls: {PULL_ENV}=1",
            )
        )
    for image in (i for i in dict.fromkeys(images) if i not in missing):
        if _onbuild(image, host):
            issues.append(
                SpecIssue(
                    plan.source,
                    field=f"{plan.where}.dockerfile",
                    message=f"the build starts from {image}, whose ONBUILD steps would run "
                    "in this build, unseen by its checks",
                    fix="start from an image without ONBUILD steps",
                )
            )
    if issues:
        raise SpecError(issues)
    return context, dockerfile


def _onbuild(image: str, host: str) -> bool:
    """Whether the image (there, or about to be pulled: then not known) has ONBUILD steps."""
    found = _inspected(image, host)
    return found is not None and bool(found.config.on_build)


def _run_build(argv: list[str], plan: ImageBuild, name: str) -> None:
    """The classic builder (DOCKER_BUILDKIT=0: the one that takes --network, --memory and
    --cpu-quota for its RUN steps), its output logged line by line."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with docker_errors(f"building image {plan.tag} of {name}"):
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )
    watchdog = threading.Timer(up_timeout() + 10, proc.kill)  # `timeout` may be absent
    watchdog.daemon = True
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in _lines(proc.stdout.fileno()):
            tail.append(line)
            log.info("%s", line)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)  # its output ended: it is exiting
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()  # killed: it ends at once
        if proc.stdout is not None:
            proc.stdout.close()
    code = proc.returncode
    if code != 0:
        failed = CallFailed(argv, code, None, "\n".join(tail))
        raise wrap(f"building image {plan.tag} of {name}", failed) from None


def _lines(fd: int) -> Iterator[str]:
    """Cleaned lines of what `fd` gives until its end; a stretch without a newline longer
    than READ_LIMIT is cut into a line of its own, so memory stays bounded."""
    partial = b""
    while chunk := os.read(fd, 65536):
        parts = (partial + chunk).replace(b"\r", b"\n").split(b"\n")
        partial = parts.pop()
        if len(partial) > READ_LIMIT:
            parts, partial = [*parts, partial[:READ_LIMIT]], b""
        for part in parts:
            if line := clean_line(part):
                yield line
    if line := clean_line(partial):
        yield line
