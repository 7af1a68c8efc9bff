"""Where the library keeps its state on the host (a leaf: any layer may use it).

The folder follows the XDG rule through platformdirs' Unix rule (`platformdirs.unix.Unix`,
on every platform, so a Mac keeps the same ~/.local/state it had): it ignores a relative
$XDG_STATE_HOME as the XDG spec says, and finds the home folder in the password database when
$HOME is empty or relative, where the hand-written rule made the state folder relative to the
current folder (so `ps` in one folder missed what `up` in another started)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.errors import UsageError

STATE_DIR_ENV = "ORCHESTRATOR_STATE_DIR"


def state_dir() -> Path:
    """Where project folders live: $ORCHESTRATOR_STATE_DIR (absolute, or from ~), else
    $XDG_STATE_HOME/orchestrator (~/.local/state/orchestrator)."""
    explicit = os.environ.get(STATE_DIR_ENV, "").strip()
    if explicit:
        path = Path(os.path.expanduser(explicit))  # an unknown ~user stays, and is refused
        if not path.is_absolute():
            raise UsageError(
                f"{STATE_DIR_ENV} must be an absolute path (or start with ~), got {explicit!r}"
            )
        return path
    from platformdirs.unix import Unix  # loaded only by a lookup without ORCHESTRATOR_STATE_DIR

    return Path(Unix("orchestrator").user_state_dir)


def projects_dir() -> Path:
    """Where every environment's project folder is (records for `attach` included)."""
    return state_dir() / "projects"


def read_regular(path: Path, limit: int, *, follow: bool = False) -> bytes | None:
    """At most `limit` + 1 bytes of a regular file (a caller tells one past `limit` by the
    length), never waiting on a FIFO and never through a link unless `follow`; None when it
    is missing, not a regular file, or cannot be read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        return os.read(fd, limit + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)
