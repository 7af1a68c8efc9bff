"""Files in the sandbox, moved with two POSIX sh helpers run as the command user, so every
backend reads and writes with the same permissions and errors.

The helpers honour a file's mode whoever asks: a file nobody may read is not read, and one
nobody may write is not overwritten, also for root (whose CAP_DAC_OVERRIDE would otherwise
make a read-only mark meaningless to a harness that relies on it).

Folders move as one tar stream: packed on this machine by sandbox/hostpack.py, unpacked here
by sandbox/stage.py (and sandbox/unpack.py)."""

from __future__ import annotations

from orchestrator.errors import (
    OrchestratorError,
    OutputLimitExceeded,
    SandboxFileNotFound,
    SandboxIsADirectory,
    SandboxNotADirectory,
    SandboxPermissionError,
    SandboxUnavailable,
)
from orchestrator.sandbox.options import FILE_LIMIT_ENV

# Exit codes of the file helper scripts below.
_NOT_FOUND, _IS_DIR, _DENIED, _TOO_BIG, _NOT_REGULAR = 2, 21, 13, 27, 22
OPEN_WAIT = 5
"""Seconds the helpers give an open that can block (below) before they refuse the path as
not a regular file: opening a regular file takes microseconds, so only a FIFO put in its
place after it was looked at (or an exotic device) waits that long."""

# The helpers open what they act on once, and judge what they opened (/dev/fd/3), never
# the path again: a FIFO, device or socket is refused (exit 22), as is anything a sandbox
# renames into place between a look at the path and the open. A path that is no regular
# file when looked at is refused without being opened at all (at once). An open for
# reading and writing (`<>`) never waits on a FIFO; one for reading alone, or writing
# alone, does until the other end is opened, so it runs in a subshell raced against a
# `sleep`: the open ends first (and stops the sleep) or is killed, and the path refused,
# after OPEN_WAIT s. Reading never opens for writing: `<>` creates a missing file (through
# a link the sandbox planted, too), which a read must not do.
# `_watched(redirection, body, failed)`: `body` run with fd 3 opened by `redirection`
# of "$p" under that race; `failed`: what a refused open exits with.
# not there, or out of reach: the reason find gives (it never opens the path), which ends
# its message (the start holds the path, whose words may be anything)
_PROBE = (
    'e=$(find "$p" -maxdepth 0 2>&1 >/dev/null); '
    'case "${e##*: }" in *ermission*) exit 13 ;; esac; exit 2'
)


def _watched(redirection: str, body: str, failed: str) -> str:
    return (
        f"sleep {OPEN_WAIT} </dev/null >/dev/null 2>&1 & s=$!; "
        f'( {{ kill $s 2>/dev/null; {body} }} 3{redirection}"$p" || '
        f"{{ kill $s 2>/dev/null; {failed} }} ) & b=$!; "
        "if wait $s 2>/dev/null; then kill -9 $b; exit 22; fi; wait $b"
    )


