"""The Engine API over the engine's Unix socket, with no docker CLI process: the calls made on
a hot path (inspecting a container, creating, starting and removing the one container of a
project: backends/docker/direct.py), and what the engine is (`engine_facts`). Only the
Engine calls these (`Engine.api`); everything else goes through the CLI and python-on-whales.

Only for an engine on this machine's Unix socket that the docker CLI itself would use: the
address in ORCHESTRATOR_DOCKER_HOST or DOCKER_HOST, else the default socket when no other
Docker context is chosen, and no API version is pinned (DOCKER_API_VERSION). Any other
engine (TCP, SSH, a context) gets `local_socket() == None`, and the caller goes through the
CLI as before. Every call has one deadline for the
whole call, a bounded answer (MAX_ANSWER) and fails as the CLI's errors do.

The HTTP is written here (`_exchange`), not taken from http.client: that module, with the
ssl and email packages it loads, costs 10 ms of each `orchestrator ps` or `exec` (a tenth of
the whole command), and these calls need one request and one answer on a local socket.
They ask in HTTP/1.0, so the engine answers without chunks and ends the answer by closing
the connection; a Content-Length it gives must match what came."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

from orchestrator.backends.container.engine.bounds import TIMED_OUT
from orchestrator.backends.container.engine.errors import CallFailed, wrap
from orchestrator.errors import BackendUnavailable, DockerError, OrchestratorError
from orchestrator.paths import read_regular
from orchestrator.settings import engine_host

DEFAULT_SOCKET = "/var/run/docker.sock"
MAX_ANSWER = 1024 * 1024
"""Bytes of an answer read at most (these calls answer with a few hundred), and of the
CLI's config file."""
UNREAD = "(a config file not read here)"


class TooLong(DockerError):
    """An answer longer than its call's bound (never cut short to fit)."""


class _NoEngine(OSError):
    """Nothing takes connections on the socket."""


class _Broken(OSError):
    """An answer that is not HTTP, or ends before its length."""


HEAD_LIMIT = 64 * 1024
"""Bytes of an answer's status line and headers read at most."""


def _unreached(action: str, path: str, exc: _NoEngine) -> OrchestratorError:
    """What a connection the engine's socket would not take stands for."""
    if exc.errno == errno.EAGAIN:  # its queue stayed full: there, and too busy to answer
        return _failed(action, TIMED_OUT, "the engine did not take the call in time")
    if exc.errno in (errno.EACCES, errno.EPERM):  # (in the CLI's words: not "not running")
        said = "permission denied while trying to connect to the Docker daemon socket at"
        return _failed(action, 1, f"{said} unix://{path}: {exc.strerror}")
    return _failed(action, 1, f"Cannot connect to the Docker daemon at {path}: {exc}")


def _connect(path: str, timeout: float) -> socket.socket:
    """A connection to the engine's socket, within `timeout`. A Unix socket whose queue of
    connections not yet taken is full refuses at once (EAGAIN), however well its engine
    runs: an engine busy for a moment (many callers at once). That is tried again until
    `timeout`, never taken for an engine that is not there."""
    deadline, pause = time.monotonic() + timeout, 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)  # (each read's; the call's own deadline is its watchdog's)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EAGAIN or time.monotonic() + pause >= deadline:
                raise _NoEngine(exc.errno, str(exc)) from exc
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


