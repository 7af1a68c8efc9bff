"""The plain-HTTP front of the orchestrator egress gateway (see docs/network.md, "Plain HTTP").

Squid moves plain HTTP through a small buffer of its own: a 10 MiB download took 22 times
as long through it as directly. Here a request that the environment's rules let through
is sent on to its server by this process, and its bodies move between the two sockets by
splice(2), never through this process's memory. No proxy in the gateway's image does that
for a forward proxy with Squid's checks (socat copies; HAProxy is not in it), hence this
small one. It serves HTTP_PROXY (port 3080); HTTPS_PROXY is Squid's own port.

What it serves itself, and only that: an HTTP/1.1 request in absolute form (`GET
http://host[:port]/path`), whose host is a name (never an address) that one of the rules'
`#@front` lines names with that port, and whose every address (IPv4 only) is none that a
name must never reach (loopback, link-local, multicast, the host, a network the gateway is
on: the same as Squid's `orch_never`, `orch_host` and `orch_local`), with no
Transfer-Encoding, Expect or Upgrade. Every other connection (CONNECT, a denied host, an
address, anything it does not parse cleanly) is handed whole to Squid's PROXY-protocol port
on the gateway's loopback, which then sees the real client: its rules decide, its errors
answer and its log counts. So a mistake here can only send to Squid what it could serve,
never let through what Squid would refuse.

The rules are read from the rules file again whenever it changes (a change of egress
renames a new one over it): a request is judged by the rules of its time. Every request on
a kept-alive connection is judged anew. Bounds: a request's head (64 KiB) must arrive
within the idle time of a kept-alive connection (120 s); a transfer that moves nothing for
15 minutes ends; a connect takes at most 10 s; one client holds at most 256 connections and
all of them at most 400 (beyond, a 503 says so). One line per request it serves goes to
its stdout (`ORCF`, the fields of Squid's `ORCH` lines, its own serial), which the
environment's usage counts; nothing it writes names what a request asked for."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import select
import socket
import struct
import sys
import threading
import time
import weakref

RULES = "/etc/orchestrator-gateway/rules/rules.conf"
HOSTS = "/run/orchestrator-gateway/host.conf"
SQUID = ("127.0.0.1", 3127)
"""Squid's port for the connections handed to it, each led by a PROXY-protocol line."""
PORT = 3080
HEAD_LIMIT = 64 * 1024
ANSWER_HEADERS = 500
"""Headers in an answer at most (a server's: allowed, but bounded all the same)."""
HEADERS = 100
"""Headers in a request's head at most: one with more gets a 431 here (Squid would parse
them too, into twenty times their bytes)."""
KEEP_IDLE = 120.0
IDLE = 900.0
CONNECT_WITHIN = 10.0
PER_CLIENT = 256
TOTAL = 400
"""Connections at once: each holds at most two threads (the gateway's pids limit is 1024)
and six descriptors (two sockets, two pipes while bodies move)."""
LINGER = 5.0
"""Seconds one direction of a passed-on connection may go on once the other has ended."""
CHUNK = 1 << 20
RESOLVED_FOR = 10.0
"""Seconds a name's addresses are kept (Squid keeps them longer: its ipcache)."""
RESOLVED_MOST = 1024
NEVER = [
    ipaddress.ip_network(n) for n in ("127.0.0.0/8", "0.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4")
]
HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"x-forwarded-for",
}
"""Request headers that stay here (hop by hop, or the proxy's: Squid deletes X-Forwarded-For)."""
REFUSED = {b"transfer-encoding", b"expect", b"upgrade"}
FRAMING = {b"content-length", b"transfer-encoding", b"host", b"upgrade", b"expect"}
"""Headers a message's Connection may not name (it would drop what frames or aims it)."""
"""Request headers that send the connection to Squid (bodies or answers this does not frame)."""
NAME = set(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
TOKEN = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class Closed(Exception):
    """The connection ended, or a bound was passed: it is closed, nothing more is said."""


class BadAnswer(Closed):
    """The server sent no answer this can read (or none at all): the client gets a 502."""


class NoAnswer(BadAnswer):
    """The server's connection ended before it sent a byte: on a connection kept from an
    earlier request, the server may have closed it meanwhile (a request that may be sent
    twice, GET, HEAD or OPTIONS with no body, is sent again once, on a new connection)."""


class TimedOut(Closed):
    """A bound passed with nothing read: never taken for a connection the server closed."""


AGAIN = {b"GET", b"HEAD", b"OPTIONS"}
"""Methods whose request is sent again on a new connection when a kept one was found closed
(Squid retries the same)."""


MANY_TEXT = b"orchestrator egress gateway: a request has at most 100 headers\n"
MANY_ANSWER = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(MANY_TEXT), MANY_TEXT)
)
BAD_TEXT = b"orchestrator egress gateway: the server sent no valid HTTP answer\n"
BAD_ANSWER = (
    b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BAD_TEXT), BAD_TEXT)
)


