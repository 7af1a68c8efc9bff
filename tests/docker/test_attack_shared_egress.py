"""Attacks through a shared egress network (issue 37, items 5, 10 and 12 and the FTP
suspicion), against the real engine: two environments leave by one network the test made (a
hermetic test world, `orchestrator.testing.world`), and the attacker's services are named
like the victim's allowlisted host and like the victim's own service.

- No container of ours is known on the shared network by a name a file chooses (a service
  name), so a neighbour's service cannot answer for the victim's allowlisted host or for its
  own `db`; and the gateway never connects, for a name, to an address on a network it is on,
  whatever the engine's DNS answers.
- The gateway listens only where its own environment reaches it: another environment's
  connections to its address on the shared network are refused, and a flood of them does not
  hurt; one sandbox of its own cannot hold it all either.
- A name made of hex digits is no address, and no name an entry does not allow is looked up
  (a DNS channel out); only HTTP and CONNECT leave (FTP's data connection would reach other
  ports of an allowed host)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, UsageError, spawn_runtime
from orchestrator.backends.docker.network import (
    EGRESS_NETWORK_ENV,
    FRONT_PORT,
    GATEWAY,
    PROXY_PORT,
)
from orchestrator.testing.world import LABEL, World
from tests.conftest import PYTHON_IMAGE, labelled_ids
from tests.docker.conftest import leaving_by_world
from tests.docker.test_egress import (
    DENIED_BODY,
    env_file,
    get,
    hello,
    nosuch_name,
    ok,
    probe,
    refused,
    tunnel,
    via_proxy,
)

SERVE = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        with open("/tmp/seen", "a") as seen:
            auth = self.headers.get("Authorization")
            seen.write("%s %s auth=%s\n" % (self.command, self.path, auth))
        body = sys.argv[1].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer(("", 80), Handler).serve_forever()
"""
"""A service's server: answers every GET with argv[1], noting each request in /tmp/seen."""

HOLD = r"""
import json, os, resource, socket, sys, time
host, port, n, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, seen, stalls = [], {"connected": 0, "refused": 0, "other": 0}, 0
for _ in range(n):
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect((host, port))
        held.append(s)
        seen["connected"] += 1
    except ConnectionRefusedError:
        seen["refused"] += 1
        s.close()
    except OSError:
        seen["other"] += 1
        s.close()
        stalls += 1
        if stalls >= 10:  # the listener takes no more: holding what we have is the attack
            break
with open(status + ".tmp", "w") as out:
    json.dump(seen, out)
os.rename(status + ".tmp", status)
time.sleep(300)
"""
"""Run in a sandbox: open up to N connections to HOST:PORT and hold them (status: what
happened, written once all are open); ends after five minutes or when killed."""

