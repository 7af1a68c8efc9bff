"""The egress gateway's plain-HTTP front (templates/gateway/front.py, issue 41 item 3), against
the real engine and the hermetic test world: HTTP_PROXY names it, it serves what the
allowlist lets through whole and in any framing, judges every request of a kept-alive
connection anew, hands everything else to Squid (which refuses as it always did, and counts),
answers a client that holds too many connections with a clear 503, and a narrowing of egress
cuts what it has open."""

from __future__ import annotations

import hashlib
import json
import shlex
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, spawn_runtime
from orchestrator.backends.docker.network import (
    FORWARDER,
    FRONT_PORT,
    FRONT_URL,
    GATEWAY,
    PROXY_PORT,
    PROXY_URL,
)
from orchestrator.testing.world import World
from tests.docker.conftest import leaving_by_world
from tests.docker.test_egress import DENIED_BODY, env_file, hello, probe

pytestmark = pytest.mark.docker

BIG = 5_000_000
PATTERN = bytes(range(256)) * 256
"""What the world's /bytes/N sends, over and over (orchestrator/testing/world_files.py)."""

SESSION = r'''
"""Run in a sandbox: python3 -c SESSION JSON: send each of `sends` on one connection to the
front (each after the answers to the one before were read whole), then read the answers
of the last until the connection ends; prints what came back, per answer."""
import json, socket, sys, time
a = json.loads(sys.argv[1])


def answers(sock, buffer, n, heads):
    """Read n answers (by their framing, as a client would); (answers, rest)."""
    out = []
    while len(out) < n:
        while b"\r\n\r\n" not in buffer:
            got = sock.recv(65536)
            if not got:
                out.append({"status": 0, "body": "", "closed": True})
                return out, b""
            buffer += got
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        body = b""
        if heads[len(out)] or status in (204, 304):
            pass
        elif fields.get("transfer-encoding", "").endswith("chunked"):
            while True:
                while b"\r\n" not in buffer:
                    buffer += sock.recv(65536)
                size_line, _, buffer = buffer.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                while len(buffer) < size + 2:
                    buffer += sock.recv(65536)
                body += buffer[:size]
                buffer = buffer[size + 2:]
                if size == 0:
                    break
        elif "content-length" in fields:
            want = int(fields["content-length"])
            while len(buffer) < want:
                got = sock.recv(1 << 20)
                if not got:
                    break
                buffer += got
            body, buffer = buffer[:want], buffer[want:]
        else:
            while True:
                got = sock.recv(1 << 20)
                if not got:
                    break
                buffer += got
            body, buffer = buffer, b""
        out.append({"status": status, "connection": fields.get("connection", ""),
                    "body": body.decode("latin-1") if len(body) < 100000 else "",
                    "size": len(body), "sha": __import__("hashlib").sha256(body).hexdigest()})
    return out, buffer


with socket.create_connection((a["host"], a["port"]), timeout=30) as s:
    rest, got = b"", []
    for send in a["sends"]:
        s.sendall(send["bytes"].encode("latin-1"))
        more, rest = answers(s, rest, len(send["heads"]), send["heads"])
        got += more
    print(json.dumps(got))
'''


def session(
    box: Any, *sends: tuple[str, list[bool]], port: int = FRONT_PORT
) -> list[dict[str, Any]]:
    """Each send: (bytes, one flag per answer it brings: True for the answer to a HEAD)."""
    spec = {"host": GATEWAY, "port": port, "sends": [{"bytes": b, "heads": h} for b, h in sends]}
    done = box.execute(["python3", "-c", SESSION, json.dumps(spec)], timeout=120)
    assert done.exit_code == 0, (done.stdout, done.stderr)
    got: list[dict[str, Any]] = json.loads(done.stdout)
    return got


def get(url: str, *more: str) -> str:
    host = url.split("/")[2]
    return "".join([f"GET {url} HTTP/1.1\r\nHost: {host}\r\n", *more, "\r\n"])


def front_lines(rt: Runtime) -> list[str]:
    gateway = f"{rt.info().id}-{GATEWAY}-1"
    logs = subprocess.run(["docker", "logs", gateway], capture_output=True, text=True, timeout=60)
    return [line for line in logs.stdout.splitlines() if line.startswith("ORCF ")]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The outside world; the module's environments leave by its network and resolver."""
    with leaving_by_world() as started:
        yield started


