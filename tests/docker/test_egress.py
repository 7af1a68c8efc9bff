"""Egress exactly as declared (issue 22), against the real engine and a hermetic outside
world (`orchestrator.testing.world`): `none` lets nothing out (no name resolves, no address
answers, no query leaves), `all` lets anything out, an allowlist lets out exactly its entries
through the environment's gateway, published ports open no way out, the sandbox cannot change
the gateway, each service gets its own setting, the caller's policy narrows a file's.

Each check that something does not leave has a positive control: the same probe, where it
may leave, is seen leaving (an answer, or a query in the world's resolver log)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, SpecError, spawn_runtime
from orchestrator.backends.docker.network import GATEWAY
from orchestrator.sandbox.calls import Sandbox
from orchestrator.testing.world import World
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids
from tests.docker.conftest import leaving_by_world

Result = dict[str, Any]
"""What the probe said about one action."""

ALLOWLIST = '[allowed.test, "*.allowed.test:443"]'
DENIED_BODY = "network.egress"
"""What the gateway's refusal page names (the field to change)."""
FAST = 3.0
"""Seconds within which a refusal (or a failed lookup) must come: a refusal, not a hang."""
CLI = [sys.executable, "-m", "orchestrator"]

PROBE = r'''
"""Run in a sandbox: python3 -c PROBE ACTIONS-JSON; prints one result per action (JSON)."""
import json, socket, ssl, subprocess, sys, time, urllib.error, urllib.request

LOOSE = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
LOOSE.check_hostname = False
LOOSE.verify_mode = ssl.CERT_NONE


def get(a):
    handlers = [urllib.request.HTTPSHandler(context=LOOSE)]
    if not a.get("proxy", True):
        handlers.append(urllib.request.ProxyHandler({}))  # ignore the proxy variables
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(a["url"], timeout=a.get("timeout", 5)) as answer:
            return {"status": answer.status, "body": answer.read().decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode(errors="replace")}


def resolve(a):
    return {"addr": socket.gethostbyname(a["name"])}


def getent(a):
    run = subprocess.run(["getent", "hosts", a["name"]], capture_output=True, text=True,
                         timeout=a.get("timeout", 10))
    return {"code": run.returncode, "out": run.stdout}


def connect(a):
    with socket.create_connection((a["host"], a["port"]), timeout=a.get("timeout", 2)):
        return {"ok": True}


def read_head(sock):
    got = b""
    while b"\r\n\r\n" not in got:
        part = sock.recv(4096)
        if not part:
            break
        got += part
    head, _, rest = got.partition(b"\r\n\r\n")
    return head.decode(errors="replace"), rest


def raw(a):
    """Send bytes to host:port, read the answer's head (and body until close, or echo)."""
    with socket.create_connection((a["host"], a["port"]), timeout=a.get("timeout", 5)) as s:
        s.sendall(a["send"].encode())
        head, rest = read_head(s)
        out = {"status_line": head.split("\r\n", 1)[0], "head": head}
        if a.get("echo") is not None and " 200 " in out["status_line"] + " ":
            want = a["echo"].encode()
            s.sendall(want)
            got = rest
            while len(got) < len(want):
                part = s.recv(4096)
                if not part:
                    break
                got += part
            out["echo"] = got.decode(errors="replace")
        elif a.get("body"):
            body = rest
            while True:
                part = s.recv(65536)
                if not part:
                    break
                body += part
            out["body"] = body.decode(errors="replace")
        return out


def flood(a):
    """`n` GETs of a URL through the proxy; how many of each status came back."""
    seen = {}
    for _ in range(a["n"]):
        status = get({"url": a["url"], "timeout": a.get("timeout", 5)})["status"]
        seen[str(status)] = seen.get(str(status), 0) + 1
    return {"seen": seen}


def search(a):
    """Per needle, the files (under / but /proc, /sys, /dev) holding it."""
    import os
    needles = [n.encode() for n in a["needles"]]
    found = {n: [] for n in a["needles"]}
    for top, dirs, files in os.walk("/"):
        if top == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
        for name in files:
            path = os.path.join(top, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) > 4 << 20:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            for needle in needles:
                if needle in data:
                    found[needle.decode()].append(path)
    return {"found": found}


OPS = {"get": get, "resolve": resolve, "getent": getent, "connect": connect, "raw": raw,
       "flood": flood, "search": search}
out = []
for action in json.loads(sys.argv[1]):
    started = time.monotonic()
    try:
        result = OPS[action["op"]](action)
        result["error"] = None
    except Exception as exc:
        result = {"error": "%s: %s" % (type(exc).__name__, exc)}
    result["elapsed"] = time.monotonic() - started
    out.append(result)
print(json.dumps(out))
'''