class Rules:
    """The `#@front` lines of the rules file: `name HOST PORT...`, `suffix NAME PORT...`
    (any name under it), or `any` (every name, every port), read again when it changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: tuple[int, ...] | None = None
        self.names: dict[bytes, frozenset[int]] = {}
        self.suffixes: list[tuple[bytes, frozenset[int]]] = []
        self.anything = False

    def allows(self, host: bytes, port: int) -> bool:
        try:
            st = os.stat(RULES)
            seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            return False
        with self.lock:
            if seen != self.seen:
                self._read()
                self.seen = seen
            if self.anything:
                return True
            if port in self.names.get(host, ()):
                return True
            return any(host.endswith(b"." + s) and port in ports for s, ports in self.suffixes)

    def _read(self) -> None:
        names: dict[bytes, frozenset[int]] = {}
        suffixes, anything = [], False
        try:
            with open(RULES, "rb") as handle:
                text = handle.read(4 << 20)
        except OSError:
            text = b""
        for line in text.splitlines():
            words = line.split()
            if len(words) < 2 or words[0] != b"#@front":
                continue
            if words[1:] == [b"any"]:
                anything = True
            elif len(words) >= 4 and words[1] in (b"name", b"suffix") and set(words[2]) <= NAME:
                try:
                    ports = frozenset(int(p) for p in words[3:])
                except ValueError:
                    continue
                if words[1] == b"name":
                    names[words[2]] = names.get(words[2], frozenset()) | ports
                else:
                    suffixes.append((words[2], ports))
        self.names, self.suffixes, self.anything = names, suffixes, anything


def _forbidden_nets() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """NEVER, and what host.conf names (`orch_host`: the host's addresses, `orch_local`:
    the networks the gateway is on), IPv4 only."""
    nets = list(NEVER)
    with open(HOSTS, encoding="ascii") as handle:
        for line in handle:
            words = line.split()
            if len(words) > 3 and words[0] == "acl" and words[2] == "dst":
                for word in words[3:]:
                    net = ipaddress.ip_network(word, strict=False)
                    if net.version == 4:
                        nets.append(net)
    return nets


RULESET = Rules()
FORBIDDEN: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
CLIENTS: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
COUNT_LOCK = threading.Lock()
OPEN: dict[str, int] = {}
SERIAL = [0]
LOG_LOCK = threading.Lock()


def log(client: str, status: int, up: int, down: int, *, out: bool = True) -> None:
    """One line of the access log (the fields of Squid's, see the module): a request that
    went out, or (`out` False) one refused here."""
    with LOG_LOCK:
        when = f"{time.time():.3f}"
        result, hier = ("TCP_MISS", "HIER_DIRECT") if out else ("TCP_DENIED", "HIER_NONE")
        line = f"ORCF {SERIAL[0]} {when} {client} {result}/{status:03d} {hier} {up} {down}\n"
        SERIAL[0] += 1
        with contextlib.suppress(OSError):
            os.write(1, line.encode())


def wait(sock: socket.socket | int, flag: int, within: float) -> None:
    poller = select.poll()
    poller.register(sock, flag | select.POLLERR | select.POLLHUP)
    if not poller.poll(within * 1000):
        raise TimedOut()


WRITTEN: weakref.WeakKeyDictionary[socket.socket, int] = weakref.WeakKeyDictionary()
"""Bytes written to each socket so far (by send or splice), for the usage lines."""
WRITTEN_LOCK = threading.Lock()


def wrote(sock: socket.socket, n: int) -> None:
    with WRITTEN_LOCK:
        WRITTEN[sock] = WRITTEN.get(sock, 0) + n


def send(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            wait(sock, select.POLLOUT, IDLE)
            continue
        except OSError:
            raise Closed() from None
        wrote(sock, n)
        view = view[n:]


def splice(src: socket.socket, dst: socket.socket, count: int | None) -> int:
    """Move `count` bytes (None: until src ends) from src to dst through a pipe, by
    splice(2); how many moved. Closed when src ends short of `count`, or either side fails
    or idles past IDLE. The pipe (1 MiB: a smaller one moves a 10 MiB body 1.5 times
    slower) lives only while the body moves: the kernel counts a user's pipes together (one
    past its share gets pipes of one page), so no idle connection holds one. Each gateway's
    front runs as a user of its own (templates/gateway/start), so they count apart."""
    try:
        r, w = os.pipe2(os.O_CLOEXEC)
    except OSError:
        raise Closed() from None
    with contextlib.suppress(OSError):  # (else the size it has)
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, CHUNK)
    # blocking calls (bounded by each socket's SO_RCVTIMEO and SO_SNDTIMEO: IDLE) move the
    # most for the fewest calls; a side made non-blocking meanwhile (by the other
    # direction's end) is waited for instead. The pipe is always emptied before the next
    # read, so no call waits on it.
    src.setblocking(True)
    dst.setblocking(True)
    try:
        return _spliced(src, dst, count, r, w)
    finally:
        src.setblocking(False)
        dst.setblocking(False)
        os.close(r)
        os.close(w)


def _spliced(src: socket.socket, dst: socket.socket, count: int | None, r: int, w: int) -> int:
    flags = os.SPLICE_F_MOVE
    moved = 0
    while count is None or moved < count:
        want = CHUNK if count is None else min(CHUNK, count - moved)
        try:
            got = os.splice(src.fileno(), w, want, flags=flags)
        except BlockingIOError:
            wait(src, select.POLLIN, IDLE)
            continue
        except OSError:
            raise Closed() from None
        if got == 0:
            if count is None:
                return moved
            raise Closed()
        while got:
            try:
                out = os.splice(r, dst.fileno(), got, flags=flags)
            except BlockingIOError:
                wait(dst, select.POLLOUT, IDLE)
                continue
            except OSError:
                raise Closed() from None
            got -= out
            moved += out
            wrote(dst, out)
    return moved


class Head:
    """A request's or an answer's head: its first line and its headers, as sent."""

    def __init__(self, first: bytes, headers: list[tuple[bytes, bytes]], size: int) -> None:
        self.first, self.headers, self.size = first, headers, size

    def get(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]

    def tokens(self, name: bytes) -> set[bytes]:
        return {t.strip().lower() for v in self.get(name) for t in v.split(b",")}


def parse(raw: bytes, most: int = 0) -> Head | None:
    """A head (ending in CRLF CRLF), or None for anything not cleanly HTTP/1.x or with more
    than HEADERS headers (a head of thousands of tiny headers parses into twenty times its
    size: 256 such connections would take the gateway's memory)."""
    if raw.count(b"\n") > (most or HEADERS) + 2:
        return None
    lines = raw[:-4].split(b"\r\n")
    if any(b"\n" in line or b"\r" in line or b"\0" in line for line in lines):
        return None
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or not set(name) <= TOKEN:
            return None
        headers.append((name, value.strip(b" \t")))
    return Head(lines[0], headers, len(raw))


class Conn:
    """A client's connection, with what was read of it and not yet used."""

    def __init__(self, sock: socket.socket, address: tuple[str, int]) -> None:
        self.sock, self.address, self.buffer = sock, address, b""

    def head(self, within: float) -> tuple[bytes, bool]:
        """Read until a head is whole: (the head, True), or (all read, False) when it grew
        past HEAD_LIMIT first. Closed when the connection ends or `within` passes first."""
        return self.until(b"\r\n\r\n", HEAD_LIMIT, within)

    def line(self) -> tuple[bytes, bool]:
        """One line with its CRLF, of at most 4 KiB, as `head`."""
        return self.until(b"\r\n", 4096, IDLE)

    def until(self, end: bytes, limit: int, within: float) -> tuple[bytes, bool]:
        deadline = time.monotonic() + within
        looked = 0  # (what was looked through already: a head sent a byte at a time costs
        while True:  # each byte one look, not the whole head again)
            at = self.buffer.find(end, looked)
            looked = max(0, len(self.buffer) - len(end) + 1)
            if 0 <= at <= limit - len(end):
                got, self.buffer = self.buffer[: at + len(end)], self.buffer[at + len(end) :]
                return got, True
            if len(self.buffer) >= limit:
                got, self.buffer = self.buffer, b""
                return got, False
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimedOut()
            try:
                got = self.sock.recv(65536)
            except BlockingIOError:
                wait(self.sock, select.POLLIN, left)
                continue
            except OSError:
                raise Closed() from None
            if not got:
                raise Closed()
            self.buffer += got

    def forward(self, dst: socket.socket, count: int | None) -> int:
        """Move `count` bytes of this connection (None: all until it ends) to dst: first
        what was read already, then by splice."""
        take = self.buffer if count is None else self.buffer[:count]
        self.buffer = self.buffer[len(take) :]
        send(dst, take)
        rest = None if count is None else count - len(take)
        if rest == 0:
            return len(take)
        return len(take) + splice(self.sock, dst, rest)


def bounded(sock: socket.socket) -> None:
    """No blocking call on `sock` waits longer than IDLE (see `splice`)."""
    idle = struct.pack("ll", int(IDLE), 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, idle)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(address: str, port: int) -> socket.socket:
    sock = socket.socket(
        socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
    )
    try:
        bounded(sock)
        err = sock.connect_ex((address, port))
        if err not in (0, 115):  # EINPROGRESS
            raise OSError(err, os.strerror(err))
        wait(sock, select.POLLOUT, CONNECT_WITHIN)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        return sock
    except BaseException:
        sock.close()
        raise


def target(head: Head) -> tuple[bytes, bytes, int, bytes] | None:
    """(method, host, port, origin-form path) of a request this serves itself, or None."""
    parts = head.first.split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not set(parts[0]) <= TOKEN:
        return None
    method, uri = parts[0], parts[1]
    if method == b"CONNECT" or uri[:7].lower() != b"http://":
        return None
    rest = uri[7:]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:] or b"/"
    if path.startswith(b"?"):
        path = b"/" + path
    if b"@" in authority or b"#" in path or not path.isascii() or b" " in path:
        return None
    host, colon, port_text = authority.partition(b":")
    host = host.lower()
    if not host or not set(host) <= NAME or host.endswith(b".") or host.startswith(b"."):
        return None
    try:  # an address, in any form the C library reads (10.5, 0x7f.1): Squid's rules judge it
        socket.inet_aton(host.decode())
        return None
    except OSError:
        pass
    if colon:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    else:
        port = 80
    return method, host, port, path