class _Upload:
    """A file sent as a request's body: its length as it is now, then its bytes."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.size = file, os.fstat(file.fileno()).st_size


def _exchange(
    sock: socket.socket, method: str, target: str, data: bytes | _Upload | None, limit: int
) -> tuple[int, bytes, bool]:
    """Send one request, read its whole answer: (status, body of at most `limit` bytes,
    whether the body was longer)."""
    head = f"{method} {target} HTTP/1.0\r\nHost: docker\r\nConnection: close\r\n"
    if isinstance(data, _Upload):
        head += f"Content-Type: application/x-tar\r\nContent-Length: {data.size}\r\n"
        sock.sendall(head.encode() + b"\r\n")
        data.file.seek(0)
        if sock.sendfile(data.file, 0, data.size) != data.size:
            raise _Broken("the file to send ended short of its length")
    else:
        if data is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        sock.sendall(head.encode() + b"\r\n" + (data or b""))
    status, length, got = _answer_head(sock)
    while len(got) <= limit and not 0 <= length <= len(got):
        # (all of it, by its length: one that keeps the line open too)
        if not (chunk := sock.recv(1 << 16)):
            break
        got += chunk
    if len(got) > limit:
        return status, bytes(got[:limit]), True
    body = bytes(got)
    if length >= 0 and len(body) != length:
        raise _Broken(f"{len(body)} bytes of {length}")
    return status, body, False


def _answer_head(sock: socket.socket) -> tuple[int, int, bytearray]:
    """Read an answer's head: its status, its Content-Length (-1: none given), and what of
    its body came with the head."""
    got = bytearray()
    while chunk := sock.recv(1 << 16):
        got += chunk
        # (looked for again only in what came since: an answer in drops)
        end = got.find(b"\r\n\r\n", max(0, len(got) - len(chunk) - 3), HEAD_LIMIT + 4)
        if end >= 0:
            status, length = _head(bytes(got[:end]))
            del got[: end + 4]
            return status, length, got
        if len(got) > HEAD_LIMIT:
            raise _Broken("the answer's headers are too long")
    raise _Broken(f"no answer: {bytes(got[:200])!r}")


def _head(head: bytes) -> tuple[int, int]:
    """An answer's status and Content-Length (-1: none given)."""
    first, *lines = head.decode("latin-1").split("\r\n")
    version, _, rest = first.partition(" ")
    code = rest[:3]
    number = code.isascii() and code.isdigit()  # (isdigit alone takes "²")
    if not (version.startswith("HTTP/1.") and number and rest[3:4] in ("", " ")):
        raise _Broken(f"not an HTTP answer: {first[:200]!r}")
    length = -1
    for line in lines:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "content-length":
            digits = value.isascii() and value.isdigit() and len(value) <= 18
            if not digits or length not in (-1, int(value)):
                raise _Broken(f"a length of {value[:50]!r}")
            length = int(value)
        elif name == "transfer-encoding" and value.lower() != "identity":
            raise _Broken(f"an answer in {value[:50]!r}, to an HTTP/1.0 request")
    return int(code), length


def _chosen_context() -> str:
    """The Docker context the CLI would use ("default" when none is chosen)."""
    if name := os.environ.get("DOCKER_CONTEXT", "").strip():
        return name
    path = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    raw = read_regular(path, MAX_ANSWER, follow=True)  # (a FIFO there would hang a read)
    if raw is None:  # none: the CLI's default; anything else is not ours to guess
        return UNREAD if os.path.lexists(path) else "default"
    try:
        if len(raw) > MAX_ANSWER:
            raise ValueError("too long to read here")
        config = json.loads(raw)
    except ValueError:
        return UNREAD  # whatever the CLI makes of it, not ours to guess
    chosen = config.get("currentContext") if isinstance(config, dict) else None
    return chosen if isinstance(chosen, str) and chosen else "default"


def local_socket(host: str = "") -> str | None:
    """The Unix socket of engine `host` (else the process's, as the CLI would reach it), or
    None (another kind, a context the CLI resolves itself, or an API version pinned with
    DOCKER_API_VERSION, which the CLI keeps and these calls would not)."""
    if os.environ.get("DOCKER_API_VERSION", "").strip():
        return None
    host = host or engine_host()
    if host.startswith("unix://"):
        return host.removeprefix("unix://") or None
    if host or _chosen_context() != "default":
        return None
    return DEFAULT_SOCKET


def resolved_host(host: str = "", *, default: bool = False) -> str:
    """The address the docker CLI reaches for `host` ("": the process's engine, or with
    `default` the CLI's own default, whatever this process names): `host`, else the
    process's, else the default context's socket; "" for a context the CLI resolves itself
    (not ours to guess). What a project records, so whoever reads the record, working with
    whichever engine, reaches that one."""
    host = host or ("" if default else engine_host())  # (DOCKER_HOST included)
    if host:
        return host
    return f"unix://{DEFAULT_SOCKET}" if _chosen_context() == "default" else ""


def call(
    action: str,
    path: str,
    method: str,
    url: str,
    *,
    body: Any = None,
    query: dict[str, str] | list[tuple[str, str]] | None = None,
    timeout: float,
    limit: int = MAX_ANSWER,
    upload: BinaryIO | None = None,
) -> Any:
    """One API call: the answer's JSON (None when empty; one over `limit` bytes fails as
    broken off, never cut short silently). An answer of 400 and above raises
    the error the CLI's would (classified from the engine's message); no answer within
    `timeout` raises one with the CLI's timed-out status. `upload`: a regular file sent
    whole as the body (a tar), by sendfile(2), within the same deadline."""
    target = quote(url) + (f"?{urlencode(query)}" if query else "")
    data: bytes | _Upload | None = None if body is None else json.dumps(body).encode()
    if upload is not None:
        data = _Upload(upload)
    expired = threading.Event()
    sock: socket.socket | None = None

    def expire() -> None:  # the whole call's deadline: the socket's own is per read
        expired.set()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    began = time.monotonic()
    watchdog: threading.Timer | None = None
    try:
        sock = _connect(path, timeout)
        # the rest of the call's deadline (a full queue may have taken some of it)
        watchdog = threading.Timer(max(0.0, timeout - (time.monotonic() - began)), expire)
        watchdog.daemon = True
        watchdog.start()
        status, raw, longer = _exchange(sock, method, target, data, limit)
    except TimeoutError:
        raise _failed(action, TIMED_OUT, "the engine did not answer in time") from None
    except _NoEngine as exc:
        raise _unreached(action, path, exc) from None
    except OSError as exc:
        if expired.is_set():
            raise _failed(action, TIMED_OUT, "the engine did not answer in time") from None
        raise _failed(action, 1, f"the engine's answer broke off: {exc!r}") from None
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if sock is not None:
            sock.close()
    if expired.is_set():
        raise _failed(action, TIMED_OUT, "the engine did not answer in time")
    if longer:
        raise TooLong(f"{action}: the engine's answer is longer than {limit} bytes")
    if status >= 400:
        raise _refused(action, raw)
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        raise _failed(action, 1, f"the engine's answer broke off: {raw[:200]!r}") from None


