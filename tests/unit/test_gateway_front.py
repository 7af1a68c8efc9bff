"""The gateway's plain-HTTP front (templates/gateway/front.py) on this machine's loopback,
driven as the gateway runs it but with a local origin server and a stand-in for Squid's
PROXY-protocol port: what it serves itself and how (framings, kept connections, retries,
bounds), and that everything else reaches Squid whole, led by a line naming the client.
The same code runs in the gateway against the real Squid: tests/docker/test_egress_front.py."""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gateway_front", ROOT / "templates" / "gateway" / "front.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Server:
    """A listening socket on loopback whose every connection `handle` serves in a thread."""

    def __init__(self, handle: Callable[[socket.socket, Server], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handle, self.connections, self.got = handle, 0, b""
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.handle, args=(conn, self), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def read_request(conn: socket.socket, buffer: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """(head, body, rest) of one request with a Content-Length (or none)."""
    while b"\r\n\r\n" not in buffer:
        got = conn.recv(65536)
        if not got:
            return b"", b"", b""
        buffer += got
    head, _, buffer = buffer.partition(b"\r\n\r\n")
    size = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            size = int(value)
    while len(buffer) < size:
        got = conn.recv(65536)
        if not got:  # (ended short of its body)
            return b"", b"", b""
        buffer += got
    return head, buffer[:size], buffer[size:]


BIG = os.urandom(3 << 20)


def origin(conn: socket.socket, server: Server) -> None:
    """Answers by path: /big (3 MiB), /chunked, /close (ends the body by closing),
    /head-204, /garbage (no HTTP), /once (then closes the kept connection)."""
    rest = b""
    with conn:
        while True:
            head, body, rest = read_request(conn, rest)
            if not head:
                return
            server.got += head + b"\r\n\r\n" + body
            path = head.split(b" ")[1]
            if path == b"/big":
                body = BIG if not head.startswith(b"HEAD ") else b""
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + body)
            elif path == b"/chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                conn.sendall(b"3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\nTrailer: t\r\n\r\n")
            elif path == b"/close":
                conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
                return
            elif path == b"/204":
                conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n")
            elif path == b"/garbage":
                conn.sendall(b"SSH-2.0-not-http\r\n\r\n")
                return
            elif path == b"/once":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nonce")
                return  # a kept connection the server ends after one answer
            elif path == b"/huge":  # 64 MiB, more than any socket's buffers hold
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
                try:
                    for _ in range(64):
                        conn.sendall(bytes(1 << 20))
                except OSError:
                    return
            elif path == b"/lfchunk":  # a size line a lenient client would end early
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                conn.sendall(b"0;a\n\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfake")
                return
            elif path == b"/both":  # chunked, and a length beside it
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n")
                conn.sendall(b"Content-Length: 99\r\n\r\n2\r\nok\r\n0\r\n\r\n")
            elif path == b"/twolengths":  # two lengths: a client may take either
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 40\r\n")
                conn.sendall(b"\r\nabcdHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfake")
                return
            elif path == b"/twocodings":  # chunked, then gzip: the last coding is not chunked
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n")
                conn.sendall(b"Transfer-Encoding: gzip\r\n\r\n2\r\nok\r\n0\r\n\r\nfake")
                return
            elif path == b"/pay":  # takes the request, closes without an answer
                return
            elif path == b"/badchunk":  # a chunk's data not ended by CRLF
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                conn.sendall(b"3\r\nabcXY0\r\n\r\n")
            elif path == b"/listed":  # Connection names the header that frames the body
                conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: content-length\r\n")
                conn.sendall(b"Content-Length: 5\r\n\r\nfive!")
            elif path == b"/echo":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def squid(conn: socket.socket, server: Server) -> None:
    """Stand-in for Squid's PROXY-protocol port: keeps what came, refuses every request."""
    with conn:
        conn.settimeout(5)
        try:
            while b"\r\n\r\n" not in server.got.split(b"\r\n", 1)[-1]:
                got = conn.recv(65536)
                if not got:
                    return
                server.got += got
        except OSError:
            return
        conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\n\r\nsquid!")


@dataclass
class Rig:
    m: ModuleType
    """The front's module, as the gateway runs it."""
    client: Callable[[], socket.socket]
    up: Server
    fake: Server
    """Squid's stand-in."""
    rules: Path


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    """The front module, its rules allowing `localhost` on the origin's port, the origin
    and the stand-in Squid running, and a `client()` that connects through it."""
    module = load()
    lookup = socket.getaddrinfo

    def resolve(host: str, *args: Any, **kwargs: Any) -> Any:
        # the front asks for the absolute name ("localhost."), which this machine's hosts
        # file does not hold; the gateway's resolver answers both alike
        return lookup(host.removesuffix(".") if host == "localhost." else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    up, fake = Server(origin), Server(squid)
    rules = tmp_path / "rules.conf"
    rules.write_text(f"http_access allow x\n#@front name localhost {up.port}\n")
    monkeypatch.setattr(module, "RULES", str(rules))
    monkeypatch.setattr(module, "SQUID", ("127.0.0.1", fake.port))
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        while True:
            try:
                sock, peer = listener.accept()
            except OSError:
                return
            sock.setblocking(False)
            if module.admit(sock, peer[0]):
                threading.Thread(target=module.accepted, args=(sock, peer), daemon=True).start()
            else:
                sock.close()

    module.CLIENTS.append(module.ipaddress.ip_network("127.0.0.0/8"))
    threading.Thread(target=run, daemon=True).start()

    def client() -> socket.socket:
        sock = socket.create_connection(listener.getsockname(), timeout=10)
        return sock

    yield Rig(module, client, up, fake, rules)
    listener.close()
    up.close()
    fake.close()


def more(sock: socket.socket, out: object, buffer: bytes) -> bytes:
    """The next bytes of an answer; the test fails (never waits on) when the front ended it
    short (each read is bounded by the client socket's timeout)."""
    got = sock.recv(1 << 20)
    assert got, ("the answer ended short", out, buffer[-200:])
    return got


def answers(
    sock: socket.socket, n: int, heads: frozenset[int] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """n answers, read by their framing: (head, body) each; those whose places are in
    `heads` (answers to HEAD) bodiless."""
    out: list[tuple[bytes, bytes]] = []
    buffer = b""
    for i in range(n):
        while b"\r\n\r\n" not in buffer:
            got = sock.recv(65536)
            assert got, (out, buffer)
            buffer += got
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        fields = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        }
        if i in heads or b" 204 " in head.split(b"\r\n")[0] + b" ":
            out.append((head, b""))
        elif fields.get(b"transfer-encoding") == b"chunked":
            end = b"\r\n0\r\n\r\n"  # (the bodies here hold no such line; later answers
            while end not in buffer:  # may have come in the same read: they are kept)
                buffer += more(sock, out, buffer)
            at = buffer.index(end) + len(end)
            out.append((head, buffer[:at]))
            buffer = buffer[at:]
        elif b"content-length" in fields:
            size = int(fields[b"content-length"])
            while len(buffer) < size:
                buffer += more(sock, out, buffer)
            out.append((head, buffer[:size]))
            buffer = buffer[size:]
        else:
            while got := sock.recv(65536):
                buffer += got
            out.append((head, buffer))
            buffer = b""
    return out


def to_the_end(sock: socket.socket) -> bytes:
    """All the front sends until it ends the connection (each read bounded by the client
    socket's timeout)."""
    got = b""
    while part := sock.recv(65536):
        got += part
    return got


def get(port: int, path: str, *more: str, host: str = "localhost") -> bytes:
    lines = [f"GET http://{host}:{port}{path} HTTP/1.1", f"Host: {host}", *more]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_it_serves_allowed_requests_itself_in_every_framing_on_one_connection(front: Rig) -> None:
    port = front.up.port
    with front.client() as sock:
        sock.sendall(
            get(port, "/big", "Proxy-Connection: keep-alive", "X-Forwarded-For: 1.2.3.4")
            + get(port, "/chunked")
            + get(port, "/204")
            + f"HEAD http://localhost:{port}/big HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            + f"POST http://localhost:{port}/echo HTTP/1.1\r\nHost: x\r\n".encode()
            + b"Content-Length: 11\r\n\r\nhello there"
            + get(port, "/close")
        )
        got = answers(sock, 6, heads=frozenset({3}))
    (big_head, big), (_, chunked), (no_content, empty), (headed, _) = got[:4]
    rest = got[4:]
    assert big == BIG and b" 200 " in big_head
    # its size lines written anew (no extension), its trailer dropped
    assert chunked == b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    assert b" 204 " in no_content and empty == b""
    assert b"Content-Length: 3145728" in headed
    (_, echoed), (closing, tail) = rest
    assert echoed == b"hello there"
    assert b"Connection: close" in closing and tail == b"until the end"
    seen = front.up.got
    # one kept connection to the server served them all, but the POST (never sent twice,
    # so never on a connection the server may have closed meanwhile) and what followed it
    assert front.up.connections == 2
    assert seen.startswith(b"GET /big HTTP/1.1\r\nHost: localhost:%d\r\n" % port)
    assert b"Proxy-Connection" not in seen and b"X-Forwarded-For" not in seen
    assert front.fake.connections == 0  # nothing went to Squid


def test_everything_else_reaches_squid_whole_with_the_clients_address(front: Rig) -> None:
    port = front.up.port
    cases = [
        get(9, "/", host="denied.example"),  # a host no line names
        get(port + 1 if port < 65535 else port - 1, "/"),  # a port it does not name
        b"CONNECT localhost:%d HTTP/1.1\r\nHost: localhost\r\n\r\n" % port,
        get(port, "/", "Transfer-Encoding: chunked") + b"0\r\n\r\n",
        get(port, "/", "Expect: 100-continue"),
        get(port, "/", "Connection: upgrade", "Upgrade: websocket"),
        get(port, "/", host="127.0.0.1"),  # an address, in any form
        get(port, "/", host="0x7f.1"),
        get(port, "/", host="2130706433"),
        b"GET http://localhost:%d/ HTTP/1.0\r\n\r\n" % port,
        b"GET https://localhost:%d/ HTTP/1.1\r\nHost: localhost\r\n\r\n" % port,
        b"GET http://u@localhost:%d/ HTTP/1.1\r\nHost: localhost\r\n\r\n" % port,
        get(port, "/", "Bad Header: x"),
        get(port, "/", "X-A: a\nX-B: b"),
        get(port, "/", "X-Big: " + "a" * 70000),  # a head past 64 KiB
        get(port, "/", "Content-Length: 1", "Content-Length: 2"),
    ]
    for send in cases:
        front.fake.got = b""
        with front.client() as sock:
            sock.sendall(send)
            [(head, body)] = answers(sock, 1)
            mine, theirs = sock.getsockname()[1], sock.getpeername()[1]
        assert b" 403 " in head and body == b"squid!", send
        line, _, passed = front.fake.got.partition(b"\r\n")
        assert line == b"PROXY TCP4 127.0.0.1 127.0.0.1 %d %d" % (mine, theirs), line
        assert passed == send[: len(passed)] and len(passed) >= min(len(send), 60000), send[:80]
    assert front.up.connections == 0  # the server never heard of any of them


def test_a_later_request_of_a_kept_connection_meets_the_rules_of_its_time(front: Rig) -> None:
    port = front.up.port
    with front.client() as sock:
        sock.sendall(get(port, "/"))
        [(first, _)] = answers(sock, 1)
        new = front.rules.with_name("rules.new")  # replaced whole, as a change does
        new.write_text("# nothing may leave\n")
        new.rename(front.rules)
        sock.sendall(get(port, "/"))
        [(second, body)] = answers(sock, 1)
    assert b" 200 " in first
    assert b" 403 " in second and body == b"squid!"


def test_a_name_with_an_address_it_must_never_reach_goes_to_squid(front: Rig) -> None:
    front.m.FORBIDDEN.append(front.m.ipaddress.ip_network("127.0.0.0/8"))
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/"))
        [(head, _)] = answers(sock, 1)
    assert b" 403 " in head and front.up.connections == 0


def test_a_kept_connection_the_server_closed_is_asked_again_once(front: Rig) -> None:
    port = front.up.port
    with front.client() as sock:
        sock.sendall(get(port, "/once"))
        [(_, once)] = answers(sock, 1)
        time.sleep(0.2)  # the server has closed its end by now
        sock.sendall(get(port, "/"))
        [(head, body)] = answers(sock, 1)
    assert once == b"once" and b" 200 " in head and body == b"ok"
    assert front.up.connections == 2


def test_a_server_that_speaks_no_http_gets_the_client_a_502(front: Rig) -> None:
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/garbage"))
        [(head, body)] = answers(sock, 1)
        assert sock.recv(10) == b""  # and the connection ends
    assert b" 502 " in head and b"no valid HTTP answer" in body


def test_a_head_that_never_ends_is_cut_at_the_bound(
    front: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(front.m, "KEEP_IDLE", 0.5)
    with front.client() as sock:
        sock.sendall(b"GET http://localhost/ HTTP/1.1\r\nX-Slow: ")
        started = time.monotonic()
        assert sock.recv(10) == b""
    assert time.monotonic() - started < 3


def test_a_client_past_its_bound_is_told_so(front: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front.m, "PER_CLIENT", 3)
    held = [front.client() for _ in range(3)]
    try:
        time.sleep(0.2)
        with front.client() as extra:
            said = extra.recv(4096)
        assert b" 503 " in said and b"too many connections" in said
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while front.m.OPEN and time.monotonic() < deadline:
        time.sleep(0.05)
    with front.client() as sock:  # once they are gone, it is served again
        sock.sendall(get(front.up.port, "/"))
        [(head, _)] = answers(sock, 1)
    assert b" 200 " in head


def test_a_passed_on_connection_ends_when_squid_ends_even_if_the_client_never_does(
    front: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(front.m, "LINGER", 0.3)
    with front.client() as sock:
        sock.sendall(get(9, "/", host="denied.example"))
        [(head, _)] = answers(sock, 1)
        assert b" 403 " in head
        deadline = time.monotonic() + 5
        while front.m.OPEN and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not front.m.OPEN  # its thread and count are gone, the client still open


def pipes() -> int:
    """Pipes this process holds open."""
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") for fd in _fds())


def _fds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        out.append(fd)
    return out


def test_an_idle_kept_connection_holds_no_pipe(front: Rig) -> None:
    """Every front runs as one user, whose pipes the kernel counts together: none is held
    between requests, so idle connections cannot shrink other environments' pipes."""
    before = pipes()
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/big"))
        [(_, body)] = answers(sock, 1)
        assert body == BIG
        time.sleep(0.1)
        assert pipes() == before  # kept open, idle: no pipe


def test_a_transfer_cut_short_is_still_counted(
    front: Rig, capfd: pytest.CaptureFixture[str]
) -> None:
    with front.client() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(get(front.up.port, "/huge"))
        got = 0
        while got < 500_000:
            got += len(sock.recv(65536))
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
        lines += [x for x in capfd.readouterr().out.splitlines() if x.startswith("ORCF")]
    [line] = lines
    fields = line.split()
    assert fields[4] == "TCP_MISS/000" and fields[5] == "HIER_DIRECT", line  # cut short
    assert int(fields[6]) > 40 and 500_000 <= int(fields[7]) < 64 << 20, line


def test_framing_is_never_taken_from_a_message_by_its_connection_header(front: Rig) -> None:
    port = front.up.port
    with front.client() as sock:  # a request's: Squid frames it
        sock.sendall(get(port, "/echo", "Connection: content-length", "Content-Length: 3") + b"abc")
        [(head, body)] = answers(sock, 1)
    assert b" 403 " in head and body == b"squid!"
    with front.client() as sock:  # an answer's: passed on whole, and read by it
        sock.sendall(get(port, "/listed") + get(port, "/", "Connection: close"))
        (listed, five), (_, ok) = answers(sock, 2)
    assert b"Content-Length: 5" in listed and five == b"five!" and ok == b"ok"


def test_a_chunk_not_ended_by_crlf_ends_the_answer(front: Rig) -> None:
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/badchunk"))
        got = to_the_end(sock)
    assert got.endswith(b"\r\n\r\n3\r\nabc"), got  # the chunk, and nothing of the rest


def test_a_head_of_very_many_headers_is_refused_unparsed(front: Rig) -> None:
    """Thousands of tiny headers would parse into twenty times their bytes, here or in
    Squid: beyond 100, the request gets a 431 that says so, and goes nowhere."""
    many = [f"X-{i:x}: 1" for i in range(2000)]
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/", *many))
        [(head, body)] = answers(sock, 1)
    assert b" 431 " in head and b"at most 100 headers" in body
    assert front.up.connections == 0 and front.fake.connections == 0


def test_only_a_request_that_may_be_sent_twice_is_sent_again(front: Rig) -> None:
    """A kept connection found closed: a GET is sent again on a new one; a POST (even with
    no body) is not, its client gets a 502 (the server may have acted on it)."""
    port = front.up.port
    with front.client() as sock:
        sock.sendall(get(port, "/"))
        answers(sock, 1)
        sock.sendall(b"POST http://localhost:%d/pay HTTP/1.1\r\nHost: x\r\n" % port)
        sock.sendall(b"Content-Length: 0\r\n\r\n")
        [(head, _)] = answers(sock, 1)
    assert b" 502 " in head  # (sent once, on a new connection: never on a kept one)
    assert front.up.got.count(b"POST /pay") == 1 and front.up.connections == 2


def test_chunk_lines_are_written_anew_and_a_length_beside_a_coding_dropped(front: Rig) -> None:
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/lfchunk"))
        got = to_the_end(sock)
    assert b"fake" not in got and b"0;a" not in got, got  # the size line ends the answer
    with front.client() as sock:
        sock.sendall(get(front.up.port, "/both", "Connection: close"))
        [(head, body)] = answers(sock, 1)
    assert b"Content-Length" not in head and body == b"2\r\nok\r\n0\r\n\r\n", (head, body)


@pytest.mark.parametrize("path", ["/twolengths", "/twocodings"])
def test_an_answer_clients_would_frame_in_different_ways_is_a_502(front: Rig, path: str) -> None:
    with front.client() as sock:
        sock.sendall(get(front.up.port, path))
        got = to_the_end(sock)
    assert got.startswith(b"HTTP/1.1 502 ") and b"fake" not in got, got
