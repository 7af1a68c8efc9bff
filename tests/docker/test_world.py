"""The hermetic test world of the egress tests (`orchestrator.testing.world`): its servers
answer HTTP, HTTPS (a certificate that verifies for the name), echo and DNS as promised,
seen from a fresh container on its network; its resolver logs the queries; close() and a
start that fails halfway leave nothing behind."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.testing import world as world_module
from orchestrator.testing import world_files
from orchestrator.testing.world import LABEL, WORLD_LABEL, World, start_world
from tests.conftest import PYTHON_IMAGE

CLIENT = r"""
import hashlib, http.client, json, socket, ssl, struct, sys

spec = json.loads(sys.argv[1])
out = {"http": {}, "https": {}, "verified": {}, "bytes": {}, "echo": {}, "dns": {}}
loose = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
loose.check_hostname = False
loose.verify_mode = ssl.CERT_NONE


def get(conn, path):
    conn.request("GET", path)
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer.status, body


for name, ip in spec["hosts"].items():
    out["http"][name] = get(http.client.HTTPConnection(ip, 80, timeout=10), "/")[1].decode()
    tls = http.client.HTTPSConnection(ip, 443, timeout=10, context=loose)
    out["https"][name] = get(tls, "/")[1].decode()
    strict = ssl.create_default_context(cadata=spec["certs"][name])
    with socket.create_connection((ip, 443), timeout=10) as raw:
        with strict.wrap_socket(raw, server_hostname=name) as checked:
            out["verified"][name] = checked.getpeercert()["subject"][0][0][1]
    status, body = get(http.client.HTTPConnection(ip, 80, timeout=30), "/bytes/1048576")
    out["bytes"][name] = [status, len(body)]
    out["missing"] = get(http.client.HTTPConnection(ip, 80, timeout=10), "/nothing-here")[0]
    with socket.create_connection((ip, 7000), timeout=10) as echo:
        echo.sendall(b"hello echo\n")
        echo.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            part = echo.recv(4096)
            if not part:
                break
            got += part
    out["echo"][name] = got.decode()
for qname in spec["ask"]:
    wire = b"".join(bytes([len(p)]) + p.encode() for p in qname.split(".")) + b"\0"
    query = struct.pack("!6H", 0x4242, 0x0100, 1, 0, 0, 0) + wire + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(5)
        udp.sendto(query, (spec["resolver"], 53))
        got = udp.recv(512)
    ident, flags, qd, an, ns, ar = struct.unpack("!6H", got[:12])
    ips = []
    pos = 12 + len(wire) + 4
    for _ in range(an):
        rtype, rclass, ttl, size = struct.unpack("!HHIH", got[pos + 2 : pos + 12])
        ips.append([rtype, ttl, socket.inet_ntoa(got[pos + 12 : pos + 12 + size])])
        pos += 12 + size
    out["dns"][qname] = {
        "id": ident, "qr": flags >> 15, "ra": (flags >> 7) & 1, "rcode": flags & 0xF,
        "question": got[12 : 12 + len(wire) + 4] == query[12:], "answers": ips,
    }
print(json.dumps(out))
"""
"""Run in a fresh container on the world's network: what each server and the resolver said."""


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with start_world() as started:
        yield started


