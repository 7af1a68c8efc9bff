"""The record a backend leaves for `attach` (services/attach.py), and how an id is matched.

A backend that can be attached to records, when it starts an environment, what a runtime
needs besides the engine's own state: the backend's registered name, the environment (its
validated spec, the file's path and base folder), the engine, and the backend's own
`state` (JSON). The record is a file in the environment's project folder, created owner-only
(0600) and at most RECORD_LIMIT bytes, so it goes wherever the folder goes (`down`, the
reaper). `attach` reads it back and asks that backend's class (from the registry) for a
runtime: `Runtime.from_record`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError, ProjectNotFound

if TYPE_CHECKING:  # (loaded where a record is read: what matches ids loads no pydantic)
    from orchestrator.spec.loader import Environment

RECORD = "runtime.json"
"""In a project folder: what `attach` needs to give a runtime for it."""
RECORD_LIMIT = 8 * 1024 * 1024
"""Most bytes a record may have (a spec is bounded by ORCHESTRATOR_MAX_SPEC_BYTES)."""
ID_PREFIX = "orch-"
"""The start of every environment id."""
MIN_PREFIX = 6
"""Characters after ID_PREFIX a prefix needs to name an environment."""


@dataclass(frozen=True)
class Record:
    """What a backend left in a project folder for `attach`."""

    backend: str
    env: Environment
    host: str
    """The engine it runs on ("": the process's)."""
    state: dict[str, Any]
    """The backend's own, as it wrote it."""


def remember(
    folder: Path, backend: str, env: Environment, host: str, state: dict[str, Any]
) -> None:
    """Write the record of an environment just started (owner-only; replaced whole)."""
    data = {
        "backend": backend,
        "digest": env.digest,
        "host": host,
        "source": env.source,
        "base_dir": str(env.base_dir),
        "spec": env.spec.model_dump(mode="json", by_alias=True),
        "state": state,
    }
    text = json.dumps(data, sort_keys=True).encode()
    if len(text) > RECORD_LIMIT:  # cannot happen for a file within the spec limit
        return
    tmp = folder / f".{RECORD}.{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(text)
        os.replace(tmp, folder / RECORD)
    except OSError as exc:
        raise OrchestratorError(
            f"cannot write {folder / RECORD} ({exc.strerror}): free space or fix the "
            "permissions of the state folder"
        ) from exc


def recall(folder: Path) -> Record:
    """The record in a project folder; ProjectNotFound when there is none or it is unusable
    (a regular file of ours only, never through a link, at most RECORD_LIMIT bytes)."""
    what = f"the environment {folder.name}"
    data = recall_data(folder)
    from orchestrator.spec.loader import Environment
    from orchestrator.spec.models import EnvironmentV1

    try:
        env = Environment(
            spec=EnvironmentV1.model_validate(data["spec"]),
            source=str(data["source"]),
            base_dir=Path(data["base_dir"]),
        )
        return Record(str(data["backend"]), env, str(data["host"]), dict(data["state"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ProjectNotFound(
            f"{what}: its record cannot be read ({exc}); use `orchestrator down` and start it again"
        ) from None


def recall_data(folder: Path) -> dict[str, Any]:
    """The record in a project folder as it was written, not validated (what a caller that
    loads no pydantic may read of it); ProjectNotFound as `recall` says."""
    what = f"the environment {folder.name}"
    try:
        fd = os.open(folder / RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise ProjectNotFound(
            f"{what} has no record to attach to (started by an older orchestrator, or by a "
            "backend that cannot be attached to): use `orchestrator down` and start it again"
        ) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ProjectNotFound(f"{what}: its record is not a file of ours; not used")
        raw = fh.read(RECORD_LIMIT + 1)
    try:
        if len(raw) > RECORD_LIMIT:
            raise ValueError(f"more than {RECORD_LIMIT} bytes")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError("not an object")
        return data
    except (ValueError, TypeError) as exc:
        raise ProjectNotFound(
            f"{what}: its record cannot be read ({exc}); use `orchestrator down` and start it again"
        ) from None


def match_id(ref: str, names: list[str], *, prefix: str = ID_PREFIX) -> str:
    """The one name `ref` means: the full name, its short id (the 8 hex digits at the end),
    its environment's whole name (`orch-web` for `orch-web-0011aabb`), or a unique prefix
    with at least MIN_PREFIX characters after the `prefix` every name starts with. Nothing
    looser: `down o` or `down orch-z` must not take down whatever happens to start so."""
    if ref in names:
        return ref
    short = [n for n in names if n.rsplit("-", 1)[-1] == ref]
    significant = len(ref) - len(prefix) if ref.startswith(prefix) else 0
    prefixed = [
        n
        for n in names
        if n.startswith(ref) and (significant >= MIN_PREFIX or n.rsplit("-", 1)[0] == ref)
    ]
    matches = short or prefixed
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ProjectNotFound(f"{ref!r} matches several: {', '.join(matches)}; give more of it")
    known = ", ".join(names) or "none running"
    hint = ""
    if significant < MIN_PREFIX:
        hint = (
            f" (a prefix needs at least {MIN_PREFIX} characters after {prefix!r}, "
            "or the environment's whole name)"
        )
    raise ProjectNotFound(f"no environment {ref!r}{hint}; known: {known}")


__all__ = ["ID_PREFIX", "RECORD", "RECORD_LIMIT", "Record", "match_id", "recall", "remember"]