def logs(
    path: str, container: str, *, tail: int | None, follow: bool, within: float | None
) -> Iterator[bytes]:
    """A container's log, both streams in the order they were written, as it comes (the
    API's answer read as a stream, never whole): ended when the caller stops reading, and
    after `within` seconds (None: a log that follows, ended by its caller). What `docker
    logs` prints; its errors typed as the CLI's are."""
    action = f"reading the log of {container}"
    bound = within or TIMED_OUT_LOGS
    info = call(action, path, "GET", f"/containers/{quote(container)}/json", timeout=bound)
    config = info.get("Config") if isinstance(info, dict) else None
    tty = isinstance(config, dict) and config.get("Tty") is True  # (its log not framed)
    query = [
        ("stdout", "1"),
        ("stderr", "1"),
        ("tail", "all" if tail is None else str(tail)),
        ("follow", "1" if follow else "0"),
    ]
    target = f"/containers/{quote(container)}/logs?{urlencode(query)}"
    try:
        sock = _connect(path, bound)
    except _NoEngine as exc:  # (the inspection just answered: a full queue, in all likelihood)
        raise _unreached(action, path, exc) from None
    expired = threading.Event()
    watchdog = None
    if within is not None:  # the whole read's deadline (the socket's own is per read)
        watchdog = threading.Timer(within, lambda: _cut(sock, expired))
        watchdog.daemon = True
        watchdog.start()
    try:
        head = f"GET {target} HTTP/1.0\r\nHost: docker\r\nConnection: close\r\n\r\n"
        sock.sendall(head.encode())
        status, _, got = _answer_head(sock)
        if status >= 400:
            while len(got) <= MAX_ANSWER and (chunk := sock.recv(1 << 16)):
                got += chunk
            raise _refused(action, bytes(got[:MAX_ANSWER]))
        if follow:
            sock.settimeout(None)  # (a quiet log is not a dead engine)
        frames = _Frames(raw=tty)
        if piece := frames.feed(got):
            yield piece
        while chunk := sock.recv(1 << 16):
            if piece := frames.feed(chunk):
                yield piece
        if expired.is_set():  # (cut short: never said as the log's end)
            raise TimeoutError
        if frames.left or frames.head:
            raise _Broken("the log ended inside a frame")
    except TimeoutError:
        raise _failed(action, TIMED_OUT, "the engine did not answer in time") from None
    except OSError as exc:
        raise _failed(action, 1, f"the engine's answer broke off: {exc!r}") from None
    finally:
        if watchdog is not None:
            watchdog.cancel()
        sock.close()


TIMED_OUT_LOGS = 30.0
"""Seconds a followed log's first answer may take (its lines then come when they come)."""


def _cut(sock: socket.socket, expired: threading.Event) -> None:
    expired.set()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Frames:
    """The engine's framing of a log without a terminal taken off (each frame: a byte for
    its stream, three zero bytes, its length in four, then that many bytes), one frame's
    bytes passed on as they come, never held whole; a terminal's log passed on as it is.
    A frame of stream 3 is the engine's own error: said (its first 2,000 bytes), as the
    log's end."""

    def __init__(self, *, raw: bool) -> None:
        self.raw = raw
        self.head = bytearray()
        self.left = 0  # bytes of the current frame still to come
        self.said: bytearray | None = None  # an engine's own error frame (stream 3), read

    def feed(self, data: bytes | bytearray) -> bytes:
        if self.raw:
            return bytes(data)
        out = bytearray()
        view = memoryview(data)
        while view:
            if self.left:
                piece = view[: self.left]
                if self.said is None:
                    out += piece
                else:
                    self.said += piece[: max(0, 2000 - len(self.said))]
                self.left -= len(piece)
                view = view[len(piece) :]
                if not self.left and self.said is not None:  # the engine's own words
                    raise _Broken(f"the engine said: {self.said.decode(errors='replace')}")
                continue
            take = 8 - len(self.head)
            self.head += view[:take]
            view = view[take:]
            if len(self.head) == 8:
                if self.head[0] not in (0, 1, 2, 3) or any(self.head[1:4]):
                    raise _Broken(f"not a log frame: {bytes(self.head)!r}")
                self.said = bytearray() if self.head[0] == 3 else None
                self.left = int.from_bytes(self.head[4:8], "big")
                self.head.clear()
                if not self.left and self.said is not None:
                    raise _Broken("the engine said: (nothing)")
        return bytes(out)


