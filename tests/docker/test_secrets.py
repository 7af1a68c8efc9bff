"""Secrets the sandbox never sees (issue 41, item 2), against the real engine and the
hermetic test world: the sandbox holds a placeholder, the egress gateway's relay puts the
value in the headers of HTTPS requests to the secret's own host (the world's server sees
it), and nowhere else: not in a body or a URL, not to another host, not over plain HTTP,
not where the request's names disagree (the TLS name, the Host header), not in a lookup;
an answer that repeats the value shows the sandbox the placeholder; the value is in no
variable, process environment, log, `render`, inspect output or snapshot of the sandbox.

Each "not there" has its positive control in the same test: the same request to the
secret's host, seen by its server with the value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, SpecError, spawn_runtime
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.spec.policy import Policy
from orchestrator.testing.world import World
from tests.docker.test_egress import env_file, module_dir, world

pytestmark = pytest.mark.docker
__all__ = ["module_dir", "world"]  # (the fixtures this module shares)

RELAY_UID = 1879048193
"""templates/gateway/start's RELAY_UID."""
VALUE = "sk-test-" + "Zq7" * 10
"""The secret: it must reach allowed.test's server in a header, and nothing else."""
CLI = [sys.executable, "-m", "orchestrator"]

CLIENT = r'''
"""Run in a sandbox: python3 -c CLIENT JSON; one HTTPS (or HTTP) request through the gateway,
with its own TLS name and Host header; prints the status and body (or the error)."""
import http.client, json, os, socket, ssl, sys

a = json.loads(sys.argv[1])
key = os.environ["API_KEY"]
fill = lambda text: text.replace("KEY", key)
try:
    s = socket.create_connection(("orchestrator-egress", 3128), timeout=30)
    target = "%s:%d" % (a["connect"], a.get("port", 443))
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        part = s.recv(4096)
        if not part:
            break
        head += part
    if b" 200 " not in head.split(b"\r\n")[0] + b" ":
        print(json.dumps({"status": None, "body": head.decode(errors="replace")}))
        sys.exit()
    if a.get("tls", True):
        context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        if a.get("loose"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        s = context.wrap_socket(s, server_hostname=a.get("sni", a["connect"]))
    conn = http.client.HTTPConnection(a.get("host", a["connect"]))
    conn.sock = s
    body = fill(a.get("body", "")).encode()
    headers = {k: fill(v) for k, v in a.get("headers", {}).items()}
    headers["Host"] = a.get("host", a["connect"])
    conn.request("POST", fill(a.get("path", "/echo")), body=body, headers=headers)
    answer = conn.getresponse()
    print(json.dumps({"status": answer.status, "body": answer.read().decode(errors="replace")}))
except Exception as exc:
    print(json.dumps({"status": None, "body": "error: %r" % (exc,)}))
'''

BODY = """\
network: {egress: [allowed.test, www.allowed.test, denied.test]}
secrets:
  API_KEY: {hosts: [allowed.test]}
"""


def send(rt: Runtime, **request: Any) -> dict[str, Any]:
    ran = rt.execute(["python3", "-c", CLIENT, json.dumps(request)], timeout=90)
    assert ran.exit_code == 0, (ran.stdout, ran.stderr)
    answer: dict[str, Any] = json.loads(ran.stdout)
    return answer


def seen(world: World, name: str) -> list[str]:
    """Everything the server of `name` got on /echo, as one text per request."""
    return [json.dumps(r) for r in world.requests(name)]


@pytest.fixture(scope="module")
def trust(world: World, module_dir: Path) -> Path:
    path = module_dir / "world-certs.pem"
    path.write_text("".join(world.certs.values()))
    return path


@pytest.fixture(scope="module")
def held(world: World, module_dir: Path, trust: Path) -> Iterator[Runtime]:
    policy = Policy(secrets={"API_KEY": (VALUE, ["allowed.test"])}, gateway_trust=str(trust))
    with spawn_runtime(env_file(module_dir, "held", BODY), policy=policy) as rt:
        yield rt


def test_the_secrets_host_gets_the_value_in_a_header_and_nothing_else_does(
    world: World, held: Runtime
) -> None:
    placeholder = held.execute('printf %s "$API_KEY"').stdout
    assert len(placeholder) == len(VALUE) and placeholder != VALUE
    before = len(world.requests("allowed.test"))
    got = send(
        held,
        connect="allowed.test",
        path="/echo?key=KEY",
        headers={"Authorization": "Bearer KEY", "X-Other": "a KEY b"},
        body="in the body: KEY",
    )
    assert got["status"] == 200, got
    server = world.requests("allowed.test")[before:]
    assert len(server) == 1, server
    headers = dict(server[0]["headers"])
    assert headers["Authorization"] == f"Bearer {VALUE}"  # the positive control
    assert headers["X-Other"] == f"a {VALUE} b"
    assert server[0]["body"] == f"in the body: {placeholder}"  # a body is not a header
    assert server[0]["path"] == f"/echo?key={placeholder}"  # nor a URL
    # the server repeated the value: the sandbox sees its placeholder there
    assert VALUE not in got["body"] and f"Bearer {placeholder}" in got["body"], got


