"""Where the packaged templates and shipped environments live (installed or in a checkout)."""

from __future__ import annotations

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
