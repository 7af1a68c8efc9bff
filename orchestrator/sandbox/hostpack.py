"""Archives written into files (a snapshot's, a suspend record's), never whole in memory: a
private part file beside where the archive goes, moved into place by the caller
(`into_part`). A folder of this machine that a sandbox sees through a bind mount (its
workspace) is packed by the host's tar straight into one: tar writes into a pipe, which
the kernel moves into the file (splice), so the archive never passes through this process's
memory, and is counted as it goes: past the limit, tar is stopped and the file removed.
Packing only reads the folder and never follows a link in it (tar stores links as links,
FIFOs and devices as entries, never reading them), so its content being hostile does no
harm here; what it holds is judged when it is unpacked (sandbox/unpack.py)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import OrchestratorError, OutputLimitExceeded, SandboxFileTimeout
from orchestrator.procutil import F_SETPIPE_SZ
from orchestrator.sandbox import files, threads
from orchestrator.sandbox.ledger import owner_alive, process_start
from orchestrator.sandbox.options import FILE_LIMIT_ENV

CHUNK = 1 << 20
PART = ".part"
"""Suffix of an archive being written (beside where it goes, moved there once whole)."""


def new_part(folder: Path) -> tuple[int, Path]:
    """A new, private (0600) file in `folder` for an archive being written, named after
    this process (pid and start time), so that one a killed writer left is known for what
    it is (`sweep_parts`). Those of dead writers in `folder` go first."""
    sweep_parts(folder)
    pid = os.getpid()
    prefix = f".snapshot-{pid}-{process_start(pid)}-"
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=PART, dir=folder)
    return fd, Path(name)


def sweep_parts(folder: Path) -> list[str]:
    """Remove the archives being written in `folder` whose writer is gone (a process killed
    while it packed: nobody else would ever remove them, each up to the snapshot limit);
    returns their names. Only files named as new_part names them, never followed."""
    gone = []
    with contextlib.suppress(OSError):
        for part in folder.glob(f".snapshot-*{PART}"):
            pid, _, rest = part.name.removeprefix(".snapshot-").partition("-")
            start = rest.partition("-")[0]
            if not (pid.isdigit() and start.isdigit()) or owner_alive(int(pid), start):
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISREG(part.lstat().st_mode):
                    part.unlink()
                    gone.append(part.name)
    return gone


def into_part(folder: Path, fill: Callable[[int], object]) -> Path:
    """A new part file in `folder` (see new_part), written by `fill(fd)`: returned once
    `fill` returns (the caller moves it into place, or removes it), removed if it raises."""
    fd, path = new_part(folder)
    try:
        fill(fd)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return path


def write_all(fd: int, data: bytes) -> None:
    """All of `data` into the file `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pack_to_file(folder: Path, into: Path, limit: int, timeout: float | None = None) -> Path | None:
    """`folder` packed by the host's tar into a new file in the folder `into` (returned: the
    caller moves it into place, or removes it). Past `limit` bytes, OutputLimitExceeded (the
    file, which never held more than one byte over, is gone); past `timeout` seconds,
    SandboxFileTimeout (tar is killed). None, with nothing left behind, where the host
    cannot pack it whole (no tar, or an entry it may not read): the sandbox packs it then."""
    tar = shutil.which("tar")
    if tar is None or not folder.is_dir():
        return None
    fd, path = new_part(into)
    keep = False
    try:
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                files._tar_argv(tar, folder), stdout=subprocess.PIPE, stderr=errors, bufsize=0
            )
            assert proc.stdout is not None
            try:
                with contextlib.suppress(OSError):  # bigger moves where Linux allows it
                    fcntl.fcntl(proc.stdout.fileno(), F_SETPIPE_SZ, CHUNK)
                _move(proc.stdout.fileno(), fd, limit, folder, timeout)
            finally:
                proc.stdout.close()
                if proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.5)  # tar ends once all it wrote is read
                    proc.kill()  # stopped early (over the limit, late): tar stops too
                proc.wait()
        keep = proc.returncode == 0
        return path if keep else None
    except OrchestratorError:
        raise
    except OSError as exc:
        raise OrchestratorError(f"cannot write the archive of {folder} in {into}: {exc}") from exc
    finally:
        os.close(fd)
        if not keep:
            path.unlink(missing_ok=True)


def _move(src: int, dst: int, limit: int, folder: Path, timeout: float | None) -> None:
    """Everything from the pipe `src` into the file `dst`, at most `limit` bytes, within
    `timeout` seconds (None: no bound)."""
    total, spliced = 0, True
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        threads.check_stop()  # its caller was cancelled: tar is stopped
        if deadline is not None and timeout is not None:
            _wait_readable(src, deadline, timeout, folder)
        want = min(CHUNK, limit + 1 - total)
        if spliced:
            try:
                moved = os.splice(src, dst, want)
            except OSError as exc:  # a file system without splice: by hand
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                spliced = False
                continue
        else:
            data = os.read(src, want)
            moved = len(data)
            write_all(dst, data)
        if moved == 0:
            return
        total += moved
        if total > limit:
            raise OutputLimitExceeded(
                f"{folder} packs to more than the limit of {limit} bytes (pass limit= or set "
                f"{FILE_LIMIT_ENV})"
            )


def _wait_readable(fd: int, deadline: float, timeout: float, folder: Path) -> None:
    """Wait for tar's next bytes until `deadline`: past it, SandboxFileTimeout."""
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise SandboxFileTimeout(
            f"packing {folder} took more than {timeout:g} s, so it was stopped; pass a longer "
            "timeout, or make the folder smaller",
            path=str(folder),
            timeout=timeout,
        )