def test_no_other_host_no_disagreeing_name_and_no_plain_http_get_the_value(
    world: World, held: Runtime
) -> None:
    marks = {name: len(world.requests(name)) for name in ("allowed.test", "www.allowed.test")}
    header = {"Authorization": "Bearer KEY"}
    # another allowed host: an untouched tunnel (the sandbox does not trust its certificate,
    # so it skips the check here), which gets the placeholder
    other = send(held, connect="www.allowed.test", headers=header, loose=True)
    assert other["status"] == 200, other
    # the tunnel is to the secret's host, but the TLS name or the Host header names another
    sni = send(held, connect="allowed.test", sni="www.allowed.test", headers=header, loose=True)
    host = send(held, connect="allowed.test", host="www.allowed.test", headers=header)
    assert sni["status"] == 421 and host["status"] == 421, (sni, host)
    # plain HTTP to the secret's host: Squid's own, never the relay's
    ran = held.execute(
        [
            "python3",
            "-c",
            "import os, urllib.request as u; r = u.Request('http://allowed.test/echo', "
            "data=b'x', headers={'Authorization': 'Bearer ' + os.environ['API_KEY']}); "
            "print(u.urlopen(r, timeout=30).status)",
        ],
        timeout=60,
    )
    assert ran.stdout.strip() == "200", (ran.stdout, ran.stderr)
    got = [*seen(world, "allowed.test")[marks["allowed.test"] :]]
    got += seen(world, "www.allowed.test")[marks["www.allowed.test"] :]
    assert len(got) == 2, got  # the untouched tunnel and the plain request arrived
    assert all(VALUE not in text for text in got), got
    # and a lookup of the placeholder (a name the allowlist lets through) asks for it alone
    name = held.execute('printf %s "$API_KEY" | tr A-Z a-z').stdout + ".allowed.test"
    send(held, connect=name.lower(), headers=header, loose=True)
    assert VALUE.lower() not in " ".join(world.queries())


def test_the_value_is_nowhere_the_sandbox_or_a_reader_of_its_records_can_look(
    held: Runtime, tmp_path: Path
) -> None:
    assert isinstance(held, ComposeRuntime)
    assert VALUE not in held.execute("env; cat /proc/*/environ 2>/dev/null", user="root").stdout
    assert held.project is not None
    project = held.project.directory
    values = project / "gateway" / "secrets" / "values.json"
    assert VALUE in values.read_text()  # (the gateway's own copy, the positive control)
    assert values.stat().st_mode & 0o777 == 0o600
    assert (project / "gateway" / "secrets").stat().st_mode & 0o777 == 0o711
    for path in project.rglob("*"):
        if path.is_file() and path.parent.name != "secrets":
            assert VALUE not in path.read_text(errors="replace"), path
    assert held.project is not None
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            f"label=com.docker.compose.project={held.project.name}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = listed.stdout.split()
    assert len(ids) == 2, ids  # the sandbox and its gateway
    for ident in ids:
        inspected = subprocess.run(["docker", "inspect", ident], capture_output=True, text=True)
        logs = subprocess.run(["docker", "logs", ident], capture_output=True, text=True)
        assert VALUE not in inspected.stdout + logs.stdout + logs.stderr
    snap = held.snapshot(tmp_path / "snap.tar", filesystem=True)
    try:
        assert VALUE.encode() not in snap.path.read_bytes()
        saved = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                snap.image,
                "-c",
                "env; cat /etc/orchestrator/ca-bundle.pem",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "BEGIN CERTIFICATE" in saved.stdout and VALUE not in saved.stdout, saved.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", snap.image], capture_output=True)


