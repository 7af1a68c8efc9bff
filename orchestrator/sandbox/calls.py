"""Sandbox: the place commands run (the main sandbox, or one service of it), with every call a
caller makes: those of sandbox/core.py (execute, stream, read_file, write_file), written once
over a backend's `_run`, and here the folder transfers (upload, download, and the packing a
snapshot or a pool's baseline asks for), as one tar stream each way. `Runtime`
(sandbox/base.py) adds the lifecycle."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path

from orchestrator.errors import OrchestratorError, OutputLimitExceeded, SandboxFileTimeout
from orchestrator.sandbox import files, hostpack
from orchestrator.sandbox.call import ERR_LIMIT, file_deadline, raise_held
from orchestrator.sandbox.core import SandboxCore
from orchestrator.sandbox.options import FILE_LIMIT_ENV, default_file_limit
from orchestrator.sandbox.results import Outcome, TailBuffer, decode
from orchestrator.sandbox.stage import stage
from orchestrator.sandbox.streams import ArchiveStream


class Sandbox(SandboxCore):
    """Commands and files in one place: the main sandbox (a Runtime) or one of its services.
    Everything callers use is written once over `_run`, so every place keeps the same
    semantics."""

    def writable_host_folders(self) -> Sequence[Path]:
        """The host folders a sandbox of this environment can write (its workspace, a
        read-write mount): a download into one of them never follows a link there (the
        sandbox may have put it). None by default (nothing of the host is written)."""
        return ()

    def upload(
        self,
        local: str | Path,
        dest: str,
        *,
        user: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Copy a local folder's content into folder `dest` (created if missing) as one tar
        stream: modes and symlinks kept, files owned by the command user. Raises
        SandboxFileTimeout past `timeout` seconds (default: ORCHESTRATOR_FILE_TIMEOUT)."""
        stream = hostpack.PackStream(Path(local))
        try:
            self._unpack_here(stream, dest, user, timeout)
        except SandboxFileTimeout:
            raise  # the sandbox held it: whatever the packer then said is a consequence
        except OrchestratorError:
            if stream.error is None:
                raise
        if stream.error is not None:  # the sandbox saw a cut archive; this is why
            raise stream.error

    def _unpack_here(
        self,
        archive: bytes | Iterable[bytes],
        dest: str,
        user: str | None,
        timeout: float | None = None,
    ) -> None:
        target, deadline = self._path(dest), file_deadline(timeout)
        cmd = self._command(files.upload_argv(target), None, b"", None, user, deadline)
        cmd = dataclasses.replace(cmd, stdin=archive)
        _, err, outcome = self._collect(cmd, 64 * 1024, bulk=isinstance(archive, ArchiveStream))
        stderr = decode(err.value())
        raise_held(outcome, stderr, target, "upload into", deadline)
        files.raise_for_folder(outcome.exit_code, target, "upload into", stderr)

    def _pack_here(
        self, src: str, user: str | None, limit: int, timeout: float | None = None
    ) -> bytes:
        """The folder `src` packed by the sandbox, as bytes (a pool's baseline)."""
        archive = bytearray()
        self._pack_into(src, user, limit, timeout, archive.extend)
        return bytes(archive)

    def _pack_into(
        self,
        src: str,
        user: str | None,
        limit: int,
        timeout: float | None,
        sink: Callable[[bytes], object],
    ) -> None:
        """The folder `src` packed by the sandbox, its archive handed to `sink` chunk by chunk
        as it comes (a snapshot's file: never whole in this process). Past `limit` bytes,
        OutputLimitExceeded at once (the command is killed); past `timeout` seconds
        SandboxFileTimeout."""
        target, deadline = self._path(src), file_deadline(timeout)
        cmd = self._command(files.download_argv(target), None, None, None, user, deadline)
        err, size = TailBuffer(ERR_LIMIT), 0
        gen = self._run_bulk(cmd)
        try:
            while True:
                try:
                    kind, data = next(gen)
                except StopIteration as stop:
                    outcome: Outcome = stop.value
                    break
                if kind == "stderr":
                    err.add(data)
                    continue
                size += len(data)
                if size > limit:
                    raise OutputLimitExceeded(
                        f"{target} packs to more than the limit of {limit} bytes (pass limit= "
                        f"or set {FILE_LIMIT_ENV})"
                    )
                sink(data)
        finally:
            gen.close()  # stopped early: the command is killed
        stderr = decode(err.value())
        raise_held(outcome, stderr, target, "download", deadline)
        files.raise_for_folder(outcome.exit_code, target, "download", stderr)

    def download(
        self,
        src: str,
        local: str | Path,
        *,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Copy folder `src`'s content into a local folder as one tar stream, refusing any
        entry that would land outside it (SandboxUnsafeArchive); returns the names copied.
        Past `limit` bytes of archive (default: the file read limit) raises
        OutputLimitExceeded and writes nothing; past `timeout` seconds (default:
        ORCHESTRATOR_FILE_TIMEOUT) SandboxFileTimeout, writing nothing. The archive is
        unpacked as it arrives, into a private folder inside `local` that is moved into
        place only once every entry has passed and the sandbox's side succeeded."""
        target, deadline = self._path(src), file_deadline(timeout)
        cmd = self._command(files.download_argv(target), None, None, None, user, deadline)
        err, ended = TailBuffer(64 * 1024), []

        def archive() -> Generator[bytes, None, None]:
            gen = self._run_bulk(cmd)
            try:
                while True:
                    kind, data = next(gen)
                    if kind == "stdout":
                        yield data
                    else:
                        err.add(data)
            except StopIteration as stop:
                ended.append(stop.value)
            finally:
                gen.close()  # stopped early (refused, over the limit): the command is killed

        stream = archive()
        try:
            staged = stage(
                stream, Path(local), limit or default_file_limit(), self.writable_host_folders()
            )
        except OrchestratorError as exc:  # a cut archive: the deadline may be why
            if ended:
                raise_held(ended[0], decode(err.value()), target, "download", deadline, exc)
            raise
        finally:
            stream.close()
        outcome: Outcome = ended[0]
        if outcome.exit_code != 0 or outcome.timed_out:
            staged.discard()
            stderr = decode(err.value())
            raise_held(outcome, stderr, target, "download", deadline)
            files.raise_for_folder(outcome.exit_code, target, "download", stderr)
        return staged.commit()
