"""`attach(id)`: a live Runtime for an environment left running (by `orchestrator up`, a
pool, or a process still using it), of the backend that started it, from the record that
backend left in its project folder (sandbox/record.py).

What an attached runtime does at the end:
- leaving a `with` block, or `detach()`, leaves the environment running, as it found it;
- `cleanup()` removes it, as `orchestrator down` does;
- `kill()` kills its processes (then `cleanup()` removes it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.paths import projects_dir
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.options import SpawnOptions
from orchestrator.sandbox.record import RECORD, RECORD_LIMIT, match_id, recall
from orchestrator.sandbox.registry import get_runtime_class
from orchestrator.spec.loader import Environment


def _recorded() -> dict[str, Path]:
    """Project folders holding a record, by name (real folders only, never a link)."""
    try:
        folders = list(projects_dir().iterdir())
    except OSError:
        return {}
    return {
        d.name: d for d in folders if d.is_dir() and not d.is_symlink() and (d / RECORD).is_file()
    }


def attachable(env: Environment | None = None) -> list[str]:
    """Ids of the environments `attach` can reach (only those of `env`'s file, when given:
    the same digest), oldest first."""
    found = []
    for name, folder in _recorded().items():
        try:
            fd = os.open(folder / RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # removed meanwhile
        with os.fdopen(fd, "rb") as fh:
            mtime = os.fstat(fh.fileno()).st_mtime
            head = fh.read(RECORD_LIMIT + 1) if env is not None else b""
        if env is not None:
            try:
                if json.loads(head).get("digest") != env.digest:
                    continue
            except (ValueError, AttributeError):
                continue
        found.append((mtime, name))
    return [name for _, name in sorted(found)]


def attach(ref: str, *, host: str | None = None) -> Runtime:
    """A live runtime for the running environment `ref` (its id, short id, or a unique
    prefix, as `orchestrator down` takes): execute, stream, files, service(name), snapshot,
    info and connection, through the backend that started it (with its executor where the
    image has python3). `host`: the engine it runs on, when not the one it was started on.
    Leaving a `with` block or `detach()` leaves it running; `cleanup()` removes it.
    Raises ProjectNotFound (no such environment, or several match). An environment whose
    main container stopped is attached too (its logs, `poll()` and `cleanup()` work); its
    commands raise SandboxUnavailable saying why."""
    folders = _recorded()
    name = match_id(ref, sorted(folders))
    record = recall(folders[name])
    cls = get_runtime_class(record.backend)
    options = SpawnOptions(detached=True, host=host or record.host or None)
    rt = cls.from_record(name, record.env, options, folders[name], record.state)
    rt.attached = True
    return rt


__all__ = ["attach", "attachable"]
