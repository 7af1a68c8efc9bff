"""engine/api.py: the Engine API calls made straight on the local socket. Each has a deadline
and a bounded answer, fails as the docker CLI's call would (typed from the engine's words),
and is used only for an engine the CLI itself would reach on that socket."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.backends.container.engine import TIMED_OUT, NoSuchContainer
from orchestrator.backends.container.engine import api as engine_api
from orchestrator.errors import BackendUnavailable, DockerError

Answer = Callable[[socket.socket, bytes], None]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Callable[[Answer], str]]:
    """A stand-in engine on a Unix socket that answers each request with `answer`."""
    servers: list[socket.socket] = []

    def start(answer: Answer) -> str:
        path = str(tmp_path / f"engine{len(servers)}.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(4)
        servers.append(server)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn, contextlib.suppress(OSError):  # the client left
                    answer(conn, _request(conn))

        threading.Thread(target=serve, daemon=True).start()
        return path

    yield start
    for server in servers:
        server.close()


def _request(conn: socket.socket) -> bytes:
    """One whole request: its head, and a body of its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while found and len(body) < int(found.group(1)):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def reply(status: int, body: bytes) -> Answer:
    def answer(conn: socket.socket, request: bytes) -> None:
        head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head + body)

    return answer


def test_an_answer_is_its_json(engine: Callable[[Answer], str]) -> None:
    sock = engine(reply(201, b'{"Id": "abc"}'))
    got = engine_api.call("creating", sock, "POST", "/containers/create", body={}, timeout=5)
    assert got == {"Id": "abc"}


def test_an_engine_error_is_typed_as_the_clis_would_be(engine: Callable[[Answer], str]) -> None:
    sock = engine(reply(404, b'{"message": "No such container: orch-x-main-1"}'))
    with pytest.raises(NoSuchContainer, match="removing"):
        engine_api.call("removing", sock, "DELETE", "/containers/orch-x-main-1", timeout=5)


def test_an_engine_that_never_answers_is_given_up_on(engine: Callable[[Answer], str]) -> None:
    def silent(conn: socket.socket, request: bytes) -> None:
        time.sleep(30)

    sock = engine(silent)
    began = time.monotonic()
    with pytest.raises(DockerError) as caught:
        engine_api.call("starting", sock, "POST", "/containers/x/start", timeout=0.5)
    assert caught.value.returncode == TIMED_OUT and time.monotonic() - began < 5