def probe(box: Sandbox, *actions: dict[str, Any], user: str | None = None) -> list[Result]:
    """Run the probe's actions in `box` (the sandbox or a service); one result per action."""
    ran = box.execute(["python3", "-c", PROBE, json.dumps(list(actions))], timeout=120, user=user)
    assert ran.exit_code == 0, (ran.stdout, ran.stderr)
    results: list[Result] = json.loads(ran.stdout)
    return results


def get(url: str, *, proxy: bool = True, timeout: float = 5) -> dict[str, Any]:
    return {"op": "get", "url": url, "proxy": proxy, "timeout": timeout}


def resolve(name: str) -> dict[str, Any]:
    return {"op": "resolve", "name": name}


def getent(name: str) -> dict[str, Any]:
    return {"op": "getent", "name": name}


def connect(host: str, port: int, timeout: float = 2) -> dict[str, Any]:
    return {"op": "connect", "host": host, "port": port, "timeout": timeout}


def via_proxy(send: str, **more: Any) -> dict[str, Any]:
    """Raw bytes to the environment's proxy."""
    return {"op": "raw", "host": GATEWAY, "port": 3128, "send": send, **more}


def tunnel(target: str, echo: str | None = None) -> dict[str, Any]:
    """A CONNECT to `target` (host:port) through the proxy; with `echo`, a round trip in it."""
    send = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    return via_proxy(send, echo=echo)


def nosuch_name() -> str:
    """A name the allowlist lets through (`*.allowed.test:443`) that the world does not
    serve: the gateway asks the outside resolver for it, which logs the query."""
    return f"nosuch-{secrets.token_hex(6)}.allowed.test"


def exfil_name() -> str:
    """A name under denied.test nobody has asked for yet: if it shows up in the resolver's
    log, a query left the environment."""
    return f"exfil-{secrets.token_hex(6)}.denied.test"


def ok(result: Result, body: str) -> None:
    """The probe got HTTP 200 with `body`."""
    assert result["error"] is None and result["status"] == 200, result
    assert result["body"] == body, result


def refused(result: Result) -> None:
    """The gateway answered 403 naming network.egress, fast."""
    assert result["error"] is None and result["status"] == 403, result
    assert DENIED_BODY in result["body"], result
    assert result["elapsed"] < FAST, result


def failed(result: Result) -> None:
    """The action failed (no resolution, no route, refused), fast: not a hang."""
    assert result["error"] is not None, result
    assert result["elapsed"] < FAST, result


def hello(name: str) -> str:
    return f"hello from {name}\n"


def env_file(folder: Path, name: str, body: str, image: str = PYTHON_IMAGE) -> Path:
    """Write an environment file into `folder` (the test's tmp_path)."""
    path = folder / f"{name}.yaml"
    path.write_text(f"version: 1\nname: {name}\nimage: {image}\n{body}")
    return path


