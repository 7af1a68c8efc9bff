"""Files in the sandbox, moved with two POSIX sh helpers run as the command user, so every
backend reads and writes with the same permissions and errors.

The helpers honour a file's mode whoever asks: a file nobody may read is not read, and one
nobody may write is not overwritten, also for root (whose CAP_DAC_OVERRIDE would otherwise
make a read-only mark meaningless to a harness that relies on it)."""

from __future__ import annotations

from orchestrator.errors import (
    OrchestratorError,
    OutputLimitExceeded,
    SandboxFileNotFound,
    SandboxIsADirectory,
    SandboxPermissionError,
)
from orchestrator.runtime.options import FILE_LIMIT_ENV

# Exit codes of the file helper scripts below.
_NOT_FOUND, _IS_DIR, _DENIED, _TOO_BIG = 2, 21, 13, 27
WRITE = (
    'p=$1; d=${p%/*}; [ -n "$d" ] || d=/; '
    '[ -d "$p" ] && exit 21; '
    'if [ -e "$p" ]; then case $(ls -ld -- "$p") in ??w*|?????w*|????????w*) ;; *) exit 13 ;; '
    "esac; fi; "
    'if ! mkdir -p -- "$d" 2>/dev/null; then [ -e "$d" ] && [ ! -d "$d" ] && exit 2; exit 13; fi; '
    'cat > "$p" 2>/dev/null || { [ -d "$d" ] || exit 2; exit 13; }'
)
READ = (
    'p=$1; [ -d "$p" ] && exit 21; '
    'e=$( (: < "$p") 2>&1 ) || case "$e" in *ermission*) exit 13 ;; *) exit 2 ;; esac; '
    'case $(ls -ldL -- "$p") in ?r*|????r*|???????r*) ;; *) exit 13 ;; esac; '
    'n=$(wc -c < "$p") || exit 13; '
    'n=$((n + 0)); if [ "$n" -gt "$2" ]; then echo "$n"; exit 27; fi; exec cat -- "$p"'
)


def write_argv(path: str) -> list[str]:
    """Write stdin to `path`, creating parent folders."""
    return ["/bin/sh", "-c", WRITE, "sh", path]


def read_argv(path: str, limit: int) -> list[str]:
    """Print `path`, or its size and exit 27 when it is over `limit` bytes."""
    return ["/bin/sh", "-c", READ, "sh", path, str(limit)]


def raise_for(code: int, path: str, verb: str, stderr: str, limit: int = 0, size: str = "") -> None:
    """Turn a helper's exit code into the matching error (nothing for 0)."""
    if code == 0:
        return
    if code == _TOO_BIG:
        raise OutputLimitExceeded(
            f"{path} is {size} bytes, over the read limit of {limit} "
            f"(pass limit= or set {FILE_LIMIT_ENV})"
        )
    if code == _NOT_FOUND:
        raise SandboxFileNotFound(f"cannot {verb} {path}: no such file or directory")
    if code == _IS_DIR:
        raise SandboxIsADirectory(f"cannot {verb} {path}: is a directory")
    if code in (_DENIED, 1):
        raise SandboxPermissionError(f"cannot {verb} {path}: permission denied")
    raise OrchestratorError(f"cannot {verb} {path}: helper exited {code}: {stderr.strip()}")