@pytest.fixture(scope="module")
def listed(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """An allowlist; a service `hog` behind the same gateway."""
    folder = tmp_path_factory.mktemp("front")
    body = "network: {egress: [allowed.test, 'denied.test:7000']}\nservices:\n"
    body += "  hog:\n    image: orchestrator-test/python:3.11\n    command: [sleep, '3600']\n"
    with spawn_runtime(env_file(folder, "front", body)) as rt:
        yield rt


def test_http_proxy_names_the_front_and_a_large_body_comes_whole(listed: Runtime) -> None:
    said = listed.execute("echo $http_proxy $HTTP_PROXY $https_proxy $HTTPS_PROXY", timeout=30)
    assert said.stdout.split() == [FRONT_URL, FRONT_URL, PROXY_URL, PROXY_URL], said
    before = listed.usage().egress
    served = len(front_lines(listed))
    fetch = (
        "import hashlib, urllib.request\n"
        f"body = urllib.request.urlopen('http://allowed.test/bytes/{BIG}', timeout=30).read()\n"
        "print(len(body), hashlib.sha256(body).hexdigest())\n"
    )
    done = listed.execute(["python3", "-c", fetch], timeout=120)
    want = (PATTERN * (BIG // len(PATTERN) + 1))[:BIG]
    assert done.stdout.split() == [str(BIG), hashlib.sha256(want).hexdigest()], done
    assert len(front_lines(listed)) == served + 1  # the front served it, not Squid
    after = listed.usage().egress
    assert before is not None and after is not None and after.complete, after
    assert after.allowed == before.allowed + 1, (before, after)
    assert after.bytes_received - before.bytes_received >= BIG, (before, after)


def test_each_request_of_a_connection_is_judged_anew(listed: Runtime) -> None:
    """Kept alive: an allowed host, then one the allowlist does not name (Squid refuses it,
    on the same connection), then an allowed one again (served by Squid from there on)."""
    first, denied, again = session(
        listed,
        (get("http://allowed.test/"), [False]),
        (get("http://denied.test/"), [False]),
        (get("http://allowed.test/", "Connection: close\r\n"), [False]),
    )
    assert (first["status"], first["body"]) == (200, hello("allowed.test")), first
    assert denied["status"] == 403 and DENIED_BODY in denied["body"], denied
    assert (again["status"], again["body"]) == (200, hello("allowed.test")), again
    # a port the entry does not name, pipelined behind an allowed request
    served, port, gone = session(
        listed,
        (
            get("http://allowed.test/")
            + get("http://denied.test:8080/")
            + get("http://allowed.test/", "Connection: close\r\n"),
            [False, False, False],
        ),
    )
    assert served["status"] == 200 and gone["status"] == 200, (served, gone)
    assert port["status"] == 403 and DENIED_BODY in port["body"], port
    # an allowed port whose server speaks no HTTP (the world's echo): a clear 502
    [echoed] = session(listed, (get("http://denied.test:7000/"), [False]))
    assert echoed["status"] == 502 and "no valid HTTP answer" in echoed["body"], echoed


def test_bodies_in_every_framing_pass_whole(world: World, listed: Runtime) -> None:
    payload = "x=" + "ab" * 40000
    post = (
        f"POST http://allowed.test/echo HTTP/1.1\r\nHost: allowed.test\r\n"
        f"Content-Length: {len(payload)}\r\nContent-Type: text/plain\r\n\r\n{payload}"
    )
    chunked = (
        "POST http://allowed.test/echo HTTP/1.1\r\nHost: allowed.test\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    )
    head = "HEAD http://allowed.test/bytes/100 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    split = get("http://allowed.test/reflect/split", "Authorization: key-123\r\n")
    echoed, headed, chunks, after, by_squid = session(
        listed,
        (post, [False]),
        (head, [True]),
        (split, [False]),
        (get(f"http://allowed.test/bytes/{BIG}"), [False]),
        (chunked, [False]),  # a chunked request: Squid's to frame
    )
    assert echoed["status"] == 200 and json.loads(echoed["body"])["body"] == payload, echoed
    assert headed["status"] == 200 and headed["size"] == 0, headed
    assert chunks["status"] == 200 and chunks["body"] == "key-123", chunks
    want = (PATTERN * (BIG // len(PATTERN) + 1))[:BIG]
    assert after["size"] == BIG and after["sha"] == hashlib.sha256(want).hexdigest(), after
    assert by_squid["status"] == 200 and json.loads(by_squid["body"])["body"] == "hello"
    # what the server got: the origin form, its own Host, nothing of the proxy's
    seen = [r for r in world.requests("allowed.test") if r["method"] == "POST"][-2:]
    assert seen[0]["path"] == "/echo", seen
    names = {k.lower() for k, _ in seen[0]["headers"]}
    assert not names & {"proxy-connection", "via", "x-forwarded-for"}, seen


@pytest.mark.parametrize(
    "host",
    ["0x7f.1", "2130706433", "127.1", "0177.0.0.1", "localhost", GATEWAY, "main", "hog"],
)
def test_a_name_that_is_an_address_or_leads_inside_is_refused(listed: Runtime, host: str) -> None:
    [answer] = session(listed, (get(f"http://{host}/", "Connection: close\r\n"), [False]))
    assert answer["status"] == 403 and DENIED_BODY in answer["body"], answer


def test_odd_requests_go_to_squid_and_are_refused_or_served_as_before(listed: Runtime) -> None:
    sends = [
        "GET http://allowed.test@denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        "GET http://denied.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        "CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n",
        "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        "GET http://[::1]/ HTTP/1.1\r\nHost: [::1]\r\n\r\n",
    ]
    for send in sends:
        [answer] = session(listed, (send, [False]))
        assert answer["status"] in (400, 403), (send, answer)
    # the URI's host is the one reached, whatever Host says
    [answer] = session(
        listed, (get("http://allowed.test/", "Host: denied.test\r\nConnection: close\r\n"), [False])
    )
    assert (answer["status"], answer["body"]) == (200, hello("allowed.test")), answer


def test_a_client_holding_too_many_connections_gets_a_clear_503(listed: Runtime) -> None:
    hold = r"""
import socket, sys, time
held = [socket.create_connection(("orchestrator-egress", 3080), timeout=10) for _ in range(270)]
time.sleep(1)
busy, served = 0, None
for s in held:
    s.settimeout(0.05)
    try:
        got = s.recv(4096)
    except TimeoutError:  # admitted: it waits for a request
        served = served or s
        continue
    busy += b" 503 " in got and b"too many connections" in got
print(busy)
served.settimeout(10)
served.sendall(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
print(b" 200 " in served.recv(4096))
"""
    done = listed.execute(["python3", "-c", hold], timeout=120)
    busy, served = done.stdout.split()
    # 256 at most held (fewer while the front still counts the test's earlier connections)
    assert 14 <= int(busy) <= 24 and served == "True", done
    # the same client, once it let go, and another client meanwhile are served
    [answer] = session(listed, (get("http://allowed.test/", "Connection: close\r\n"), [False]))
    assert answer["status"] == 200, answer
    [other] = session(
        listed.service("hog"), (get("http://allowed.test/", "Connection: close\r\n"), [False])
    )
    assert other["status"] == 200, other


@pytest.mark.parametrize("half", [False, True], ids=["open", "half-closed"])
def test_narrowing_cuts_a_download_the_front_has_open(
    world: World, tmp_path: Path, half: bool
) -> None:
    """A download under way through the front when its host is taken away ends there (the
    gateway is restarted), also when the client has closed its sending side (the front's
    socket is then in CLOSE_WAIT); a request after it is refused."""
    body = "network: {egress: [allowed.test]}\n"
    size = 64 * 1024 * 1024
    with spawn_runtime(env_file(tmp_path, "narrowed", body)) as rt:
        keep = r"""
import os, socket, sys, time
s = socket.create_connection(("orchestrator-egress", 3080), timeout=20)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
ask = b"GET http://allowed.test/bytes/%d HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
s.sendall(ask % int(sys.argv[1]))
if sys.argv[2] == "half":
    s.shutdown(socket.SHUT_WR)
got = len(s.recv(1 << 20))
print(got > 0, flush=True)
open("/tmp/ready", "w").close()
while not os.path.exists("/tmp/go"):
    time.sleep(0.05)
try:
    while True:
        part = s.recv(1 << 20)
        if not part:
            break
        got += len(part)
except OSError:
    pass
print(got)
"""
        held = rt.start(["python3", "-c", keep, str(size), "half" if half else "open"])
        rt.execute("while [ ! -e /tmp/ready ]; do sleep 0.05; done", timeout=60)
        rt.set_egress("none")
        rt.execute("touch /tmp/go", timeout=30)
        out = held.wait(timeout=120)
        first, count = [*out.stdout.split(), "", ""][:2]
        assert first == "True", out
        assert int(count) < size, out  # cut: the head and part of the body, never all
        [after] = probe(rt, {"op": "get", "url": "http://allowed.test/", "timeout": 5})
        assert after.get("status") == 403, after


@pytest.mark.parametrize("port", [FRONT_PORT, PROXY_PORT], ids=["front", "squid"])
def test_heads_of_many_tiny_headers_do_not_take_the_gateways_memory(
    listed: Runtime, port: int
) -> None:
    """(Found by a hostile review) 250 connections, each sending a 61 KB head of 9,400 tiny
    headers and reading nothing, got the gateway OOM-killed when each was parsed whole, by
    the front and (on its own port) by Squid: the front answers 431 now, Squid takes heads
    of 16 KB at most, and the gateway serves on."""
    flood = r"""
import socket, sys, time
head = b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n"
head += b"".join(b"%x:\r\n" % i for i in range(9400)) + b"\r\n"
held = []
for _ in range(250):
    s = socket.create_connection(("orchestrator-egress", int(sys.argv[1])), timeout=10)
    s.sendall(head)
    held.append(s)
time.sleep(5)
print(len(held))
"""
    done = listed.service("hog").execute(["python3", "-c", flood, str(port)], timeout=120)
    assert done.stdout.split() == ["250"], done
    gateway = f"{listed.info().id}-{GATEWAY}-1"
    state = subprocess.run(
        [
            "docker",
            "inspect",
            "-f",
            "{{.State.Running}} {{.State.OOMKilled}} {{.RestartCount}}",
            gateway,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert state.stdout.split() == ["true", "false", "0"], state  # (not killed, then restarted)
    [answer] = session(listed, (get("http://allowed.test/", "Connection: close\r\n"), [False]))
    assert answer["status"] == 200, answer


def test_a_gateway_whose_squid_dies_starts_it_again_with_the_rules_of_then(
    world: World, tmp_path: Path
) -> None:
    """Squid killed (as the memory limit's killer would): the gateway ended, and the sandbox
    had no way out for good. Squid starts again in the same container now (not by the
    engine's restart policy, which would also start a stopped gateway of ours once its
    daemon starts again), with the rules a change made last: a narrowing before the crash
    holds after it. What it had open then was never logged: the count says it is short."""
    body = "network: {egress: [allowed.test, denied.test]}\n"
    with spawn_runtime(env_file(tmp_path, "reborn", body)) as rt:
        assert rt.set_egress(["allowed.test"]) == "allowed.test"
        [first] = session(rt, (get("http://allowed.test/", "Connection: close\r\n"), [False]))
        assert first["status"] == 200, first
        gateway = f"{rt.info().id}-{GATEWAY}-1"
        started = _inspect(gateway, "{{.State.StartedAt}} {{.RestartCount}}")
        # (as Squid's own user: the gateway's root holds no CAP_KILL)
        _kill_in(gateway, "squid", user="13")
        for port in (PROXY_PORT, FRONT_PORT):
            up = rt.execute(["python3", "-c", UNTIL_UP, GATEWAY, str(port)], timeout=120)
            assert up.exit_code == 0, up
        assert _inspect(gateway, "{{.State.StartedAt}} {{.RestartCount}}") == started
        [allowed] = session(rt, (get("http://allowed.test/", "Connection: close\r\n"), [False]))
        assert allowed["status"] == 200 and allowed["body"] == hello("allowed.test"), allowed
        [denied] = session(rt, (get("http://denied.test/", "Connection: close\r\n"), [False]))
        assert denied["status"] == 403, denied
        counted = rt.usage().egress
        assert counted is not None and not counted.complete, counted


def test_a_forwarder_whose_relay_dies_starts_it_again_on_the_same_host_port(
    world: World, tmp_path: Path
) -> None:
    """A published port's socat killed: it starts again in its container, so the host port
    the environment reports still leads to the sandbox (a new container would be given
    another one by the engine)."""
    body = "network: {ports: [{container: 8000}]}\n"
    with spawn_runtime(env_file(tmp_path, "reported", body)) as rt:
        serve = "setsid python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null &"
        assert rt.execute(serve, timeout=20).exit_code == 0
        [port] = rt.info().ports
        _until_answered(port.host)
        forwarder = f"{rt.info().id}-{FORWARDER}-1"
        _kill_in(forwarder, "socat", user="0")
        _until_answered(port.host)
        assert list(rt.info().ports) == [port]


# every socat of the forwarder SIGKILLed as soon as it is seen, for 4 s: how many there were
KILL_EACH_RELAY = r"""
end=$((SECONDS + 4)); seen=" "
while [ $SECONDS -lt $end ]; do
  for p in /proc/[0-9]*; do
    [ "$(cat $p/comm 2>/dev/null)" = socat ] || continue
    case $seen in *" ${p#/proc/} "*) ;; *) seen="$seen${p#/proc/} " ;; esac
    kill -9 ${p#/proc/} 2>/dev/null
  done
  sleep 0.05
done
echo $seen | wc -w
"""


def test_a_relay_that_keeps_dying_is_started_again_once_a_second_at_most(
    world: World, tmp_path: Path
) -> None:
    """A relay that cannot run (killed as soon as it starts here) is started again after a
    second, not five times a second for good; and once it is let be, it serves again."""
    body = "network: {ports: [{container: 8000}]}\n"
    with spawn_runtime(env_file(tmp_path, "relentless", body)) as rt:
        serve = "setsid python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null &"
        assert rt.execute(serve, timeout=20).exit_code == 0
        [port] = rt.info().ports
        forwarder = f"{rt.info().id}-{FORWARDER}-1"
        done = subprocess.run(
            ["docker", "exec", "-u", "0", forwarder, "bash", "-c", KILL_EACH_RELAY],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done
        assert 2 <= int(done.stdout) <= 7, done.stdout  # (0.2 s apart: about 16)
        _until_answered(port.host)


UNTIL_UP = r"""
import socket, sys, time
deadline = time.monotonic() + 60
while True:
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2):
            break
    except OSError:
        assert time.monotonic() < deadline, "nothing came back on that port"
        time.sleep(0.2)
"""


def _inspect(container: str, fmt: str) -> str:
    done = subprocess.run(
        ["docker", "inspect", "-f", fmt, container], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done
    return done.stdout.strip()


def _kill_in(container: str, comm: str, *, user: str) -> None:
    """SIGKILL every process of `container` whose name is `comm`, as `user` there."""
    kill = f'for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = {comm} ] && kill -9 ${{p#/proc/}}; done'
    done = subprocess.run(
        ["docker", "exec", "-u", user, container, "bash", "-c", kill + "; true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done


def _until_answered(port: int) -> None:
    """Until GET / on the host's 127.0.0.1:`port` answers 200 (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                assert answer.status == 200
                return
        except OSError:
            assert time.monotonic() < deadline, f"127.0.0.1:{port} never answered"
            time.sleep(0.2)


def test_a_published_udp_port_answers_through_the_forwarder(world: World, tmp_path: Path) -> None:
    """A datagram to the reported host port reaches the sandbox's server, and its answer
    comes back (each datagram is a forwarder's child of its own, bounded in time)."""
    body = "network: {ports: [{container: 9000, protocol: udp}]}\n"
    echo = (
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.bind(('0.0.0.0', 9000))\n"
        "while True:\n  data, peer = s.recvfrom(2048); s.sendto(b'echo ' + data, peer)"
    )
    with spawn_runtime(env_file(tmp_path, "datagrams", body)) as rt:
        serve = f"setsid python3 -c {shlex.quote(echo)} >/dev/null 2>&1 </dev/null &"
        assert rt.execute(serve, timeout=20).exit_code == 0
        [port] = rt.info().ports
        assert port.protocol == "udp", port
        deadline = time.monotonic() + 60
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(1)
            while True:
                client.sendto(b"ping", ("127.0.0.1", port.host))
                try:
                    assert client.recvfrom(2048)[0] == b"echo ping"
                    break
                except TimeoutError:
                    assert time.monotonic() < deadline, "no answer through the forwarder"
