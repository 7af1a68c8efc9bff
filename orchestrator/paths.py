"""Where the library keeps its state on the host (a leaf: any layer may use it)."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """Where project folders live: $ORCHESTRATOR_STATE_DIR, else $XDG_STATE_HOME/orchestrator."""
    explicit = os.environ.get("ORCHESTRATOR_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "orchestrator"


def projects_dir() -> Path:
    """Where every environment's project folder is (records for `attach` included)."""
    return state_dir() / "projects"