RESOLVED: dict[bytes, tuple[float, list[str] | None]] = {}
RESOLVED_LOCK = threading.Lock()


def addresses(host: bytes) -> list[str] | None:
    """The IPv4 addresses of `host`, or None when any of them must never be reached (or it
    has none); kept RESOLVED_FOR seconds, at most RESOLVED_MOST names."""
    now = time.monotonic()
    with RESOLVED_LOCK:
        kept = RESOLVED.get(host)
    if kept is not None and now - kept[0] < RESOLVED_FOR:
        return kept[1]
    try:
        # the name as written, never one of the resolver's search domains added to it
        found = socket.getaddrinfo(host.decode() + ".", None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        found = []
    listed: list[str] = []
    for *_, sockaddr in found:
        text = str(sockaddr[0])
        if any(ipaddress.ip_address(text) in net for net in FORBIDDEN):
            listed = []
            break
        if text not in listed:
            listed.append(text)
    out = listed or None
    with RESOLVED_LOCK:
        if len(RESOLVED) >= RESOLVED_MOST:
            RESOLVED.clear()
        RESOLVED[host] = (now, out)
    return out


def request_head(method: bytes, host: bytes, port: int, path: bytes, head: Head) -> bytes:
    drop = HOP | head.tokens(b"connection")
    lines = [method + b" " + path + b" HTTP/1.1"]
    lines.append(b"Host: " + host + (b":%d" % port if port != 80 else b""))
    for name, value in head.headers:
        if name.lower() not in drop and name.lower() != b"host":
            lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def length(head: Head) -> int | None:
    """The one Content-Length a head gives (0 without one); None for a bad or doubtful one."""
    values = head.get(b"content-length")
    if not values:
        return 0
    if len(set(values)) != 1 or not values[0].isdigit() or len(values[0]) > 18:
        return None
    return int(values[0])


class Upstream:
    def __init__(self, sock: socket.socket, host: bytes, port: int, address: str) -> None:
        self.sock, self.host, self.port, self.address, self.buffer = sock, host, port, address, b""

    def idle(self) -> bool:
        """Whether this kept connection is quiet and open: a server that sent anything
        unasked, or closed it meanwhile, is not asked again on it."""
        if self.buffer:
            return False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)