@dataclass(frozen=True)
class Health:
    status: str | None


@dataclass(frozen=True)
class ContainerState:
    """A container's state as the API's inspection gives it (`State`), under the names
    python-on-whales gives the CLI's: callers read either the same way."""

    status: str
    running: bool
    paused: bool
    exit_code: int
    oom_killed: bool
    error: str
    health: Health | None

    @classmethod
    def of(cls, state: object) -> ContainerState:
        got = state if isinstance(state, dict) else {}
        health = got.get("Health")
        return cls(
            status=str(got.get("Status") or ""),
            running=bool(got.get("Running")),
            paused=bool(got.get("Paused")),
            exit_code=_whole(got.get("ExitCode")),
            oom_killed=bool(got.get("OOMKilled")),
            error=str(got.get("Error") or ""),
            health=Health(health.get("Status")) if isinstance(health, dict) else None,
        )


def _whole(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _refused(action: str, raw: bytes) -> OrchestratorError:
    """The error of an answer of 400 and above, in the CLI's words (typed from the
    engine's message)."""
    try:
        message = str(json.loads(raw).get("message", ""))
    except (ValueError, AttributeError):
        message = raw.decode("utf-8", "replace")
    return _failed(action, 125, f"Error response from daemon: {message}")


def _failed(action: str, status: int, stderr: str) -> OrchestratorError:
    """The error the docker CLI's call would have raised with this status and stderr."""
    return wrap(action, CallFailed(["docker", "(engine API)"], status, "", stderr))


@dataclass(frozen=True)
class EngineFacts:
    """What an engine is, as far as what it can hold depends on it."""

    kind: str
    """"docker" or "podman" (Podman's Docker-compatible API)."""
    rootless: bool = False
    """Podman running as an unprivileged user (its containers' root is that user)."""
    cgroup_v1: bool = False
    """Rootless Podman on cgroup v1 ignores every resource limit, without a word."""


_FACTS: dict[tuple[str, str], EngineFacts] = {}
_FACTS_LOCK = threading.Lock()


def engine_facts(host: str, ask: Callable[[], Iterable[str]], timeout: float) -> EngineFacts:
    """What the engine at `host` ("": the process's) is, by the names of its components
    (Podman's API calls its own "Podman Engine"), and for Podman whether it is rootless on
    cgroup v1 (its own `libpod/info`). Asked once per address and socket in a process,
    over the socket when it is on this machine, else with `ask` (the names, through the
    CLI). A Podman that is not on this machine's socket is refused: what it holds cannot
    be asked."""
    sock = local_socket(host)
    try:  # a socket made again (an engine restarted, or another one in its place) is new
        made = os.stat(sock) if sock else None
        identity = f"{sock}:{made.st_dev}:{made.st_ino}" if made else ""
    except OSError:
        identity = sock or ""
    key = (host or engine_host(), identity)
    with _FACTS_LOCK:
        if key in _FACTS:
            return _FACTS[key]
    action = "asking what the engine is"
    if sock:
        answer = call(action, sock, "GET", "/version", timeout=timeout)
        listed = answer.get("Components") if isinstance(answer, dict) else None
        names = [str(c.get("Name", "")) for c in listed or [] if isinstance(c, dict)]
    else:
        names = list(ask())
    facts = EngineFacts("docker")
    if any("podman" in n.lower() for n in names):
        if not sock:
            raise BackendUnavailable(
                f"the engine at {key[0]} is Podman, which runs environments only on this "
                "machine's socket (--engine podman): whether it can hold their limits "
                "cannot be asked from here"
            )
        info = call(action, sock, "GET", "/v4.0.0/libpod/info", timeout=timeout)
        found = info.get("host") if isinstance(info, dict) else None
        about: dict[str, Any] = found if isinstance(found, dict) else {}
        listed_security = about.get("security")
        security: dict[str, Any] = listed_security if isinstance(listed_security, dict) else {}
        facts = EngineFacts(
            "podman",
            rootless=security.get("rootless") is True,
            cgroup_v1=about.get("cgroupVersion") == "v1",
        )
    with _FACTS_LOCK:
        _FACTS[key] = facts
    return facts