def test_render_names_no_value_and_the_start_refuses_what_cannot_hold(
    world: World, module_dir: Path, trust: Path
) -> None:
    env = env_file(module_dir, "rendered", BODY)
    secrets_file = module_dir / "secrets.env"
    secrets_file.write_text(f"# the caller's\nAPI_KEY@allowed.test={VALUE}\n")
    secrets_file.chmod(0o600)

    def render() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "render", str(env)],
            capture_output=True,
            text=True,
            env={**os.environ, "ORCHESTRATOR_SECRETS_FILE": str(secrets_file)},
            timeout=120,
        )

    shown = render()
    assert shown.returncode == 0, shown.stderr
    assert "API_KEY" in shown.stdout and VALUE not in shown.stdout + shown.stderr
    secrets_file.chmod(0o644)
    loose = render()
    assert loose.returncode == 2 and "chmod 600" in loose.stderr, loose.stderr
    assert VALUE not in loose.stdout + loose.stderr
    closed = env_file(module_dir, "closed-secret", "secrets:\n  API_KEY: {hosts: [allowed.test]}\n")
    with pytest.raises(SpecError, match="secrets") as refused:
        spawn_runtime(closed, policy=Policy(secrets={"API_KEY": (VALUE, ["allowed.test"])}))
    assert VALUE not in str(refused.value)


def test_a_host_the_gateway_cannot_verify_never_gets_the_value(
    world: World, module_dir: Path
) -> None:
    """Without the caller's trust for the world's certificates, the relay cannot verify the
    secret's host: the request fails, and the server sees nothing at all."""
    before = len(world.requests("allowed.test"))
    policy = Policy(secrets={"API_KEY": (VALUE, ["allowed.test"])})
    with spawn_runtime(env_file(module_dir, "unverified", BODY), policy=policy) as rt:
        got = send(rt, connect="allowed.test", headers={"Authorization": "Bearer KEY"})
    assert got["status"] in (502, None), got
    assert VALUE not in json.dumps(got)
    assert len(world.requests("allowed.test")) == before


def test_set_egress_taking_the_host_away_stops_the_value_at_once(
    world: World, module_dir: Path, trust: Path
) -> None:
    policy = Policy(secrets={"API_KEY": (VALUE, ["allowed.test"])}, gateway_trust=str(trust))
    with spawn_runtime(env_file(module_dir, "narrowed", BODY), policy=policy) as rt:
        header = {"Authorization": "Bearer KEY"}
        assert send(rt, connect="allowed.test", headers=header)["status"] == 200
        before = len(world.requests("allowed.test"))
        rt.set_egress(["www.allowed.test"])
        got = send(rt, connect="allowed.test", headers=header)
        assert got["status"] is None and " 403 " in got["body"], got  # Squid's refusal
        assert len(world.requests("allowed.test")) == before


def test_the_relay_runs_as_its_own_user_unreadable_and_comes_back_when_killed(
    world: World, held: Runtime
) -> None:
    pid = relay_pid(held)
    peek = subprocess.run(
        [
            "setpriv",
            f"--reuid={RELAY_UID}",
            f"--regid={RELAY_UID}",
            "--clear-groups",
            "cat",
            f"/proc/{pid}/environ",
            f"/proc/{pid}/root/run/orchestrator-gateway/relay/values.json",
        ],
        capture_output=True,
        text=True,
    )
    assert peek.returncode != 0 and VALUE not in peek.stdout, peek  # not dumpable
    subprocess.run(["kill", "-9", str(pid)], check=True)  # (what an OOM kill does)
    answers(held)
    assert relay_pid(held) != pid
    # the whole gateway started again (as a narrowing that cuts open tunnels does): its
    # relay finds its own files of the first start in place, and starts all the same
    subprocess.run(["docker", "restart", gateway_of(held)], check=True, capture_output=True)
    answers(held)


def answers(rt: Runtime) -> None:
    """The secret's host gets its value again within 30 s."""
    header = {"Authorization": "Bearer KEY"}
    deadline = time.monotonic() + 30
    while True:
        got = send(rt, connect="allowed.test", headers=header)
        if got["status"] == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got["status"] == 200, got