class Handover(Exception):
    """Squid is to answer this request (nothing of it was answered here)."""


class Plan:
    """A request this serves itself, as it goes on to its server: what is kept of its head
    (its parsed headers are not: a connection holds no more than it must while it waits)."""

    def __init__(
        self, method: bytes, host: bytes, port: int, head: bytes, body: int, closing: bool
    ) -> None:
        self.method, self.host, self.port, self.head = method, host, port, head
        self.body, self.closing = body, closing


def plan(raw: bytes, whole: bool) -> Plan | None:
    """What to send for the request head `raw`; None when it is Squid's to answer."""
    request = parse(raw) if whole else None
    aim = target(request) if request else None
    body = length(request) if request else None
    if (
        request is None
        or aim is None
        or body is None
        or request.tokens(b"connection") & FRAMING
        or any(request.get(n) for n in REFUSED)
        or not RULESET.allows(aim[1], aim[2])
    ):
        return None
    method, host, port, path = aim
    closing = b"close" in request.tokens(b"connection")
    return Plan(method, host, port, request_head(method, host, port, path, request), body, closing)


def serve(client: Conn) -> None:
    """Serve the client's requests while they are ones this serves; then hand the rest of
    the connection to Squid. One line per request served (see `note`)."""
    up: Upstream | None = None
    counted = (0, 0)
    try:
        while True:
            raw, whole = client.head(KEEP_IDLE)
            if raw.count(b"\n") > HEADERS + 2:  # (neither parsed here nor by Squid)
                send(client.sock, MANY_ANSWER)
                log(client.address[0], 431, len(raw), len(MANY_ANSWER), out=False)
                return
            try:
                planned = plan(raw, whole)
                if planned is None:
                    raise Handover()
                status, up, keep = exchange(client, planned, up)
            except Handover:
                if up is not None:  # (a kept one: Squid makes its own)
                    up.sock.close()
                    up = None
                client.buffer, raw = raw + client.buffer, b""
                hand_over(client)
                return
            except Closed:
                up = None
                counted = note(client, 0, counted)
                return
            counted = note(client, status, counted)
            if not keep:
                return
    except Closed:
        return
    finally:
        if up is not None:
            up.sock.close()


