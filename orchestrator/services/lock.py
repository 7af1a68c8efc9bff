"""`lock_environment`: write (or check) the lock of an environment file (spec/lockfile.py), as
its backend resolves it now. A lock that exists is replaced only on request (`update`): a
lock that no longer matches is an error saying what changed, as a start under it would be."""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SpecError, SpecIssue, UsageError
from orchestrator.sandbox.registry import runtime_names
from orchestrator.services.spawn import backend_class
from orchestrator.spec.loader import Environment, load_environment
from orchestrator.spec.lockfile import UPDATE, Lock, lock_path, lock_text, read_lock
from orchestrator.spec.policy import Policy


@dataclass(frozen=True)
class LockResult:
    """What `lock_environment` did."""

    path: Path
    """The lock file."""
    written: bool
    """False: the lock there was up to date, and was left as it was."""
    changes: tuple[str, ...] = ()
    """What the new lock changed of the one before (empty for a new one)."""


def lock_environment(
    env: Environment | str | Path,
    *,
    update: bool = False,
    backend: str | None = None,
    policy: Policy | None = None,
) -> LockResult:
    """Lock `env` (a file, or one loaded from a file): write FILE.lock beside it (beside the
    path given: a link's lock is beside the link) with what its images and builds resolve to
    now. Where a lock is already there it is left as it is when it still says the same;
    with `update` replaced; else a SpecError says what changed and the fix. A file there
    that is no lock is never replaced (SpecError). UsageError for an environment that is
    no file."""
    if not isinstance(env, Environment):
        env = load_environment(env, backends=runtime_names)
    path = lock_path(env.source)
    if path is None:
        raise UsageError("only an environment file can be locked: this one was given as text")
    policy = policy or Policy.from_env()
    new = backend_class(env, backend, policy=policy).make_lock(env, policy)
    old = read_lock(path)  # (one that is no lock is never replaced: SpecError, remove it)
    if old == new:
        return LockResult(path, written=False)
    changes = tuple(differences(old, new)) if old is not None else ()
    if old is not None and not update:
        raise SpecError(
            [
                SpecIssue(
                    str(path),
                    field="",
                    message=f"changed since it was locked: {change}",
                    fix=UPDATE.format(file=env.source),
                )
                for change in changes
            ]
        )
    _write(path, lock_text(new))
    return LockResult(path, written=True, changes=changes)


def differences(old: Lock, new: Lock) -> list[str]:
    """What `new` says that `old` did not, one sentence each."""
    said = []
    for key in sorted(set(old.images) | set(new.images)):
        was, now = old.images.get(key), new.images.get(key)
        if was != now:
            said.append(f"{key}: {_image(was)} -> {_image(now)}")
    for key in sorted(set(old.builds) | set(new.builds)):
        before, after = old.builds.get(key), new.builds.get(key)
        if before != after:
            said.append(f"{key}: built from {_build(before)} -> {_build(after)}")
    if old.gateway != new.gateway:
        said.append(f"gateway: {_image(old.gateway)} -> {_image(new.gateway)}")
    if (old.orchestrator, old.templates) != (new.orchestrator, new.templates):
        said.append(
            f"orchestrator {old.orchestrator} (templates {old.templates}) -> "
            f"{new.orchestrator} (templates {new.templates})"
        )
    return said or ["the lock's text differs"]


def _image(image: object) -> str:
    got = getattr(image, "image", None)
    return f"{got} as {getattr(image, 'id', '')}" if got else "nothing"


def _build(build: object) -> str:
    if build is None:
        return "nothing"
    bases = getattr(build, "bases", {})
    return f"inputs {getattr(build, 'inputs', '')[:12]} on " + (
        ", ".join(f"{k} {v}" for k, v in bases.items()) or "no base"
    )


def _write(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all: a new file beside it renamed over it (a link
    in its place is replaced, never followed)."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
