"""Where the packaged templates and shipped environments live (installed or in a checkout)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from orchestrator.errors import BackendUnavailable

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`templates` or `environments`: inside the wheel, or at the top of a source checkout."""
    installed = _PKG / "_data" / name
    if installed.is_dir():
        return installed
    checkout = _PKG.parent / name
    if checkout.is_dir():
        return checkout
    raise BackendUnavailable(
        f"orchestrator data folder {name!r} not found (a broken install: reinstall the package)"
    )


@functools.cache
def templates_version() -> str:
    """A hash of every template's name and content: part of each environment's digest, so a
    change to what a file compiles to is never missed (no version to bump by hand)."""
    digest = hashlib.sha256()
    folder = data_dir("templates")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