# what was opened: a regular file that someone may read (or write: the mode is honoured
# whoever asks, root too) and at most the limit long (its size counted only past it), read
# through the descriptor
_READ_BODY = (
    "[ -f /dev/fd/3 ] || exit 22; "
    '[ -n "$(find -L /dev/fd/3 -maxdepth 0 -perm /444 2>/dev/null)" ] || exit 13; '
    'if [ -n "$(find -L /dev/fd/3 -maxdepth 0 -size +"$2"c 2>/dev/null)" ]; then '
    # its size from its inode (a sparse file is not read through: busybox's wc would)
    "n=$(stat -L -c %s /dev/fd/3 2>/dev/null || wc -c <&3); echo $((n + 0)); exit 27; fi; "
    "exec cat <&3;"
)
_WRITE_BODY = (
    "[ -f /dev/fd/3 ] || exit 22; "
    '[ -n "$(find -L /dev/fd/3 -maxdepth 0 -perm /222 2>/dev/null)" ] || exit 13; '
    "true >/dev/fd/3 || exit 13; exec cat >&3 <&5;"  # emptied through the descriptor
)
WRITE = (
    'p=$1; d=${p%/*}; [ -n "$d" ] || d=/; '
    '[ -d "$p" ] && exit 21; '
    # a write bit for someone (`find -perm`, not `ls`: gVisor refuses the statx `ls` makes)
    'if [ -e "$p" ] && [ -z "$(find "$p" -maxdepth 0 -perm /222 2>/dev/null)" ]; then exit 13; fi; '
    'if ! mkdir -p -- "$d" 2>/dev/null; then [ -e "$d" ] && [ ! -d "$d" ] && exit 2; exit 13; fi; '
    '[ -e "$p" ] && { [ -f "$p" ] || exit 22; }; exec 5<&0; '
    # read and write: never waits (a file the user may write but not read goes on below)
    f'{{ {_WRITE_BODY} }} 2>/dev/null 3<>"$p"; '
    + _watched(">>", _WRITE_BODY, '[ -d "$d" ] || exit 2; exit 13;')
)
READ = (
    'p=$1; [ -d "$p" ] && exit 21; '
    f'if [ ! -e "$p" ]; then {_PROBE}; fi; '
    '[ -f "$p" ] || exit 22; ' + _watched("<", _READ_BODY, '[ -e "$p" ] || exit 2; exit 13;')
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
    if code == _NOT_REGULAR:  # as the host's own reader of a workspace says it (hostfs)
        raise SandboxPermissionError(
            f"cannot {verb} {path}: not a regular file (a FIFO, device or socket is never "
            "read or written)"
        )
    if code in (_DENIED, 1):
        raise SandboxPermissionError(f"cannot {verb} {path}: permission denied")
    if code == CANNOT_START:  # the helper's own programs (sh, cat) exist: it could not run them
        raise SandboxUnavailable(
            f"cannot {verb} {path}: cannot start a process in the sandbox (its process or "
            f"memory limit is reached?) {stderr.strip()}".rstrip()
        )
    raise OrchestratorError(f"cannot {verb} {path}: helper exited {code}: {stderr.strip()}")


CANNOT_START = 126
"""A shell's (and `docker exec`'s) exit status for a program it found but could not run."""


# Folders move as one tar stream: packed on one side, unpacked on the other, as the command
# user (so the sandbox's own permissions apply), with `-o`: files belong to whoever unpacks.
UPLOAD = (
    'd=$1; [ -e "$d" ] && [ ! -d "$d" ] && exit 20; '
    'mkdir -p -- "$d" 2>/dev/null || exit 13; '
    'tar -x -o -f - -C "$d" || exit 13'
)
DOWNLOAD = (
    # not there, or out of reach (a folder on the way this user cannot enter): find says
    # which, and never opens the path (a FIFO put there meanwhile would wait for a writer)
    f's=$1; p=$1; if [ ! -e "$s" ]; then {_PROBE}; fi; '
    '[ -d "$s" ] || exit 20; [ -r "$s" ] && [ -x "$s" ] || exit 13; '
    'export TAR_OPTIONS=--blocking-factor=2048; tar -c -f - -C "$s" .; t=$?; '
    "[ $t = 2 ] && exit 13; exit $t"  # GNU tar's 2 (a file it could not open) is not "missing"
)
# (GNU tar then writes 1 MiB records instead of 10 KiB ones: fewer, fuller reads on our side;
# busybox's tar ignores the variable.)
_NOT_DIR = 20


# A reset: the folder emptied (whatever its modes), then an archive unpacked in it with the
# owners it records (run as root in a container, so those are the owners at packing time).
# The old content is first moved (renamed, never followed) into a new folder of its own
# inside, removed while tar unpacks beside it, and waited for: the folder holds the
# archive's entries alone once the command ends. Where that folder cannot be made (its name
# taken: the content chose it), or something did not move, it is removed first, as before.
REPLACE = (
    'd=$1; [ -d "$d" ] || exit 20; chmod -R u+rwX -- "$d" 2>/dev/null; '
    # a random name: one an archive could name (a guessable pid) would be unpacked into
    # the folder being removed behind it
    'n=$(od -An -N8 -tx1 /dev/urandom 2>/dev/null | tr -d " \\n"); '
    'o="$d/.orchestrator-old.$n"; r=; '
    'if [ ${#n} = 16 ] && mkdir -m 700 -- "$o" 2>/dev/null; then '
    'mv -f -- "$d"/* "$d"/.[!.]* "$d"/..?* "$o/" 2>/dev/null; '
    'rm -rf -- "$o" & r=$!; '
    'for e in "$d"/* "$d"/.[!.]* "$d"/..?*; do '
    '[ "$e" = "$o" ] || { [ ! -e "$e" ] && [ ! -L "$e" ]; } || { wait $r; r=; break; }; '
    "done; fi; "
    'if [ -z "$r" ]; then rm -rf -- "$d"/* "$d"/.[!.]* "$d"/..?* || exit 13; fi; '
    'tar -x -f - -C "$d"; t=$?; '
    'if [ -n "$r" ]; then wait $r || t=13; fi; '
    "[ $t = 0 ] || exit 13"
)


def replace_argv(dest: str) -> list[str]:
    """Empty the folder `dest`, then unpack a tar stream from stdin into it."""
    return ["/bin/sh", "-c", REPLACE, "sh", dest]


def upload_argv(dest: str) -> list[str]:
    """Unpack a tar stream from stdin into the folder `dest` (created if missing)."""
    return ["/bin/sh", "-c", UPLOAD, "sh", dest]


def download_argv(src: str) -> list[str]:
    """Pack the folder `src` as a tar stream on stdout."""
    return ["/bin/sh", "-c", DOWNLOAD, "sh", src]


def raise_for_folder(code: int, path: str, verb: str, stderr: str) -> None:
    if code == _NOT_DIR:
        raise SandboxNotADirectory(f"cannot {verb} {path}: not a directory")
    raise_for(code, path, verb, stderr)


STREAM_CHUNK = 1 << 20
"""Bytes of a folder's archive read or written at once."""