def in_world(world: World, script: str, *args: str, timeout: float = 120) -> str:
    """Stdout of `python3 -c script args` in a fresh container on the world's network
    (removed after, by id)."""
    create = ["docker", "create", "--label", LABEL, "--pull", "never", "--network"]
    create += [world.network, PYTHON_IMAGE, "python3", "-c", script, *args]
    ident = subprocess.run(create, capture_output=True, text=True, timeout=60, check=True)
    container = ident.stdout.strip()
    try:
        run = subprocess.run(
            ["docker", "start", "-a", container],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        return run.stdout
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def leftovers(token: str) -> list[str]:
    """Containers and networks still carrying the world's own label."""
    found = []
    for kind in (["ps", "-aq"], ["network", "ls", "-q"]):
        out = subprocess.run(
            ["docker", *kind, "--filter", f"label={WORLD_LABEL}={token}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        found += out.stdout.split()
    return found


def test_world_servers_and_resolver_answer_from_a_fresh_container(world: World) -> None:
    assert world.network.startswith("orch-world-")
    assert world.subnet
    assert len(set(world.hosts.values())) == len(world.hosts) == 3
    assert world.queries() == []  # the readiness probe's own queries are not counted
    spec = {
        "hosts": world.hosts,
        "certs": world.certs,
        "resolver": world.resolver_ip,
        "ask": ["allowed.test", "x.nosuch.test", "WWW.Allowed.Test"],
    }
    said = json.loads(in_world(world, CLIENT, json.dumps(spec)))
    for name in world.hosts:
        assert said["http"][name] == f"hello from {name}\n"
        assert said["https"][name] == f"hello from {name}\n"
        assert said["verified"][name] == name
        assert said["bytes"][name] == [200, 1048576]
        assert said["echo"][name] == "hello echo\n"
    assert said["missing"] == 404
    allowed = said["dns"]["allowed.test"]
    assert allowed == {
        "id": 0x4242,
        "qr": 1,
        "ra": 1,
        "rcode": 0,
        "question": True,
        "answers": [[1, 5, world.hosts["allowed.test"]]],
    }
    nosuch = said["dns"]["x.nosuch.test"]
    assert (nosuch["rcode"], nosuch["answers"], nosuch["question"]) == (3, [], True)
    www = said["dns"]["WWW.Allowed.Test"]
    assert www["answers"] == [[1, 5, world.hosts["www.allowed.test"]]]
    assert world.queries() == ["allowed.test", "x.nosuch.test", "www.allowed.test"]


def test_world_close_leaves_nothing() -> None:
    started = start_world(["only.test"])
    made = [*started.containers, started.network_id]
    assert leftovers(started.token)
    started.close()
    assert leftovers(started.token) == []
    for ident in made:
        gone = subprocess.run(["docker", "inspect", ident], capture_output=True, check=False)
        assert gone.returncode != 0, f"{ident} is still there"
    started.close()  # idempotent


def test_world_that_fails_halfway_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    token = secrets.token_hex(6)
    monkeypatch.setattr(world_module, "_new_token", lambda: token)
    monkeypatch.setattr(world_files, "SERVER", "raise SystemExit('broken on purpose')")
    with pytest.raises(RuntimeError, match="broken on purpose"):
        start_world(["only.test"], timeout=60)
    assert leftovers(token) == []


def test_a_network_the_engine_makes_after_its_call_timed_out_is_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loaded engine can outlive `docker network create`'s deadline and make the network
    later, after the failed start has looked for what to remove: close() looks again."""
    token = secrets.token_hex(6)
    monkeypatch.setattr(world_module, "_new_token", lambda: token)
    real = world_module._docker
    late: list[threading.Thread] = []

    def slow_engine(args: list[str], *, timeout: float) -> str:
        if args[:2] != ["network", "create"]:
            return real(args, timeout=timeout)

        def made_later() -> None:
            time.sleep(1.5)
            real(args, timeout=60)

        late.append(threading.Thread(target=made_later))
        late[0].start()
        raise world_module._Outlived("docker network create did not end within 0.1 s")

    monkeypatch.setattr(world_module, "_docker", slow_engine)
    with pytest.raises(RuntimeError, match="did not end"):
        start_world(["only.test"], timeout=60)
    late[0].join(60)
    assert leftovers(token) == []


def test_world_refuses_bad_names() -> None:
    with pytest.raises(ValueError, match="not host names"):
        start_world(["bad_name.test"])
    with pytest.raises(ValueError, match="twice"):
        start_world(["a.test", "A.test"])


NO_LOOKUP = r"""
import runpy, socket, sys

def refuse(*args):
    raise SystemExit("the server looked up a name: %r" % (args,))

socket.gethostbyaddr = socket.getfqdn = socket.getaddrinfo = refuse
sys.argv[1:] = ["allowed.test", "127.0.0.1"]
runpy.run_path("/world/server.py", run_name="__main__")
"""
"""The world's server with every name lookup refused (it ends saying so)."""


def test_a_world_server_starts_without_looking_up_a_name(tmp_path: Path) -> None:
    """Its HTTP server is named without asking a resolver: HTTPServer's own bind looks up
    its address (a reverse query that left the world through the engine's resolver, and
    took 10 s per server, 20 s per world start)."""
    world_files.write_files(tmp_path, ["allowed.test"], "openssl", lambda: 60.0)
    argv = ["docker", "run", "-d", "--label", LABEL, "--network", "none", "--pull", "never"]
    argv += ["-v", f"{tmp_path}:/world:ro", PYTHON_IMAGE, "python3", "-c", NO_LOOKUP]
    ident = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    try:
        probe = "import socket; socket.create_connection(('127.0.0.1', 7000), 1).close()"
        for _ in range(300):  # its last listener (the echo server) answers: it started
            said = subprocess.run(
                ["docker", "exec", ident, "python3", "-c", probe], capture_output=True, text=True
            )
            if said.returncode == 0:
                break
            running = world_module._docker(
                ["inspect", "-f", "{{.State.Running}}", ident], timeout=60
            )
            if running.strip() != "true":
                logs = subprocess.run(["docker", "logs", ident], capture_output=True, text=True)
                pytest.fail(f"the server ended: {logs.stdout}{logs.stderr}")
            time.sleep(0.1)
        else:
            pytest.fail(f"the server did not answer within 30 s: {said.stderr}")
    finally:
        subprocess.run(["docker", "rm", "-f", ident], capture_output=True, check=False)