def exchange(client: Conn, planned: Plan, up: Upstream | None) -> tuple[int, Upstream | None, bool]:
    """One request sent to its server, and its answer to the client: (its status, the
    server's connection if it may serve the next one, whether the client's stays open).
    Handover when it is Squid's to answer; Closed when either side ends or fails (every
    server connection it holds is closed then)."""
    host, port, body = planned.host, planned.port, planned.body
    if up is not None and ((up.host, up.port) != (host, port) or not up.idle()):
        up.sock.close()
        up = None
    twice = up is not None and body == 0 and planned.method in AGAIN  # (a kept one: maybe closed)
    if up is not None and not twice:  # one that may not be sent twice goes on a new one
        up.sock.close()
        up = None
    for again in (twice, False):
        if up is None:
            found = addresses(host)
            up = open_upstream(host, port, found) if found is not None else None
            if up is None:  # Squid's to answer (a refusal, or its own error page)
                raise Handover()
        current = up
        try:
            try:
                send(current.sock, planned.head)
            except TimedOut:  # (it takes nothing: no answer to wait for, nor to ask again)
                raise BadAnswer() from None
            except Closed:  # (the server closed it: as if it never answered)
                raise NoAnswer() from None
            client.forward(current.sock, body)
            status, keep_up = answer(current, client, planned.method)
        except NoAnswer:
            current.sock.close()
            up = None
            if again:
                continue
            send(client.sock, BAD_ANSWER)
            return 502, None, False
        except BadAnswer:
            current.sock.close()
            send(client.sock, BAD_ANSWER)
            return 502, None, False
        except BaseException:
            current.sock.close()
            raise
        if not keep_up:
            current.sock.close()
        kept = current if keep_up else None
        return status, kept, keep_up is not None and not planned.closing
    raise AssertionError("unreachable")  # (the second try never continues)