def gateway_of(rt: Runtime) -> str:
    """The id of the environment's gateway container."""
    assert isinstance(rt, ComposeRuntime) and rt.project is not None
    gateway = subprocess.run(
        [
            "docker",
            "ps",
            "-q",
            "--filter",
            f"label=com.docker.compose.project={rt.project.name}",
            "--filter",
            "label=com.docker.compose.service=orchestrator-egress",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(gateway) == 1, gateway
    return gateway[0]


def relay_pid(rt: Runtime) -> int:
    """The host pid of the environment's relay (checking it runs as its own user)."""
    top = subprocess.run(
        ["docker", "top", gateway_of(rt), "-eo", "pid,uid,args"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    found = [line.split() for line in top if "mitmdump" in line and "setpriv" not in line]
    assert len(found) == 1, top
    assert found[0][1] == str(RELAY_UID), found  # its own user, not Squid's
    return int(found[0][0])


TUNNEL = r"""
import os, socket, ssl


def tunnel(timeout):  # TLS to allowed.test through the gateway, as the sandbox trusts it
    s = socket.create_connection(("orchestrator-egress", 3128), timeout=timeout)
    s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
    s.recv(4096)
    context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    return context.wrap_socket(s, server_hostname="allowed.test")
"""
"""What the sandbox scripts below start with: `tunnel(timeout)`."""


FLOOD = (
    TUNNEL
    + r"""
import threading
def one():
    try:
        t = tunnel(20)
        size = 48 * 1024 * 1024
        t.sendall(b"POST /echo HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"\0" * 65536
        for _ in range(size // len(block)):
            t.sendall(block)
    except OSError:
        pass
threads = [threading.Thread(target=one) for _ in range(6)]
[t.start() for t in threads]
[t.join() for t in threads]
print("sent")
"""
)


def test_a_flood_of_large_uploads_leaves_the_relay_standing(held: Runtime) -> None:
    """Six 48 MiB bodies at once to the secret's host (more than the gateway's memory if
    they were held): bodies stream through, and the relay lives on to serve the next."""
    pid = relay_pid(held)
    ran = held.execute(["python3", "-c", FLOOD], timeout=300)
    assert ran.stdout.strip() == "sent", (ran.stdout, ran.stderr)
    assert relay_pid(held) == pid
    got = send(held, connect="allowed.test", headers={"Authorization": "Bearer KEY"})
    assert got["status"] == 200, got


RAW = (
    TUNNEL
    + r"""
import json, sys, zlib
how = sys.argv[1]
key = os.environ["API_KEY"]
t = tunnel(30)
t.sendall(("GET /reflect/%s HTTP/1.1\r\nHost: allowed.test\r\nTE: gzip\r\n"
           "Authorization: Bearer %s\r\nConnection: close\r\n\r\n" % (how, key)).encode())
raw = b""
try:
    while True:
        part = t.recv(65536)
        if not part:
            break
        raw += part
except (OSError, ssl.SSLError):
    pass
opened = []
at = raw.find(b"\x1f\x8b")
if at >= 0:
    try:
        opened.append(zlib.decompressobj(31).decompress(raw[at:]).decode("latin-1"))
    except zlib.error:
        pass
print(json.dumps({"raw": raw.decode("latin-1"), "opened": opened}))
"""
)


@pytest.mark.parametrize("how", ["header", "cut", "reason", "gzip", "te-gzip", "split"])
def test_a_server_that_sends_the_value_back_shows_the_sandbox_no_value(
    held: Runtime, how: str
) -> None:
    """A hostile (or careless) secret's host repeats the key it got: in a header, in a
    header of an answer it cuts short (mitmproxy's own error page would quote it), in the
    status line, in a gzip body, under a gzip transfer coding, one byte a chunk. The sandbox
    sees its placeholder or an error, never the value."""
    placeholder = held.execute('printf %s "$API_KEY"').stdout
    ran = held.execute(["python3", "-c", RAW, how], timeout=90)
    assert ran.exit_code == 0, (ran.stdout, ran.stderr)
    got = json.loads(ran.stdout)
    seen = got["raw"] + "".join(got["opened"])
    assert VALUE not in seen, seen
    if how in ("header", "gzip"):  # the positive control: the placeholder came back
        assert placeholder in seen, seen
    if how == "split":  # a body held back piece by piece still arrives whole
        body = seen.split("\r\n\r\n", 1)[1]
        pieces, rest = [], body
        while rest:
            size, _, rest = rest.partition("\r\n")
            if int(size, 16) == 0:
                break
            pieces.append(rest[: int(size, 16)])
            rest = rest[int(size, 16) + 2 :]
        assert "".join(pieces) == f"Bearer {placeholder}", body


BIG_HEAD = (
    TUNNEL
    + r"""
t = tunnel(20)
t.settimeout(10)
said = "open"
try:
    t.sendall(b"GET /echo HTTP/1.1\r\nHost: allowed.test\r\nX-Big: ")
    for _ in range(64):  # 4 MiB of one header, never ended
        t.sendall(b"a" * 65536)
    said = "closed" if t.recv(4096) == b"" else "answered"
except socket.timeout:
    said = "open"
except (OSError, ssl.SSLError):
    said = "closed"
print(said)
"""
)


def test_a_head_past_its_bound_is_cut_and_the_relay_stands(held: Runtime) -> None:
    """A request head that never ends (mitmproxy 8.1 would hold it all, to the gateway's
    memory): the relay closes it past 64 KiB and serves the next request."""
    pid = relay_pid(held)
    ran = held.execute(["python3", "-c", BIG_HEAD], timeout=120)
    assert ran.stdout.strip() == "closed", (ran.stdout, ran.stderr)
    assert relay_pid(held) == pid
    assert send(held, connect="allowed.test", headers={"X": "KEY"})["status"] == 200