FLOOD = 4500
"""Held connections in a flood: more than the gateway's 4096 open files."""
HOLD_STATUS = "/tmp/hold.json"
SECRET = "Bearer s3cret-of-the-victim"
CLOSE = "HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
"""The rest of a request line and its head, asking the proxy to close after answering."""


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The shared network (the world's), its resolver, and its servers beyond it."""
    with leaving_by_world() as started:
        yield started


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-egress")


def served(name: str, body: str, egress: str) -> str:
    """A service `name` answering every GET with `body`."""
    command = json.dumps(["python3", "-c", SERVE, body])
    return f"  {name}:\n    image: {PYTHON_IMAGE}\n    command: {command}\n    egress: {egress}\n"


@pytest.fixture(scope="module")
def thief(world: World, module_dir: Path) -> Iterator[Runtime]:
    """The attacker: everything `all`, so every container joins the shared network, and
    services named like the victim's allowlisted host and like the victim's own service."""
    body = "network: {egress: all}\nservices:\n"
    body += served("allowed.test", "stolen by the neighbour's allowed.test", "all")
    body += served("db", "stolen by the neighbour's db", "all")
    with spawn_runtime(env_file(module_dir, "thief", body)) as rt:
        yield rt


@pytest.fixture(scope="module")
def victim(world: World, thief: Runtime, module_dir: Path) -> Iterator[Runtime]:
    """The victim: main with an allowlist, its own `db` (none), `web` with `all` (on the
    shared network too) and `hog` (the allowlist). Its name sorts after the world's network
    (`orch-world-...`), so that the engine's DNS, which looks through a container's networks
    in the order of their names, would ask the shared network first."""
    body = "network: {egress: [allowed.test, '*.allowed.test']}\nservices:\n"
    body += served("db", "the victim's own db", "none")
    body += f"  web:\n    image: {PYTHON_IMAGE}\n    command: [sleep, '3600']\n    egress: all\n"
    body += f"  hog:\n    image: {PYTHON_IMAGE}\n    command: [sleep, '3600']\n"
    with spawn_runtime(env_file(module_dir, "zvictim", body)) as rt:
        yield rt


def inspect(rt: Runtime, service: str) -> dict[str, Any]:
    """The engine's view of a service's container."""
    [found] = json.loads(docker("inspect", f"{rt.info().id}-{service}-1"))
    assert isinstance(found, dict)
    return found


def networks_of(rt: Runtime, service: str) -> dict[str, dict[str, Any]]:
    """A service's container's networks, by network name."""
    found: dict[str, dict[str, Any]] = inspect(rt, service)["NetworkSettings"]["Networks"]
    return found


def docker(*args: str) -> str:
    """Stdout of a docker CLI call (stripped); fails the test when it fails."""
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.strip()


def seen_by(rt: Runtime, service: str) -> str:
    """What the service's server noted (one line per request it got)."""
    return rt.service(service).execute("cat /tmp/seen 2>/dev/null || true", timeout=30).stdout


def start_hold(box: Any, host: str, port: int, n: int) -> dict[str, int]:
    """Start HOLD in `box` in the background; what it made of its connections, once all
    are open (within a deadline)."""
    argv = f"python3 -c '{HOLD}' {host} {port} {n} {HOLD_STATUS}"
    line = f"setsid {argv} >/tmp/hold.log 2>&1 </dev/null & echo $! >/tmp/hold.pid"
    started = box.execute(line, timeout=30)
    assert started.exit_code == 0, started
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        read = box.execute(f"cat {HOLD_STATUS} 2>/dev/null", timeout=30)
        if read.exit_code == 0 and read.stdout.strip():
            got: dict[str, int] = json.loads(read.stdout)
            return got
        time.sleep(0.5)
    log = box.execute("cat /tmp/hold.log", timeout=30).stdout
    raise AssertionError(f"the flood did not finish opening its connections: {log}")


def stop_hold(box: Any) -> None:
    box.execute(f"kill $(cat /tmp/hold.pid); rm -f {HOLD_STATUS} /tmp/hold.pid", timeout=30)


# ----- item 5: names on the shared network ------------------------------------------------


def test_no_container_of_ours_has_a_chosen_name_on_the_shared_network(
    world: World, thief: Runtime, victim: Runtime
) -> None:
    """Every container of ours on the shared network is known there by its container name
    (its project's, unique on the engine) and its id alone."""
    checked = 0
    for rt, services in ((thief, ["main", "allowed.test", "db"]), (victim, ["web", GATEWAY])):
        for service in services:
            seen = inspect(rt, service)
            on_shared = seen["NetworkSettings"]["Networks"][world.network]
            own = {seen["Name"].lstrip("/"), seen["Id"][:12]}
            assert set(on_shared["Aliases"] or []) <= own, (service, on_shared["Aliases"])
            checked += 1
    assert checked == 5


def test_a_neighbours_service_named_like_an_allowed_host_gets_nothing(
    world: World, thief: Runtime, victim: Runtime
) -> None:
    send = "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n"
    send += f"Authorization: {SECRET}\r\nConnection: close\r\n\r\n"
    [answer] = probe(victim, via_proxy(send, body=True))
    assert answer["error"] is None and " 200 " in answer["status_line"], answer
    assert answer["body"] == hello("allowed.test"), answer
    assert seen_by(thief, "allowed.test") == ""


def test_a_neighbours_service_named_like_our_own_gets_nothing(
    world: World, thief: Runtime, victim: Runtime
) -> None:
    [own] = probe(victim.service("web"), get("http://db/", proxy=False))
    ok(own, "the victim's own db")
    assert seen_by(thief, "db") == ""


def test_the_gateway_never_takes_a_name_to_a_network_it_is_on(
    world: World, victim: Runtime
) -> None:
    """A container the caller's network holds (not ours: a name anyone on it may take)
    answers the engine's DNS for a name the allowlist allows: the gateway refuses it."""
    rogue = "rogue.allowed.test"
    run = ["run", "-d", "--label", LABEL, "--pull", "never", "--network", world.network]
    run += ["--network-alias", rogue, PYTHON_IMAGE, "python3", "-c", SERVE, "stolen by a rogue"]
    made = docker(*run)
    try:
        deadline = time.monotonic() + 60
        while docker("inspect", "--format", "{{.State.Running}}", made) != "true":
            assert time.monotonic() < deadline, "the rogue container did not start"
            time.sleep(0.2)
        answer, control = probe(victim, get(f"http://{rogue}/"), get("http://allowed.test/"))
        refused(answer)
        ok(control, hello("allowed.test"))
        assert docker("exec", made, "sh", "-c", "cat /tmp/seen 2>/dev/null || true") == ""
    finally:
        subprocess.run(["docker", "rm", "-f", made], capture_output=True, timeout=60, check=False)


def test_a_shared_network_the_engine_lacks_is_named_before_anything_is_made(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = f"orch-missing-{secrets.token_hex(6)}"
    monkeypatch.setenv(EGRESS_NETWORK_ENV, missing)
    before = labelled_ids()
    with pytest.raises(UsageError) as raised:
        spawn_runtime(env_file(tmp_path, "nonet", "network: {egress: all}\n"))
    assert EGRESS_NETWORK_ENV in str(raised.value) and missing in str(raised.value)
    assert labelled_ids() <= before


# ----- item 10: the gateway is its own environment's --------------------------------------


PORTS = pytest.mark.parametrize("port", [PROXY_PORT, FRONT_PORT], ids=["squid", "front"])
"""The gateway's two ports: Squid's (HTTPS_PROXY) and the plain-HTTP front's (HTTP_PROXY)."""


@PORTS
def test_another_environment_cannot_reach_or_exhaust_the_gateway(
    world: World, thief: Runtime, victim: Runtime, port: int
) -> None:
    address = networks_of(victim, GATEWAY)[world.network]["IPAddress"]
    assert address, networks_of(victim, GATEWAY)
    [first] = probe(thief, {"op": "connect", "host": address, "port": port, "timeout": 2})
    try:
        held = start_hold(thief, address, port, FLOOD)
        [answer] = probe(victim, get("http://allowed.test/", timeout=10))
    finally:
        stop_hold(thief)
    assert first["error"] is not None and "Refused" in first["error"], first
    assert held["connected"] == 0, held
    ok(answer, hello("allowed.test"))


@PORTS
def test_one_sandbox_cannot_exhaust_its_own_gateway(
    world: World, victim: Runtime, port: int
) -> None:
    hog = victim.service("hog")
    try:
        held = start_hold(hog, GATEWAY, port, FLOOD)
        [answer] = probe(victim, get("http://allowed.test/", timeout=10))
    finally:
        stop_hold(hog)
    ok(answer, hello("allowed.test"))
    assert held["connected"] > 0, held  # it does reach the gateway
    deadline = time.monotonic() + 60  # and is served again once the gateway saw it let go
    while True:
        [after] = probe(hog, get("http://allowed.test/", timeout=10))
        served = after["error"] is None and after.get("status") == 200
        if served or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    ok(after, hello("allowed.test"))


# ----- item 12: addresses are addresses; no lookup for what no entry allows ----------------


def test_an_address_allowlist_looks_no_name_up(
    world: World, victim: Runtime, tmp_path: Path
) -> None:
    secret = f"secret{secrets.token_hex(6)}.notallowed.test"
    hexes = ["cafe", "deadbeef", "1234", "abc", "999.1.1.1", "1234.5678.90"]
    body = "network: {egress: ['203.0.113.0/24']}\n"
    before = len(world.queries())
    with spawn_runtime(env_file(tmp_path, "byaddress", body)) as rt:
        answers = probe(
            rt,
            *(get(f"http://{name}/") for name in [*hexes, secret]),
            *(tunnel(f"{name}:443") for name in [*hexes, secret]),
            get(f"http://{world.hosts['allowed.test']}/"),  # the range itself is reached
        )
    n = len(hexes) + 1
    gets, tunnels, by_address = answers[:n], answers[n : 2 * n], answers[2 * n]
    for answer in gets:
        refused(answer)
    for answer in tunnels:
        assert answer["error"] is None and " 403 " in answer["status_line"], answer
    ok(by_address, hello("allowed.test"))
    asked = world.queries()[before:]
    assert not [q for q in asked if q in hexes or q == secret], asked
    # the control: an allowed name is still looked up, and still works
    listed = nosuch_name()
    allowed, looked_up = probe(victim, get("http://allowed.test/"), tunnel(f"{listed}:443"))
    ok(allowed, hello("allowed.test"))
    assert looked_up["error"] is None and " 200 " not in looked_up["status_line"], looked_up
    assert listed in world.queries(), world.queries()


# ----- suspected: FTP's data connection; only HTTP and CONNECT leave -----------------------


def test_only_http_and_connect_leave(world: World, victim: Runtime) -> None:
    ftp, https_get, plain, tunnelled = probe(
        victim,
        via_proxy(f"GET ftp://allowed.test:80/ {CLOSE}", body=True),
        via_proxy(f"GET https://allowed.test/ {CLOSE}", body=True),
        get("http://allowed.test/"),
        tunnel("allowed.test:443"),
    )
    for answer in (ftp, https_get):
        assert answer["error"] is None and " 403 " in answer["status_line"], answer
        assert "HTTP" in answer["body"] and DENIED_BODY not in answer["body"], answer
    ok(plain, hello("allowed.test"))
    assert tunnelled["error"] is None and " 200 " in tunnelled["status_line"], tunnelled


# ----- gVisor: the same wiring holds for sandboxes on gVisor's network stack ---------------


def test_gvisor_sandboxes_leave_by_the_shared_network_as_runc_ones(
    world: World, module_dir: Path, gvisor_engine: str
) -> None:
    body = "isolation: gvisor\nnetwork: {egress: [allowed.test]}\nservices:\n"
    body += f"  web:\n    image: {PYTHON_IMAGE}\n    command: [sleep, '3600']\n    egress: all\n"
    with spawn_runtime(env_file(module_dir, "gvshared", body)) as rt:
        proxied, denied = probe(rt, get("http://allowed.test/"), get("http://denied.test/"))
        [direct] = probe(rt.service("web"), get("http://allowed.test/", proxy=False))
        seen = inspect(rt, "web")
        assert seen["HostConfig"]["Runtime"] == gvisor_engine
        aliases = seen["NetworkSettings"]["Networks"][world.network]["Aliases"] or []
    ok(proxied, hello("allowed.test"))
    refused(denied)
    ok(direct, hello("allowed.test"))
    assert set(aliases) <= {seen["Name"].lstrip("/"), seen["Id"][:12]}, aliases


# ----- review: an IPv6 destination aborted the gateway -------------------------------------


def test_an_ipv6_destination_is_refused_and_the_gateway_lives_on(
    world: World, module_dir: Path
) -> None:
    """A file allowing 0.0.0.0/0 (every address, to this Squid IPv6 too) had its gateway
    abort on one `CONNECT [2001:db8::1]:443` (an assertion: the gateway has no IPv6), and
    egress was dead for the rest of the environment's life. A request naming an IPv6
    address is refused; the gateway serves on."""
    served = world.hosts["allowed.test"]
    body = "network: {egress: ['0.0.0.0/0']}\n"
    with spawn_runtime(env_file(module_dir, "v6abort", body)) as rt:
        v6, v6_get, after = probe(
            rt,
            tunnel("[2001:db8::1]:443"),
            via_proxy(f"GET http://[2001:db8::1]/ {CLOSE}", body=True),
            tunnel(f"{served}:443"),
        )
    for answer in (v6, v6_get):
        assert answer["error"] is None and " 403 " in answer["status_line"], answer
    assert after["error"] is None and " 200 " in after["status_line"], after