def traffic(sock: socket.socket) -> tuple[int, int]:
    """Bytes the client sent on this connection (the kernel's count, TCP_INFO's
    bytes_received: whatever arrived, a request cut short included), and bytes written to
    it (WRITTEN: by send and by splice)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        (received,) = struct.unpack_from("Q", info, 128)
    except (OSError, struct.error):
        received = 0
    with WRITTEN_LOCK:
        written = WRITTEN.get(sock, 0)
    return int(received), written


def note(client: Conn, status: int, counted: tuple[int, int]) -> tuple[int, int]:
    """Log one request (status 0: cut short) with the client's bytes since the last line;
    the count so far."""
    now = traffic(client.sock)
    log(client.address[0], status, max(now[0] - counted[0], 0), max(now[1] - counted[1], 0))
    return now


def open_upstream(host: bytes, port: int, found: list[str]) -> Upstream | None:
    for address in found:
        try:
            return Upstream(connect(address, port), host, port, address)
        except (OSError, Closed):
            continue
    return None


def answer(up: Upstream, client: Conn, method: bytes) -> tuple[int, bool | None]:
    """Pass the server's answer to the client: (its status, whether the server's connection
    may serve another request; None when the client's must close too)."""
    server = Conn(up.sock, ("", 0))
    server.buffer, up.buffer = up.buffer, b""
    interim = False  # an interim answer (1xx) went to the client already
    while True:
        try:
            raw, whole = server.head(IDLE)
        except TimedOut:
            if interim:
                raise
            raise BadAnswer() from None
        except Closed:
            if interim:
                raise
            raise (BadAnswer() if server.buffer else NoAnswer()) from None
        head = parse(raw, ANSWER_HEADERS) if whole else None
        first = head.first.split(b" ", 2) if head else []
        if (
            head is None
            or len(first) < 2
            or first[0] not in (b"HTTP/1.1", b"HTTP/1.0")
            or not (first[1].isdigit() and len(first[1]) == 3)
        ):
            if interim:  # (the client sees its connection end)
                raise Closed()
            raise BadAnswer()
        status = int(first[1])
        if 100 <= status < 200 and status != 101:
            send(client.sock, raw)
            interim = True
            continue
        break
    bodiless = method == b"HEAD" or status in (204, 304) or 100 <= status < 200
    chunked = False
    count: int | None = 0
    if not bodiless:
        codings = b",".join(head.get(b"transfer-encoding"))
        if codings:  # chunked last, in HTTP/1.1, or an answer clients read in different ways
            chunked = codings.split(b",")[-1].strip().lower() == b"chunked"
            if not chunked or first[0] != b"HTTP/1.1":
                raise BadAnswer()
            count = None
        elif head.get(b"content-length"):
            count = length(head)
            if count is None:  # several lengths, or a bad one: the same
                raise BadAnswer()
        else:
            count = None
    closes = count is None and not chunked  # framed by the server's close alone
    keep = (
        not closes
        and status != 101
        and first[0] == b"HTTP/1.1"
        and b"close" not in head.tokens(b"connection")
    )
    lines = [head.first]
    drop = {b"connection", b"keep-alive", b"proxy-connection"} | head.tokens(b"connection")
    drop -= FRAMING  # (as framed here, so passed on)
    if chunked:  # (framed by it alone: a length beside it is a lie; no trailer is passed)
        drop |= {b"content-length", b"trailer"}
    lines += [n + b": " + v for n, v in head.headers if n.lower() not in drop]
    if closes or status == 101:
        lines.append(b"Connection: close")
    send(client.sock, b"\r\n".join(lines) + b"\r\n\r\n")
    if status == 101:
        both_ways(client, server)
        return status, None
    if chunked:
        chunks(server, client.sock)
    elif count is None:
        server.forward(client.sock, None)
        return status, None
    elif count:
        server.forward(client.sock, count)
    up.buffer = server.buffer
    return status, keep