def service_file(folder: Path, name: str, main: str, web: str) -> Path:
    """main (python) with network.egress `main`, and a python service `web` (sleeping) with
    egress `web`."""
    body = (
        f"network: {{egress: {main}}}\n"
        "services:\n"
        "  web:\n"
        f"    image: {PYTHON_IMAGE}\n"
        "    command: [sleep, '3600']\n"
        f"    egress: {web}\n"
    )
    return env_file(folder, name, body)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The outside world; every environment of the module leaves by its network and its
    resolver (environments come down before it does: their fixtures depend on this one)."""
    with leaving_by_world() as started:
        yield started


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("egress")


@pytest.fixture(scope="module")
def closed(world: World, module_dir: Path) -> Iterator[Runtime]:
    """`egress` left out (none), with a busybox service `db`."""
    body = f"services:\n  db:\n    image: {BUSYBOX_IMAGE}\n    command: [sleep, '3600']\n"
    with spawn_runtime(env_file(module_dir, "closed", body)) as rt:
        yield rt


@pytest.fixture(scope="module")
def open_all(world: World, module_dir: Path) -> Iterator[Runtime]:
    """`egress: all`."""
    with spawn_runtime(env_file(module_dir, "open", "network: {egress: all}\n")) as rt:
        yield rt


@pytest.fixture(scope="module")
def listed(world: World, module_dir: Path) -> Iterator[Runtime]:
    """The allowlist, and a published port 8000."""
    body = f"network:\n  egress: {ALLOWLIST}\n  ports: [{{container: 8000}}]\n"
    with spawn_runtime(env_file(module_dir, "listed", body)) as rt:
        yield rt


# ----- 1. egress: none -------------------------------------------------------------------


def test_none_resolves_no_outside_name_and_reaches_no_outside_address(
    world: World, closed: Runtime
) -> None:
    name, ip = "allowed.test", world.hosts["allowed.test"]
    by_name, by_getent, by_ip, by_http, db = probe(
        closed,
        resolve(name),
        getent(name),
        connect(ip, 80),
        get(f"http://{ip}/", timeout=2),
        resolve("db"),
    )
    failed(by_name)
    assert by_getent["code"] != 0 and by_getent["elapsed"] < FAST, by_getent
    failed(by_ip)
    failed(by_http)
    assert db["error"] is None and db["addr"], db  # the environment's own names still resolve
    env = closed.execute("env").stdout
    assert "proxy" not in env.lower(), env  # no gateway to point at


def test_none_sends_no_query_to_the_outside_resolver(
    world: World, closed: Runtime, listed: Runtime
) -> None:
    secret, control = exfil_name(), nosuch_name()
    by_name, by_getent = probe(closed, resolve(secret), getent(secret))
    failed(by_name)
    assert by_getent["code"] != 0 and by_getent["elapsed"] < FAST, by_getent
    # positive control: a name that does leave (the allowlist's gateway looks it up, by the
    # resolver ORCHESTRATOR_EGRESS_DNS names) is seen by the resolver
    [seen] = probe(listed, tunnel(f"{control}:443"))
    assert seen["error"] is None and " 200 " not in seen["status_line"], seen  # NXDOMAIN
    queries = world.queries()
    assert control in queries, queries
    assert secret not in queries, queries


# ----- 2. egress: all --------------------------------------------------------------------


def test_all_reaches_every_outside_name(open_all: Runtime) -> None:
    allowed, denied = probe(open_all, get("http://allowed.test/"), get("https://denied.test/"))
    ok(allowed, hello("allowed.test"))
    ok(denied, hello("denied.test"))


# ----- 3. an allowlist -------------------------------------------------------------------


def test_allowlist_lets_out_exactly_its_entries(world: World, listed: Runtime) -> None:
    http, https, www_https, denied, denied_ip, www_http, denied_https = probe(
        listed,
        get("http://allowed.test/"),
        get("https://allowed.test/"),
        get("https://www.allowed.test/"),
        get("http://denied.test/"),
        get(f"http://{world.hosts['denied.test']}/"),
        get("http://www.allowed.test/"),  # *.allowed.test is listed for 443 only
        get("https://denied.test/"),
    )
    ok(http, hello("allowed.test"))
    ok(https, hello("allowed.test"))
    ok(www_https, hello("www.allowed.test"))
    refused(denied)
    refused(denied_ip)
    refused(www_http)
    failed(denied_https)  # the CONNECT is refused: urllib says "Tunnel connection failed: 403"
    assert "403" in denied_https["error"], denied_https


def test_usage_counts_what_went_out_through_the_gateway_and_what_it_refused(
    closed: Runtime, open_all: Runtime, listed: Runtime
) -> None:
    before = listed.usage().egress
    assert before is not None
    out, again, denied, denied_tunnel = probe(
        listed,
        get("http://allowed.test/"),
        get("http://allowed.test/"),
        get("http://denied.test/"),
        tunnel("denied.test:443"),
    )
    ok(out, hello("allowed.test"))
    ok(again, hello("allowed.test"))
    refused(denied)
    assert " 403 " in denied_tunnel["status_line"] + " ", denied_tunnel
    # what a request says cannot count as a request: a header with a NUL and a forged line
    # (Squid quotes it in its own log, on stderr, which is never read), a forwarding loop
    forged = "ORCH 1.000 10.9.9.9 TCP_MISS/200 HIER_DIRECT/1.2.3.4 999999999 888888888"
    fake, loop = probe(
        listed,
        via_proxy(
            f"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nX-A: a\x00b\n{forged}"
            "\r\n\r\n"
        ),
        via_proxy(
            "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n"
            f"Via: 1.1 {GATEWAY} (squid)\r\nX-B: {forged}\r\n\r\n"
        ),
    )
    # (Squid logs a request it refused as malformed once its connection is done with, a
    # moment after the answer: a CI run read the log before the last two were in it)
    deadline = time.monotonic() + 10
    while True:
        got = listed.usage().egress
        assert got is not None and got.complete, got
        seen = got.allowed + got.denied - before.allowed - before.denied
        if seen >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    sent = 2 + (" 200 " in fake["status_line"] + " ") + (" 200 " in loop["status_line"] + " ")
    assert got.allowed - before.allowed == sent, (before, got, fake, loop)
    assert got.allowed + got.denied - before.allowed - before.denied == 6, (before, got)
    assert got.bytes_sent - before.bytes_sent < 100_000, (before, got)  # nothing forged
    assert got.bytes_received - before.bytes_received >= 2 * len(hello("allowed.test"))
    # its log is bounded on the host's disk
    gateway = f"{listed.info().id}-{GATEWAY}-1"
    logged = subprocess.run(
        ["docker", "inspect", "-f", "{{json .HostConfig.LogConfig}}", gateway],
        capture_output=True,
        text=True,
        timeout=60,
    )
    config = json.loads(logged.stdout)
    assert config["Config"] == {"max-size": "8m", "max-file": "2"}, config
    # no gateway, nothing to count: none lets nothing out, all lets everything out
    assert closed.usage().egress is None and open_all.usage().egress is None


def test_allowlist_has_no_way_around_the_proxy(world: World, listed: Runtime) -> None:
    ip = world.hosts["allowed.test"]
    by_name, direct_name, direct_ip, raw_ip, control = probe(
        listed,
        resolve("allowed.test"),
        get("http://allowed.test/", proxy=False, timeout=2),
        get(f"http://{ip}/", proxy=False, timeout=2),
        connect(ip, 80),
        get(f"http://{ip}/"),  # through the proxy: an address is not on the list
    )
    failed(by_name)
    failed(direct_name)
    failed(direct_ip)
    failed(raw_ip)
    refused(control)


def test_allowlist_sends_no_denied_query_to_the_outside_resolver(
    world: World, listed: Runtime
) -> None:
    secret, proxied, control = exfil_name(), exfil_name(), nosuch_name()
    by_name, by_getent, by_proxy, by_tunnel, allowed = probe(
        listed,
        resolve(secret),
        getent(secret),
        get(f"http://{proxied}/"),
        tunnel(f"{proxied}:443"),
        tunnel(f"{control}:443"),  # listed (*.allowed.test:443) but not served
    )
    failed(by_name)
    assert by_getent["code"] != 0 and by_getent["elapsed"] < FAST, by_getent
    refused(by_proxy)
    assert by_tunnel["error"] is None and " 403 " in by_tunnel["status_line"], by_tunnel
    # the positive control: the gateway looked the listed name up, and the resolver saw it
    assert allowed["error"] is None and " 200 " not in allowed["status_line"], allowed
    queries = world.queries()
    assert control in queries, queries
    assert secret not in queries and proxied not in queries, queries


def test_allowlist_tunnels_only_listed_ports(world: World, listed: Runtime) -> None:
    [seven] = probe(listed, tunnel("allowed.test:7000", echo="ping\n"))
    assert seven["error"] is None and " 403 " in seven["status_line"], seven
    assert "echo" not in seven


def test_allowlist_with_a_port_tunnels_to_it(world: World, tmp_path: Path) -> None:
    body = "network: {egress: ['allowed.test:7000']}\n"
    ping = "ping" * 2000 + "\n"
    with spawn_runtime(env_file(tmp_path, "tunnel", body)) as rt:
        echo, web = probe(rt, tunnel("allowed.test:7000", echo=ping), get("http://allowed.test/"))
        counted = rt.usage().egress
    assert echo["error"] is None and " 200 " in echo["status_line"] + " ", echo
    assert echo["echo"] == ping, echo
    refused(web)  # port 80 is not the entry's
    # the tunnel's bytes both ways (its line is written once it closes: by the last reading)
    last = rt.usage().egress
    assert counted is not None and last is not None and last.denied == 1, (counted, last)
    assert last.allowed == 1 and last.bytes_sent >= len(ping) <= last.bytes_received, last


# ----- 4. published ports -----------------------------------------------------------------


def test_published_port_answers_and_opens_no_way_out(listed: Runtime) -> None:
    started = listed.execute(
        "setsid python3 -m http.server 8000 --bind 0.0.0.0 >/tmp/http.log 2>&1 </dev/null &",
        timeout=20,
    )
    assert started.exit_code == 0, started
    [port] = listed.info().ports
    assert (port.service, port.container, port.protocol) == ("main", 8000, "tcp"), port
    deadline = time.monotonic() + 20
    while True:
        try:
            url = f"http://127.0.0.1:{port.host}/"
            with urllib.request.urlopen(url, timeout=5) as answer:
                assert answer.status == 200
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    denied, direct, by_name = probe(
        listed,
        get("http://denied.test/"),
        get("http://denied.test/", proxy=False, timeout=2),
        resolve("denied.test"),
    )
    refused(denied)
    failed(direct)
    failed(by_name)
    ps = subprocess.run([*CLI, "ps", "--json"], capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0, ps.stderr
    [row] = [r for r in json.loads(ps.stdout) if r["id"] == listed.info().id]
    shown = [(p["service"], p["container"], p["host"]) for p in row["ports"]]
    assert shown == [("main", 8000, port.host)], row


# ----- 5. the gateway is out of the sandbox's reach ---------------------------------------


def test_sandbox_cannot_reach_the_proxys_cache_manager(listed: Runtime) -> None:
    info, menu, cache_object = probe(
        listed,
        get(f"http://{GATEWAY}:3128/squid-internal-mgr/info"),  # NO_PROXY: straight to it
        via_proxy(f"GET http://{GATEWAY}:3128/squid-internal-mgr/menu HTTP/1.0\r\n\r\n", body=True),
        via_proxy(f"GET cache_object://{GATEWAY}/info HTTP/1.0\r\n\r\n", body=True),
    )
    assert info["error"] is None and info["status"] == 403, info
    for answer in (menu, cache_object):
        assert answer["error"] is None and " 403 " in answer["status_line"], answer
    for text in (info["body"], menu["body"], cache_object["body"]):
        assert "Squid Object Cache" not in text and "File descriptor usage" not in text, text


def test_sandbox_root_has_no_net_admin_and_no_rules_file(listed: Runtime) -> None:
    status = listed.execute("cat /proc/self/status", user="root", timeout=20).stdout
    cap_eff = int(next(ln for ln in status.splitlines() if ln.startswith("CapEff:")).split()[1], 16)
    assert cap_eff, status  # root, with the usual capabilities: a real reading
    assert not cap_eff & (1 << 12), f"NET_ADMIN is in the sandbox's effective set: {status}"
    route = listed.execute("ip route add 10.99.0.0/16 dev eth0", user="root", timeout=20)
    assert route.exit_code != 0, route  # no `ip`, or not permitted
    # the rules (generated: an ACL line per entry) exist only in the gateway
    needles = ["Generated by orchestrator " + "from network.egress", "orch_e0 " + "dstdomain"]
    control = "VERSION_CODENAME="  # in the image's os-release: the search does find files
    [found] = probe(listed, {"op": "search", "needles": [*needles, control]}, user="root")
    assert found["error"] is None and found["found"][control], found
    assert all(found["found"][n] == [] for n in needles), found
    gone = listed.execute("test -e /etc/orchestrator-gateway/rules", timeout=20)
    assert gone.exit_code == 1


def test_proxy_stays_healthy_after_a_flood_of_denied_requests(listed: Runtime) -> None:
    storm, denied, allowed = probe(
        listed,
        {"op": "flood", "url": "http://denied.test/", "n": 200},
        get("http://denied.test/"),
        get("http://allowed.test/"),
    )
    assert storm["error"] is None and storm["seen"] == {"403": 200}, storm
    refused(denied)
    ok(allowed, hello("allowed.test"))


# ----- 6. per service ---------------------------------------------------------------------


def gateway_ip(rt: Runtime, network: str) -> str:
    """The gateway container's address on the environment's network `network`."""
    project = rt.info().id
    mine = ["--filter", f"label=com.docker.compose.project={project}"]
    mine += ["--filter", f"label=com.docker.compose.service={GATEWAY}"]
    found = subprocess.run(
        ["docker", "ps", "-q", *mine],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert len(found) == 1, found
    fmt = "{{json .NetworkSettings.Networks}}"
    out = subprocess.run(
        ["docker", "inspect", "--format", fmt, found[0]],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    networks: dict[str, dict[str, Any]] = json.loads(out)
    ips = [n["IPAddress"] for k, n in networks.items() if k == f"{project}_{network}"]
    assert ips and ips[0], networks
    return str(ips[0])


def test_each_service_gets_its_own_egress(world: World, tmp_path: Path) -> None:
    path = service_file(tmp_path, "perservice", "none", ALLOWLIST)
    with spawn_runtime(path) as rt:
        ip = gateway_ip(rt, "proxy")
        web = rt.service("web")
        allowed, denied, reach = probe(
            web, get("http://allowed.test/"), get("http://denied.test/"), connect(ip, 3128)
        )
        by_name, by_ip, outside = probe(
            rt, resolve(GATEWAY), connect(ip, 3128), get("http://allowed.test/", timeout=2)
        )
        main_env = rt.execute("env", timeout=20).stdout
    ok(allowed, hello("allowed.test"))
    refused(denied)
    assert reach["error"] is None, reach  # the address is right: web reaches it
    failed(by_name)
    failed(by_ip)
    failed(outside)
    assert "proxy" not in main_env.lower(), main_env


# ----- 7. the caller's policy -------------------------------------------------------------


def test_caller_policy_none_closes_an_allowlist(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_EGRESS", "none")
    path = env_file(tmp_path, "policynone", f"network: {{egress: {ALLOWLIST}}}\n")
    with spawn_runtime(path) as rt:
        allowed, by_name, proxied = probe(
            rt,
            get("http://allowed.test/", timeout=2),
            resolve("allowed.test"),
            resolve(GATEWAY),  # no gateway at all
        )
        env = rt.execute("env", timeout=20).stdout
    failed(allowed)
    failed(by_name)
    failed(proxied)
    assert "proxy" not in env.lower(), env


def test_caller_policy_narrows_all_to_its_entries(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_EGRESS", "allowed.test")
    path = env_file(tmp_path, "policynarrow", "network: {egress: all}\n")
    with spawn_runtime(path) as rt:
        allowed, denied, direct = probe(
            rt,
            get("http://allowed.test/"),
            get("http://denied.test/"),
            get("http://denied.test/", proxy=False, timeout=2),
        )
    ok(allowed, hello("allowed.test"))
    refused(denied)
    failed(direct)


# ----- 8. one gateway, one allowlist -------------------------------------------------------


def test_two_allowlists_in_one_environment_are_refused(world: World, tmp_path: Path) -> None:
    path = service_file(tmp_path, "twolists", "[allowed.test]", "[denied.test]")
    before = labelled_ids()
    with pytest.raises(SpecError) as raised:
        spawn_runtime(path)
    assert "services.web.egress" in str(raised.value), raised.value
    assert any(i.field == "services.web.egress" for i in raised.value.issues), raised.value
    assert labelled_ids() <= before  # nothing of it is left, running or not


def test_the_gateway_and_the_forwarder_never_route(listed: Runtime) -> None:
    """Both join a routed network; a sandbox allowed raw sockets (NET_RAW, which a file may
    ask for) could send them frames for an outside address. Neither may forward them."""
    project = listed.info().id
    for service in (GATEWAY, "orchestrator-ports"):
        for knob in ("ipv4/ip_forward", "ipv4/conf/all/forwarding", "ipv6/conf/all/forwarding"):
            read = subprocess.run(
                ["docker", "exec", f"{project}-{service}-1", "cat", f"/proc/sys/net/{knob}"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert (read.returncode, read.stdout.strip()) == (0, "0"), (service, knob, read)
