"""A download landing: the archive a sandbox packed, unpacked as it arrives (sandbox/unpack.py:
every component opened without following links) into a private folder inside the
destination, and moved into place only once every entry has passed and the sandbox's side
succeeded (`Staged.commit`); never replacing a folder by a file or a file by a folder, and
never reaching the destination through a link the sandbox may have put (sandbox/landing.py)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from orchestrator.errors import (
    OrchestratorError,
    OutputLimitExceeded,
    SandboxUnsafeArchive,
    UsageError,
)
from orchestrator.sandbox import landing, threads, unpack
from orchestrator.sandbox.options import FILE_LIMIT_ENV


class Staged:
    """An archive from the sandbox unpacked into a private folder inside the destination,
    as it arrived: `commit()` moves it into place, `discard()` removes it. Nothing reaches
    the destination itself unless every entry passed, and none would replace one of the
    caller's of another kind (a folder by a file, a file by a folder). Every step works
    below the destination's descriptor (landing.py), never by path."""

    def __init__(self, folder: Path, dest: int, staging: str, names: list[str]) -> None:
        self.folder, self.dest, self.staging, self.names = folder, dest, staging, names

    def commit(self) -> list[str]:
        try:
            threads.last_step()  # a caller that was cancelled gets nothing moved in
        except threads.Stopped:
            self.discard()
            raise
        try:
            with landing.opened(self.staging, self.dest) as staged:
                found = landing.clash(staged, self.dest)
                if found is not None:
                    raise SandboxUnsafeArchive(
                        f"refused the archive: {found!r} is a folder on one side and not on "
                        f"the other, and what is in {self.folder} is never replaced by another "
                        f"kind (nothing was written to {self.folder})"
                    )
                for name in sorted(os.listdir(staged)):
                    landing.merge(name, staged, self.dest)
            os.rmdir(self.staging, dir_fd=self.dest)
        except SandboxUnsafeArchive:
            self.discard()
            raise
        except OSError as exc:
            self.discard()
            raise OrchestratorError(f"cannot move the download into {self.folder}: {exc}") from exc
        finally:
            self._close()
        return self.names

    def discard(self) -> None:
        if self.dest >= 0:
            landing.remove_tree(self.staging, self.dest)
        self._close()

    def _close(self) -> None:
        if self.dest >= 0:
            os.close(self.dest)
            self.dest = -1


class _Incoming(io.RawIOBase):
    """The archive's chunks as the file tarfile reads, pulled as tarfile asks (no thread,
    no pipe: the sandbox's side runs ahead in its own process) and counted against the
    limit."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        super().__init__()
        self._chunks = iter(chunks)
        self._chunk, self._at = b"", 0
        self.limit, self.received = limit, 0

    def _pull(self) -> bool:
        for chunk in self._chunks:
            threads.check_stop()  # its caller was cancelled: the unpacking stops here
            self.received += len(chunk)
            if self.received > self.limit:
                raise OutputLimitExceeded(
                    f"the folder packs to more than the limit of {self.limit} bytes (pass "
                    f"limit= or set {FILE_LIMIT_ENV})"
                )
            if chunk:
                self._chunk, self._at = chunk, 0
                return True
        return False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._at >= len(self._chunk) and not self._pull():
            return b""
        chunk, at = self._chunk, self._at
        end = len(chunk) if size < 0 else min(len(chunk), at + size)
        self._at = end
        return chunk if at == 0 and end == len(chunk) else chunk[at:end]

    def drain(self) -> None:
        """Read what follows the archive's end (tar's padding), so the command can end."""
        while self._pull():
            pass


# tarfile copies what it has buffered on every read: small reads copy less (1 MiB reads
# cost more than the whole unpacking besides); file data is then copied in big blocks.
READ_SIZE, COPY_SIZE = 1 << 16, 1 << 20


def stage(
    chunks: Iterable[bytes], folder: Path, limit: int, guarded: Sequence[Path] = ()
) -> Staged:
    """Unpack a tar stream from the sandbox while it arrives, into a private folder inside
    `folder`, by `unpack` (nothing written through a link, nothing that could lead out:
    absolute names, `..`, links that could point out, devices and FIFOs refuse the archive;
    setuid bits are dropped). `folder` is reached as landing.py says (a link inside one of
    the `guarded` folders, those the sandbox writes, refuses it; what is missing is made
    0700). Refused, cut short or past `limit` bytes, the private folder goes and the error
    is raised. The caller commits; the names it gets are relative."""
    try:
        dest = landing.open_destination(folder, guarded)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(
            f"{folder} is not a folder on this machine: a download goes into one"
        ) from None
    except OSError as exc:
        raise OrchestratorError(f"cannot make the folder {folder}: {exc.strerror}") from None
    try:
        staging = landing.make_staging(dest)
    except OSError as exc:
        os.close(dest)
        raise OrchestratorError(f"cannot write in the folder {folder}: {exc.strerror}") from None
    staged = Staged(folder, dest, staging, [])
    incoming = _Incoming(chunks, limit)
    try:
        with tarfile.open(fileobj=incoming, mode="r|", bufsize=READ_SIZE) as tar:
            where = f"/proc/self/fd/{dest}/{staging}"
            staged.names.extend(n for n in unpack.unpack(tar, where, COPY_SIZE) if n)
        incoming.drain()
    except tarfile.TarError as exc:
        if incoming.received == 0:
            return staged  # nothing came: the sandbox's side says why
        staged.discard()
        raise OrchestratorError(f"cannot unpack into {folder}: {exc}") from exc
    except SandboxUnsafeArchive as exc:
        staged.discard()
        raise SandboxUnsafeArchive(f"{exc} (nothing was written to {folder})") from None
    except OrchestratorError:  # over the limit, or the sandbox's side failed
        staged.discard()
        raise
    except OSError as exc:  # an entry this machine cannot hold (a hard link to nothing, say)
        staged.discard()
        raise OrchestratorError(f"cannot unpack into {folder}: {exc}") from exc
    except BaseException:
        staged.discard()
        raise
    return staged