def chunks(server: Conn, dst: socket.socket) -> None:
    """Pass a chunked body on as it comes: each chunk's size line written anew (no
    extension, nothing a lenient client could read otherwise), its data's CRLF checked, and
    no trailer (a proxy may drop them; each would be one more head to check)."""
    while True:
        line, whole = server.line()
        size_text = line[:-2].split(b";", 1)[0].strip(b" \t")
        if (
            not whole
            or not size_text
            or len(size_text) > 16
            or not all(c in b"0123456789abcdefABCDEF" for c in size_text)
            or any(c in line[:-2] for c in b"\r\n\0")
        ):
            raise Closed()
        size = int(size_text, 16)
        send(dst, b"%x\r\n" % size)
        if size == 0:
            seen = 0
            while True:  # trailers, read up to the empty line, not passed on
                trailer, whole = server.line()
                seen += len(trailer)
                if not whole or seen > HEAD_LIMIT:
                    raise Closed()
                if trailer == b"\r\n":
                    break
            send(dst, b"\r\n")
            return
        server.forward(dst, size)
        end_line, whole = server.line()
        if end_line != b"\r\n":  # a chunk's data ends with CRLF, or this is no chunked body
            raise Closed()
        send(dst, end_line)


def one_way(src: Conn, dst: socket.socket) -> None:
    """Pass what src sends on to dst until src ends (or fails); then dst hears the end."""
    try:
        with contextlib.suppress(Closed):
            src.forward(dst, None)
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def both_ways(a: Conn, b: Conn) -> None:
    """Pass everything each side sends to the other until both end."""
    done = threading.Event()

    def a_to_b() -> None:
        try:
            one_way(a, b.sock)
        finally:
            done.set()

    try:
        threading.Thread(target=a_to_b, daemon=True).start()
    except RuntimeError:
        raise Closed() from None
    try:
        one_way(b, a.sock)
    finally:
        # b is done: a heard so; what a still sends b gets for a few seconds, then both
        # end (never a thread held the whole idle time by a side that does not close)
        if not done.wait(LINGER):
            for sock in (a.sock, b.sock):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            done.wait(IDLE)
        b.sock.close()


