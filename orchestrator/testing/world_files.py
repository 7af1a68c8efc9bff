"""The files a test world's containers read (`orchestrator.testing.world`): its three
programs (the served names' server, the logging resolver, the readiness probe), written as
Python 3 scripts for the world's image, and a self-signed certificate per served name
(each a host name)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

Left = Callable[[], float]
"""Seconds left before start_world's deadline (raises RuntimeError once there are none)."""

HOST_NAME = re.compile(
    r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
"""A host name: what a served name must be."""

SERVER = r'''
"""One served name of the test world: HTTP on 80, HTTPS on 443, a plain TCP echo on 7000."""
import gzip
import json
import socket
import socketserver
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME, ADDRESS = sys.argv[1], sys.argv[2]
LOG_LOCK = threading.Lock()
LIMIT = 64 * 1024 * 1024
CHUNK = memoryview(bytes(range(256)) * 256)  # 64 KiB, streamed over and over


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once, not 40 ms apart
    timeout = 120  # an idle keep-alive connection ends

    def do_GET(self):
        self.serve(True)

    def do_POST(self):
        self.serve(True)

    def do_HEAD(self):
        self.serve(False)

    def serve(self, with_body):
        path = self.path.split("?", 1)[0]
        if path == "/echo":  # what it got, logged (World.requests) and shown back
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(size, 1 << 20)).decode("latin-1")
            left = size - min(size, 1 << 20)
            while left > 0:  # the rest of a large body read and dropped: the answer comes after
                got = self.rfile.read(min(left, 1 << 20))
                if not got:
                    break
                left -= len(got)
            seen = {"method": self.command, "path": self.path, "body": body,
                    "headers": [[k, v] for k, v in self.headers.items()],
                    "tls": isinstance(self.connection, ssl.SSLSocket)}
            line = json.dumps(seen)
            with LOG_LOCK, open("/tmp/requests.log", "a") as log:
                log.write(line + "\n")
            self.small(200, line.encode(), with_body)
            return
        if path.startswith("/reflect/"):  # a hostile server: the request's key comes back
            self.reflect(path[len("/reflect/"):], self.headers.get("Authorization", ""))
            return
        if path == "/":
            self.small(200, ("hello from %s\n" % NAME).encode(), with_body)
            return
        digits = path[len("/bytes/"):]
        if path.startswith("/bytes/") and digits.isascii() and digits.isdigit():
            left = int(digits)
            if left <= LIMIT:
                self.head(200, left, "application/octet-stream")
                while with_body and left > 0:
                    piece = CHUNK[: min(left, len(CHUNK))]
                    self.wfile.write(piece)
                    left -= len(piece)
                return
        self.small(404, b"not found\n", with_body)

    def reflect(self, how, key):
        """Send `key` back as a hostile server would (the egress tests' secrets relay)."""
        raw = key.encode("latin-1")
        out = self.wfile
        if how == "header":
            self.send_response(200)
            self.send_header("X-Echo", key)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            out.write(raw)
        elif how == "cut":  # a header, then the connection ends before the headers do
            out.write(b"HTTP/1.1 200 OK\r\nX-Echo: " + raw + b"\r\n")
            self.close_connection = True
        elif how == "reason":
            out.write(b"HTTP/1.1 200 Hi " + raw + b"\r\nContent-Length: 0\r\n\r\n")
        elif how == "gzip":
            body = gzip.compress(raw)
            out.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n")
            out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        elif how == "te-gzip":  # a compressed transfer coding, no Content-Encoding
            body = gzip.compress(raw)
            out.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            out.write(b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        elif how == "split":  # chunked, one byte a chunk
            out.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for byte in raw:
                out.write(b"1\r\n" + bytes([byte]) + b"\r\n")
                out.flush()
            out.write(b"0\r\n\r\n")
        else:
            self.small(404, b"not found\n", True)

    def small(self, code, body, with_body):
        self.head(code, len(body), "text/plain")
        if with_body:
            self.wfile.write(body)

    def head(self, code, length, kind):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(length))
        self.end_headers()


class Server(ThreadingHTTPServer):
    """Named NAME without asking a resolver: HTTPServer's own bind looks its address's name
    up (a reverse query that leaves the world, and took 10 s per server)."""

    daemon_threads = True

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = NAME, self.server_address[1]


class TLSServer(Server):
    """The handshake runs in the connection's own thread: a silent client blocks no other."""

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain("/world/certs/%s.pem" % NAME, "/world/certs/%s.key" % NAME)

    def finish_request(self, request, client_address):
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError:
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()


def echo(conn):
    with conn:
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)
        except OSError:
            return


def echo_server():
    listener = socket.create_server((ADDRESS, 7000), backlog=128, reuse_port=False)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


plain = Server((ADDRESS, 80), Handler)
tls = TLSServer((ADDRESS, 443), Handler)
threading.Thread(target=plain.serve_forever, daemon=True).start()
threading.Thread(target=tls.serve_forever, daemon=True).start()
echo_server()
'''
"""The served names' server: `python3 server.py NAME ADDRESS` (certificates under
/world/certs), listening on ADDRESS only: the servers share the hub's network namespace."""

RESOLVER = r'''
"""The test world's resolver: A records for the served names, NXDOMAIN for every other name;
every query name is appended to a log, lower-case, without the trailing dot."""
import socket
import struct
import sys

LOG = open(sys.argv[1], "a", buffering=1)
HOSTS = {}
for pair in sys.argv[2:]:
    name, _, ip = pair.partition("=")
    HOSTS[name.lower()] = socket.inet_aton(ip)
A, ANY, IN = 1, 255, 1
FORMERR, NXDOMAIN, NOTIMP = 1, 3, 4


def text(label):
    """A label in presentation form: lower-case, odd bytes as \\DDD."""
    out = []
    for byte in label.lower():
        char = chr(byte)
        out.append("\\%03d" % byte if byte <= 32 or byte >= 127 or char in ".\\" else char)
    return "".join(out)


def question(msg):
    """(name, qtype, qclass, end) of the question at offset 12; ValueError if malformed."""
    labels, pos = [], 12
    while True:
        if pos >= len(msg):
            raise ValueError("truncated name")
        size = msg[pos]
        pos += 1
        if size == 0:
            break
        if size > 63:  # a pointer or a reserved label type: no compression in questions
            raise ValueError("bad label")
        if pos + size > len(msg):
            raise ValueError("truncated label")
        labels.append(text(msg[pos : pos + size]))
        pos += size
    if pos + 4 > len(msg):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack("!HH", msg[pos : pos + 4])
    return ".".join(labels), qtype, qclass, pos + 4


def reply(msg):
    if len(msg) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", msg[:6])
    if flags & 0x8000:  # a response: not ours to answer
        return None
    opcode = (flags >> 11) & 0xF
    # QR, the opcode, RD echoed, RA; AA (authoritative) for the names we serve
    base = 0x8000 | (opcode << 11) | (flags & 0x0100) | 0x0080
    if opcode != 0:
        return struct.pack("!6H", ident, base | NOTIMP, 0, 0, 0, 0)
    if qdcount != 1:
        return struct.pack("!6H", ident, base | FORMERR, 0, 0, 0, 0)
    try:
        name, qtype, qclass, end = question(msg)
    except ValueError:
        return struct.pack("!6H", ident, base | FORMERR, 0, 0, 0, 0)
    LOG.write(name + "\n")
    echoed = msg[12:end]
    addr = HOSTS.get(name)
    if addr is None:
        return struct.pack("!6H", ident, base | 0x0400 | NXDOMAIN, 1, 0, 0, 0) + echoed
    if qtype not in (A, ANY) or qclass not in (IN, ANY):  # the name is there, no such record
        return struct.pack("!6H", ident, base | 0x0400, 1, 0, 0, 0) + echoed
    record = struct.pack("!HHHIH", 0xC00C, A, IN, 5, 4) + addr
    return struct.pack("!6H", ident, base | 0x0400, 1, 1, 0, 0) + echoed + record


sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("", 53))
while True:
    data, peer = sock.recvfrom(4096)
    try:
        out = reply(data)
    except Exception as exc:  # one odd packet must not end the resolver
        print("resolver: %r" % exc, file=sys.stderr, flush=True)
        continue
    if out is not None:
        sock.sendto(out, peer)
'''
"""The resolver: `python3 resolver.py LOG NAME=IP...`."""

PROBE = r'''
"""Exit 0 when every server of the world answers as it should; else say what did not."""
import http.client
import json
import socket
import ssl
import struct
import sys

spec = json.loads(sys.argv[1])
problems = []
loose = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
loose.check_hostname = False
loose.verify_mode = ssl.CERT_NONE
for name, ip in spec["hosts"].items():
    want = ("hello from %s\n" % name).encode()
    for conn in (
        http.client.HTTPConnection(ip, 80, timeout=3),
        http.client.HTTPSConnection(ip, 443, timeout=3, context=loose),
    ):
        try:
            conn.request("GET", "/")
            answer = conn.getresponse()
            body = answer.read()
            if answer.status != 200 or body != want:
                problems.append("%s %s:%d: %d %r" % (name, ip, conn.port, answer.status, body))
        except Exception as exc:
            problems.append("%s %s:%d: %r" % (name, ip, conn.port, exc))
        finally:
            conn.close()
    try:
        with socket.create_connection((ip, 7000), timeout=3) as echo:
            echo.sendall(b"ping\n")
            got = b""
            while len(got) < 5:
                part = echo.recv(5 - len(got))
                if not part:
                    break
                got += part
            if got != b"ping\n":
                problems.append("%s %s:7000 echoed %r" % (name, ip, got))
    except Exception as exc:
        problems.append("%s %s:7000: %r" % (name, ip, exc))
name, ip = next(iter(spec["hosts"].items()))
qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
query = struct.pack("!6H", 0x5EED, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(3)
        udp.sendto(query, (spec["resolver"], 53))
        got = udp.recv(512)
    if got[:2] != b"\x5e\xed" or got[-4:] != socket.inet_aton(ip):
        problems.append("resolver %s answered %r" % (spec["resolver"], got))
except Exception as exc:
    problems.append("resolver %s: %r" % (spec["resolver"], exc))
if problems:
    sys.exit("\n".join(problems))
'''
"""The readiness probe, run inside the resolver's container: `python3 probe.py SPEC-JSON`."""


def write_files(folder: Path, served: list[str], openssl: str, left: Left) -> None:
    """The scripts and, per served name, a self-signed certificate and its key, readable by
    the containers' user (the keys are of a test world: nothing to keep secret)."""
    certs = folder / "certs"
    certs.mkdir()
    for name, text in (("server.py", SERVER), ("resolver.py", RESOLVER), ("probe.py", PROBE)):
        (folder / name).write_text(text)
    for name in served:
        argv = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt"]
        argv += ["ec_paramgen_curve:prime256v1", "-nodes", "-days", "30", "-subj", f"/CN={name}"]
        argv += ["-addext", f"subjectAltName=DNS:{name}"]
        argv += ["-keyout", str(certs / f"{name}.key"), "-out", str(certs / f"{name}.pem")]
        try:
            made = subprocess.run(argv, capture_output=True, text=True, timeout=left(), check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"openssl did not make the certificate of {name} in time") from exc
        if made.returncode != 0:
            raise RuntimeError(f"openssl could not make a certificate for {name}: {made.stderr}")
    for path in [folder, certs, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def served_names(names: Sequence[str]) -> list[str]:
    """`names` as the world serves them (lower-case, no trailing dot): each a host name (its
    certificate's), none twice; TypeError or ValueError otherwise."""
    if isinstance(names, str):
        raise TypeError("names must be a sequence of names, not one string")
    served = [n.lower().rstrip(".") for n in names]
    if not served:
        raise ValueError("a test world serves at least one name")
    bad = [n for n in served if not HOST_NAME.match(n)]
    if bad:
        raise ValueError(f"not host names: {bad}")
    if len(set(served)) != len(served):
        raise ValueError(f"names served twice: {served}")
    return served