def test_an_endless_answer_is_read_only_to_its_bound(engine: Callable[[Answer], str]) -> None:
    """A hostile or broken engine streaming forever: the read stops at MAX_ANSWER, and the
    answer fails as too long (never cut short to pass for a whole one)."""

    def endless(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n")
        chunk = b" " * 65536
        for _ in range(4 * engine_api.MAX_ANSWER // len(chunk)):
            conn.sendall(chunk)

    sock = engine(endless)
    with pytest.raises(engine_api.TooLong):
        engine_api.call("listing", sock, "GET", "/x", timeout=5)


def test_an_answer_dripping_in_is_given_up_on_at_the_deadline(
    engine: Callable[[Answer], str],
) -> None:
    """A byte every half second never trips the socket's per-read timeout: the whole call
    still ends at its deadline."""

    def drip(conn: socket.socket, request: bytes) -> None:
        body = b'{"Id": "' + b"a" * 200 + b'"}'
        for byte in b"HTTP/1.1 201 X\r\nContent-Length: %d\r\n\r\n" % len(body) + body:
            conn.sendall(bytes([byte]))
            time.sleep(0.5)

    sock = engine(drip)
    began = time.monotonic()
    with pytest.raises(DockerError) as caught:
        engine_api.call("creating", sock, "POST", "/containers/create", body={}, timeout=2)
    assert caught.value.returncode == TIMED_OUT and time.monotonic() - began < 4


def test_no_engine_there_is_backend_unavailable(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable):
        engine_api.call("starting", str(tmp_path / "none.sock"), "GET", "/x", timeout=2)


@contextlib.contextmanager
def _full_queue(
    path: str, *, taken_after: float | None = None, answered_after: float = 0.0
) -> Iterator[None]:
    """A listening socket at `path` whose queue of connections not yet taken is full; with
    `taken_after`, the queue is emptied after that many seconds and each GET then taken is
    answered `{}` after `answered_after` seconds."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    waiting: list[socket.socket] = []
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            client.connect(path)
        except BlockingIOError:
            client.close()
            break
        waiting.append(client)

    def take_them_late() -> None:
        assert taken_after is not None
        time.sleep(taken_after)
        for client in waiting:  # (each then taken, and found saying nothing)
            client.close()
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                if _request(conn).startswith(b"GET"):
                    time.sleep(answered_after)
                    reply(200, b"{}")(conn, b"")

    if taken_after is not None:
        threading.Thread(target=take_them_late, daemon=True).start()
    try:
        yield
    finally:
        server.close()
        for client in waiting:
            client.close()


def test_an_engine_whose_socket_queue_is_full_for_a_moment_is_waited_for(tmp_path: Path) -> None:
    """CI: `ps` under load listed nothing and exited 0. The engine's socket refused the
    connection at once (EAGAIN: its queue was full), which was taken for no engine there,
    and a backend whose engine is not there is left out of a listing silently."""
    path = str(tmp_path / "busy.sock")
    with _full_queue(path, taken_after=0.3):
        assert engine_api.call("listing", path, "GET", "/containers/json", timeout=5) == {}


def test_an_engine_whose_socket_queue_stays_full_times_out_and_is_not_missing(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "stuck.sock")
    began = time.monotonic()
    with _full_queue(path), pytest.raises(DockerError) as caught:
        engine_api.call("listing", path, "GET", "/containers/json", timeout=0.5)
    assert not isinstance(caught.value, BackendUnavailable), caught.value
    assert caught.value.returncode == TIMED_OUT and time.monotonic() - began < 3


def test_a_full_queue_counts_against_the_calls_deadline(tmp_path: Path) -> None:
    """(review: the call's deadline began once connected, so a call could take twice it)"""
    path = str(tmp_path / "slow.sock")
    began = time.monotonic()
    with (
        _full_queue(path, taken_after=0.7, answered_after=0.7),
        pytest.raises(DockerError) as caught,
    ):
        engine_api.call("listing", path, "GET", "/containers/json", timeout=1.0)
    assert caught.value.returncode == TIMED_OUT
    assert time.monotonic() - began < 1.3


def test_an_answer_broken_off_is_an_engine_error_not_a_missing_engine(
    engine: Callable[[Answer], str],
) -> None:
    def hang_up(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")

    sock = engine(hang_up)
    with pytest.raises(DockerError, match="broke off") as caught:
        engine_api.call("creating", sock, "POST", "/containers/create", body={}, timeout=5)
    assert not isinstance(caught.value, BackendUnavailable)


@pytest.mark.parametrize(
    ("said", "words"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "chunked"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}{}", "4 bytes of 2"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n{}", "a length of"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 4\r\n\r\n{}{}", "a length"),
        (b"SSH-2.0-OpenSSH\r\n\r\n{}", "not an HTTP answer"),
        (b"HTTP/1.1 2000 OK\r\n\r\n{}", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (70 * 1024), "headers are too long"),
        (b"HTTP/1.1 200 OK\r\n", "no answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\n{}", "a length of"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n{}", "a length of"),
        (b"HTTP/1.1 \xc2\xb200 OK\r\n\r\n{}", "not an HTTP answer"),
    ],
    ids=[
        "chunked",
        "longer",
        "negative",
        "two-lengths",
        "not-http",
        "odd-status",
        "endless-head",
        "no-body",
        "superscript-length",
        "huge-length",
        "superscript-status",
    ],
)
def test_an_answer_that_is_not_plain_http_is_broken_off(
    engine: Callable[[Answer], str], said: bytes, words: str
) -> None:
    """ATTACK (a socket that is not the engine's, or an engine gone wrong): an answer in a
    form this reader does not take is never taken as a whole one, and a head without end is
    read only to its bound."""

    def answer(conn: socket.socket, request: bytes) -> None:
        conn.sendall(said)

    sock = engine(answer)
    with pytest.raises(DockerError, match="broke off") as caught:
        engine_api.call("listing", sock, "GET", "/x", timeout=5)
    assert words in str(caught.value)


def test_an_answer_in_single_bytes_is_read_whole(engine: Callable[[Answer], str]) -> None:
    """The end of the head is found wherever the pieces split it."""

    def answer(conn: socket.socket, request: bytes) -> None:
        for byte in b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"a": 1}':
            conn.sendall(bytes([byte]))
            time.sleep(0.005)  # (each its own read)

    assert engine_api.call("x", engine(answer), "GET", "/x", timeout=10) == {"a": 1}


def test_an_answer_of_its_length_is_taken_on_a_line_kept_open(
    engine: Callable[[Answer], str],
) -> None:
    """An engine (or a proxy before it) that keeps the connection open after a whole answer
    is not waited on to its deadline."""

    def answer(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
        time.sleep(10)

    began = time.monotonic()
    assert engine_api.call("listing", engine(answer), "GET", "/x", timeout=5) == []
    assert time.monotonic() - began < 2


def test_an_answer_without_a_length_ends_at_the_close(engine: Callable[[Answer], str]) -> None:
    def answer(conn: socket.socket, request: bytes) -> None:
        for part in (b"HTTP/1.0 200 OK\r\n", b"Content-Type: x\r\n\r\n[1,", b" 2]"):
            conn.sendall(part)
            time.sleep(0.05)

    assert engine_api.call("listing", engine(answer), "GET", "/x", timeout=5) == [1, 2]


def test_a_name_is_one_path_segment(engine: Callable[[Answer], str]) -> None:
    seen: list[bytes] = []

    def record(conn: socket.socket, request: bytes) -> None:
        seen.append(request.split(b"\r\n")[0])
        reply(204, b"")(conn, request)

    sock = engine(record)
    engine_api.call("x", sock, "DELETE", "/containers/a b?c", query={"force": "1"}, timeout=5)
    assert seen == [b"DELETE /containers/a%20b%3Fc?force=1 HTTP/1.0"]


@pytest.mark.parametrize(
    ("variables", "config", "expected"),
    [
        ({}, None, engine_api.DEFAULT_SOCKET),
        ({"DOCKER_HOST": "unix:///run/other.sock"}, None, "/run/other.sock"),
        ({"ORCHESTRATOR_DOCKER_HOST": "unix:///run/o.sock"}, None, "/run/o.sock"),
        ({"DOCKER_HOST": "tcp://127.0.0.1:2375"}, None, None),
        ({"DOCKER_HOST": "ssh://me@there"}, None, None),
        ({"DOCKER_CONTEXT": "remote"}, None, None),
        ({"DOCKER_CONTEXT": "default"}, None, engine_api.DEFAULT_SOCKET),
        ({"DOCKER_API_VERSION": "1.41"}, None, None),  # pinned: the CLI keeps it, we would not
        ({"DOCKER_API_VERSION": "1.41", "DOCKER_HOST": "unix:///run/o.sock"}, None, None),
        ({}, {"currentContext": "remote"}, None),
        ({}, {"currentContext": "default"}, engine_api.DEFAULT_SOCKET),
        ({}, "not json", None),  # whatever the CLI makes of it: not guessed here
        ({}, "x" * (engine_api.MAX_ANSWER + 1), None),  # too long to read here
        ({}, "fifo", None),  # not a file: never waited on
    ],
)
def test_only_the_engine_the_cli_would_reach_on_its_socket(
    variables: dict[str, str],
    config: object,
    expected: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("DOCKER_HOST", "ORCHESTRATOR_DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_API_VERSION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    if config == "fifo":
        os.mkfifo(tmp_path / "config.json")
    elif config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "config.json").write_text(text)
    assert engine_api.local_socket() == expected


def _versioned(components: list[str], libpod: dict[str, object] | None = None) -> Answer:
    """An engine whose /version lists these components, and whose libpod/info says this."""

    def answer(conn: socket.socket, request: bytes) -> None:
        if b"/libpod/info" in request.split(b"\r\n", 1)[0]:
            body = json.dumps(libpod or {}).encode()
        else:
            body = json.dumps({"Components": [{"Name": n} for n in components]}).encode()
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    return answer


@pytest.mark.parametrize(
    ("components", "libpod", "want"),
    [
        (["Engine", "containerd", "runc"], None, engine_api.EngineFacts("docker")),
        (["Podman Engine"], {"host": {"cgroupVersion": "v2"}}, engine_api.EngineFacts("podman")),
        (
            ["Podman Engine", "Conmon"],
            {"host": {"cgroupVersion": "v1", "security": {"rootless": True}}},
            engine_api.EngineFacts("podman", rootless=True, cgroup_v1=True),
        ),
        # an answer of the wrong shapes says nothing rootless: root, limits kept
        (["Podman Engine"], {"host": {"security": "rootless"}}, engine_api.EngineFacts("podman")),
    ],
)
def test_what_the_engine_is_comes_from_its_own_answers(
    engine: Callable[[Answer], str],
    components: list[str],
    libpod: dict[str, object] | None,
    want: engine_api.EngineFacts,
) -> None:
    sock = engine(_versioned(components, libpod))
    asked: list[str] = []
    got = engine_api.engine_facts(f"unix://{sock}", lambda: asked or ["unused"], timeout=5)
    assert got == want and asked == []  # over the socket, not the CLI


def test_a_podman_not_on_this_machines_socket_is_refused() -> None:
    with pytest.raises(BackendUnavailable, match="only on this machine's socket"):
        engine_api.engine_facts("tcp://10.0.0.9:2375", lambda: ["Podman Engine"], timeout=5)
    facts = engine_api.engine_facts("tcp://10.0.0.8:2375", lambda: ["Engine"], timeout=5)
    assert facts.kind == "docker"


@pytest.mark.parametrize(
    "state",
    [None, [], "running", {"Running": "yes", "ExitCode": "x", "Health": "healthy"}],
    ids=["none", "list", "text", "odd-values"],
)
def test_a_container_state_of_any_shape_reads_as_not_running_or_plain_values(
    state: object,
) -> None:
    """An engine's answer is read, not trusted: whatever shape `State` has, a state comes
    out with plain values (a missing or odd field is not running, exit 0, no health)."""
    from orchestrator.backends.container.engine.api import ContainerState

    got = ContainerState.of(state)
    assert got.paused is False and got.exit_code == 0 and got.health is None
    assert got.running is (isinstance(state, dict))  # "yes" is truthy, as the CLI reads it


def test_a_container_state_reads_the_fields_python_on_whales_names() -> None:
    from orchestrator.backends.container.engine.api import ContainerState

    state = {
        "Status": "exited",
        "Running": False,
        "Paused": False,
        "ExitCode": 137,
        "OOMKilled": True,
        "Error": "boom",
        "Health": {"Status": "unhealthy"},
    }
    got = ContainerState.of(state)
    assert (got.status, got.running, got.exit_code, got.oom_killed, got.error) == (
        "exited",
        False,
        137,
        True,
        "boom",
    )
    assert got.health is not None and got.health.status == "unhealthy"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"Config": ["x"]}', ("/", None)),
        (b'{"Config": "weird"}', ("/", None)),
        (b"[]", ("/", None)),
        (b'{"Config": {"WorkingDir": ".", "User": ""}}', ("/", None)),
        (b'{"Config": {"WorkingDir": "/srv", "User": "1000:1000"}}', ("/srv", "1000:1000")),
    ],
    ids=["list", "text", "not-an-object", "unset", "set"],
)
def test_exec_defaults_from_an_answer_of_any_shape_are_plain(
    engine: Callable[[Answer], str], body: bytes, expected: tuple[str, str | None]
) -> None:
    """Where `docker exec` starts and as whom, read from the engine's inspection on its
    socket: an odd answer reads as the defaults (/ and the image's user), never an error
    of another kind."""
    from orchestrator.backends.container.engine import Engine
    from orchestrator.backends.docker.lifecycle import Project

    project = Project.__new__(Project)
    project.name = "orch-odd-12345678"
    project.engine = Engine.at(f"unix://{engine(reply(200, body))}")
    assert project.exec_defaults("main") == expected


def test_a_socket_we_may_not_use_is_said_as_the_cli_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permission denied on the engine's socket is the CLI's error (exit 1, its words), not
    "the engine is not reachable: start it" (exit 3), which sends a user to start a
    daemon that runs."""
    import errno
    import socket as sockets

    from orchestrator.backends.container.engine import api
    from orchestrator.errors import BackendUnavailable, DockerError

    def refused(self: sockets.socket, address: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(sockets.socket, "connect", refused)
    with pytest.raises(DockerError, match="permission denied while trying to connect") as said:
        api.call("listing", str(tmp_path / "docker.sock"), "GET", "/networks", timeout=5)
    assert not isinstance(said.value, BackendUnavailable) and said.value.exit_code == 1


def _log_engine(
    frames: bytes, *, tty: bool = False, piece: int = 1 << 16, then: float = 0.0, status: int = 200
) -> Answer:
    """An engine whose container `c` has the log `frames` (sent in pieces of `piece` bytes),
    then stays open `then` seconds."""

    def answer(conn: socket.socket, request: bytes) -> None:
        if b"/json" in request.split(b"\r\n")[0]:
            reply(200, json.dumps({"Config": {"Tty": tty}}).encode())(conn, request)
            return
        if status >= 400:
            reply(status, b'{"message": "No such container: c"}')(conn, request)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n")
        for at in range(0, len(frames), piece):
            conn.sendall(frames[at : at + piece])
        time.sleep(then)

    return answer


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def _log(sock: str, **kw: object) -> bytes:
    options: dict[str, object] = {"tail": None, "follow": False, "within": 10.0, **kw}
    return b"".join(engine_api.logs(sock, "c", **options))  # type: ignore[arg-type]


def test_a_log_is_its_frames_taken_off_however_its_bytes_come(
    engine: Callable[[Answer], str],
) -> None:
    frames = frame(1, b"one\n") + frame(2, b"two\n") + frame(1, b"") + frame(1, b"\xff end\n")
    for piece in (1, 3, 9, 1 << 16):
        assert _log(engine(_log_engine(frames, piece=piece))) == b"one\ntwo\n\xff end\n"
    # a container with a terminal logs its bytes as they are (no frames)
    assert _log(engine(_log_engine(b"\x01raw\n", tty=True))) == b"\x01raw\n"


def test_a_log_that_is_not_frames_or_ends_inside_one_is_an_error(
    engine: Callable[[Answer], str],
) -> None:
    for broken in (b"\x07\x00\x00\x00\x00\x00\x00\x01x", frame(1, b"cut short")[:-3]):
        with pytest.raises(DockerError, match="broke off"):
            _log(engine(_log_engine(broken)))
    # the engine's own error, in a frame of its own (stream 3): said, never passed as output
    said = frame(1, b"before\n") + frame(3, b"log driver failed")
    with pytest.raises(DockerError, match="the engine said: log driver failed"):
        _log(engine(_log_engine(said)))
    with pytest.raises(NoSuchContainer):
        _log(engine(_log_engine(b"", status=404)))


def test_a_log_comes_as_it_comes_and_is_cut_at_its_deadline_never_silently(
    engine: Callable[[Answer], str],
) -> None:
    """A frame of 4 GiB is passed on as its bytes come (never held whole); a log still
    coming at `within` fails as timed out rather than passing for its whole."""
    huge = bytes([1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]) + b"x" * 65536
    sock = engine(_log_engine(huge, then=30))
    began = time.monotonic()
    chunks = engine_api.logs(sock, "c", tail=None, follow=False, within=2.0)
    first = next(chunks)
    assert first and set(first) == {ord("x")} and time.monotonic() - began < 2
    with pytest.raises(DockerError) as caught:
        for _ in chunks:
            pass
    assert caught.value.returncode == TIMED_OUT and time.monotonic() - began < 6


def test_an_upload_sends_the_file_whole_as_a_tar_body(
    engine: Callable[[Answer], str], tmp_path: Path
) -> None:
    seen: list[bytes] = []

    def answer(conn: socket.socket, request: bytes) -> None:
        seen.append(request)
        reply(200, b"")(conn, request)

    data = os.urandom(300_000)
    (tmp_path / "a.tar").write_bytes(data)
    with open(tmp_path / "a.tar", "rb") as tar:
        tar.read(10)  # (sent from its start, wherever it was read to)
        got = engine_api.call("x", engine(answer), "PUT", "/a", upload=tar, timeout=10)
    assert got is None
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert b"Content-Type: application/x-tar" in head
    assert f"Content-Length: {len(data)}".encode() in head and body == data


def test_an_upload_the_engine_never_reads_is_given_up_on_at_the_deadline(tmp_path: Path) -> None:
    (tmp_path / "a.tar").write_bytes(b"x" * (64 << 20))  # more than a socket's buffers hold
    path = str(tmp_path / "engine.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)  # takes the connection, never reads from it
        began = time.monotonic()
        with open(tmp_path / "a.tar", "rb") as tar, pytest.raises(DockerError) as caught:
            engine_api.call("putting", path, "PUT", "/a", upload=tar, timeout=1)
    assert caught.value.returncode == TIMED_OUT and time.monotonic() - began < 5