def hand_over(client: Conn) -> None:
    """Give the rest of the connection (what was read of it first) to Squid, with a
    PROXY-protocol line that names the client."""
    try:
        squid = connect(*SQUID)
    except OSError:
        raise Closed() from None
    mine = client.sock.getsockname()
    ip, port = client.address[0], client.address[1]
    line = f"PROXY TCP4 {ip} {mine[0]} {port} {mine[1]}\r\n".encode()
    send(squid, line)
    both_ways(client, Conn(squid, SQUID))


BUSY = (
    "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    "Content-Length: {n}\r\n\r\n{text}"
)
BUSY_TEXT = (
    "orchestrator egress gateway: this client has too many connections open to the plain-HTTP "
    f"proxy (at most {PER_CLIENT} per client, {TOTAL} in all); close some and try again\n"
)
BUSY_ANSWER = BUSY.format(n=len(BUSY_TEXT), text=BUSY_TEXT).encode()
WARNED = [0.0]


def admit(sock: socket.socket, ip: str) -> bool:
    """Whether a new connection from `ip` may be served (counted then); a client beyond the
    bounds gets a 503 that says so, and the gateway's log a line at most once a second."""
    if not any(ipaddress.ip_address(ip) in net for net in CLIENTS):
        return False
    with COUNT_LOCK:
        if OPEN.get(ip, 0) < PER_CLIENT and sum(OPEN.values()) < TOTAL:
            OPEN[ip] = OPEN.get(ip, 0) + 1
            return True
        warn = time.monotonic() - WARNED[0] > 1
        if warn:
            WARNED[0] = time.monotonic()
    with contextlib.suppress(OSError):
        sock.send(BUSY_ANSWER)  # (non-blocking: what the socket's buffer takes)
    if warn:
        print(
            f"WARNING: the plain-HTTP front refused connections from {ip}: too many open",
            file=sys.stderr,
            flush=True,
        )
    return False


def accepted(sock: socket.socket, address: tuple[str, int]) -> None:
    try:
        bounded(sock)
        serve(Conn(sock, address))
    except Exception as exc:  # one connection's fault ends it alone
        print(f"WARNING: the plain-HTTP front: {type(exc).__name__}", file=sys.stderr, flush=True)
    finally:
        sock.close()
        done(address[0])


def done(ip: str) -> None:
    with COUNT_LOCK:
        OPEN[ip] -= 1
        if not OPEN[ip]:
            del OPEN[ip]


def listen(address: str) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, PORT))
    server.listen(1024)
    while True:
        try:
            sock, peer = server.accept()
        except OSError:
            time.sleep(0.01)
            continue
        sock.setblocking(False)
        if not admit(sock, peer[0]):
            sock.close()
            continue
        try:
            threading.Thread(target=accepted, args=(sock, peer), daemon=True).start()
        except RuntimeError:  # no thread to be had: as if over the bound
            sock.close()
            done(peer[0])


def main() -> None:
    """front.py CLIENT-NET... -- ADDRESS...: serve clients of those networks (and the
    gateway's loopback) on those addresses (and 127.0.0.1)."""
    args = sys.argv[1:]
    split = args.index("--") if "--" in args else len(args)
    CLIENTS.extend(ipaddress.ip_network(a, strict=False) for a in ["127.0.0.1/32", *args[:split]])
    FORBIDDEN.extend(_forbidden_nets())
    threading.stack_size(256 * 1024)
    for address in args[split + 1 :]:
        threading.Thread(target=listen, args=(address,), daemon=True).start()
    listen("127.0.0.1")


if __name__ == "__main__":
    main()
