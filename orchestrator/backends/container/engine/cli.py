"""Running one docker CLI command line the Engine built: bounded, its failure typed
(errors.py), idempotent calls tried once more when the engine did not answer in time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from orchestrator import procutil
from orchestrator.backends.container.engine.bounds import KILLED, TIMED_OUT, backstop
from orchestrator.backends.container.engine.errors import CallFailed, docker_errors
from orchestrator.errors import BackendUnavailable, DockerError

T = TypeVar("T")


def run(argv: Sequence[str], *, input: bytes | None = None, backstop: float | None = None) -> str:
    """One docker CLI call: its stdout, one trailing newline dropped; CallFailed when it
    exits non-zero. A bounded call (see bounds.py) is abandoned after `backstop` seconds,
    should a process it left behind hold its output open; then, and when `timeout` had to
    KILL it, the failure is TIMED_OUT."""
    args = list(argv)
    try:
        done = _completed(args, input, backstop)
    except subprocess.TimeoutExpired:
        raise CallFailed(args, TIMED_OUT, b"", b"") from None
    if done.returncode != 0:
        killed = backstop is not None and done.returncode in KILLED
        code = TIMED_OUT if killed else done.returncode
        raise CallFailed(args, code, done.stdout, done.stderr)
    out = done.stdout.decode("utf-8", "replace")
    return out[:-1] if out.endswith("\n") else out


def _completed(
    args: list[str], input: bytes | None, timeout: float | None
) -> subprocess.CompletedProcess[bytes]:
    """`subprocess.run(args, input=input, capture_output=True, timeout=timeout)`, except that
    a call given up for any reason (its timeout, Ctrl-C, SIGTERM unwinding) kills the whole
    process group that `timeout` leads (bounds.bounded), not `timeout` alone: a SIGKILL is
    not passed on, and the docker CLI under it would live on, for good if the engine hangs.
    (While it is not reaped, no other group can bear its pid.)"""
    stdin = subprocess.PIPE if input is not None else None
    # (the call is known before its process exists: a signal unwinding us may come while
    # Popen returns, before any `try` here holds it, and the process must still go)
    held: list[subprocess.Popen[bytes]] = []
    try:
        proc = procutil.Held(
            held, args, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = proc.communicate(input, timeout=timeout)  # (its pipes closed at its end)
    except BaseException:
        for started in held:
            pid = getattr(started, "pid", None)  # (None: no process was made)
            if pid:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    started.wait(5)
            for name in ("stdin", "stdout", "stderr"):
                pipe = getattr(started, name, None)
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def run_command(action: str, argv: Sequence[str], *, bound: float, input: bytes | None) -> str:
    """A command run in a container (`docker exec`, bounded at `bound` seconds on its command
    line): its stdout, or a DockerError with its exit status and stderr. What it prints and
    how it exits are the sandbox's own, so they are never read as the engine's words (a
    command printing "No such container" or "Cannot connect to the Docker daemon" fails as
    itself), and it timed out only when its bound passed (a command killed inside, exit 137,
    or exiting 124 of its own accord, is not a timeout)."""
    args = list(argv)
    started = time.monotonic()
    try:
        done = _completed(args, input, backstop(bound))
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess(args, TIMED_OUT, b"", b"")
    except FileNotFoundError as exc:
        raise BackendUnavailable(
            "the docker CLI is not installed (see `orchestrator doctor`)"
        ) from exc
    out = done.stdout.decode("utf-8", "replace")
    if done.returncode == 0:
        return out[:-1] if out.endswith("\n") else out
    late = time.monotonic() - started >= bound
    code = TIMED_OUT if late and done.returncode in (TIMED_OUT, *KILLED) else done.returncode
    said = f"timed out after {bound:g} s" if code == TIMED_OUT and late else f"failed (exit {code})"
    raise DockerError(
        f"{action} {said}",
        command=args,
        returncode=code,
        stderr=done.stderr.decode("utf-8", "replace"),
    )


def engine_call(action: str, fn: Callable[[], T], *, retry: bool = True) -> T:
    """Run one engine call, converting its errors; when it timed out and is idempotent
    (`retry`), try once more (hung engine calls happen, rarely)."""
    for attempt in (0, 1):
        try:
            with docker_errors(action):
                return fn()
        except DockerError as exc:
            if not (retry and attempt == 0 and exc.returncode == TIMED_OUT):
                raise
    raise AssertionError("unreachable")


LIST_WITHIN = 10.0
"""Listings made while the engine removes one of the objects it lists can fail over it;
they are made again, a moment later each time, for this many seconds at most (five tries
in half a second were all failed once, with six test workers making and removing
environments beside a `ps`)."""


def listing(
    action: str, call: Callable[[], T], gone: tuple[type[DockerError], ...], *, retry: bool = True
) -> T:
    """The output of one listing `call`, made again (a moment later each time, for
    LIST_WITHIN seconds at most; a second without `retry`: a probe that must not wait)
    when the engine fails it over an object of a kind in `gone` removed while it listed
    (Docker so trips over containers and networks, Podman over images)."""
    deadline = time.monotonic() + (LIST_WITHIN if retry else 1.0)
    attempt = 0
    while True:
        try:
            return engine_call(action, call, retry=retry)
        except gone:
            attempt += 1
            pause = min(0.05 * attempt, 0.5)
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)


def output(argv: list[str], limit: float | None, *, both: bool = True) -> Iterator[bytes]:
    """A command's output, both streams (stdout alone unless `both`), in chunks of at most
    64 KiB as it comes; the command is ended when the caller stops reading, and after
    `limit` seconds (None: never). Raises DockerError when it fails."""
    errors = subprocess.STDOUT if both else subprocess.DEVNULL
    held: list[subprocess.Popen[bytes]] = []
    timer: threading.Timer | None = None
    try:
        proc = procutil.Held(held, argv, stdout=subprocess.PIPE, stderr=errors)
        assert proc.stdout is not None
        if limit is not None:
            timer = threading.Timer(limit, proc.kill)
            timer.start()
        while chunk := os.read(proc.stdout.fileno(), 64 * 1024):
            yield chunk
        if proc.wait() != 0:
            raise DockerError(f"{' '.join(argv[-2:])} failed (exit {proc.returncode})")
    finally:
        if timer is not None:
            timer.cancel()
        for started in held:
            if getattr(started, "pid", None):  # (None: no process was made)
                if started.poll() is None:
                    started.kill()
                started.wait()
            pipe = getattr(started, "stdout", None)
            if pipe is not None:
                pipe.close()
