"""Egress by phase (issue 41, item 1), against the real engine and the hermetic test world:
setup reaches its package host and the agent after it cannot; a tunnel setup left open is
cut when setup ends; `set_egress` narrows and widens a running sandbox at once, cutting an
open tunnel to a host it takes away (and only then); the caller's policy bounds every phase;
`orchestrator egress` does the same from the shell."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, UsageError, aio, spawn_runtime
from orchestrator.testing.world import World
from tests.conftest import BUSYBOX_IMAGE, labelled_ids
from tests.docker.test_egress import (
    env_file,
    get,
    hello,
    module_dir,
    ok,
    probe,
    refused,
    tunnel,
    via_proxy,
    world,
)

pytestmark = pytest.mark.docker
__all__ = ["module_dir", "world"]  # (the fixtures this module shares)

CLI = [sys.executable, "-m", "orchestrator"]
STATE = "/tmp/tunnel"

HOLD = r"""
import socket, sys, time
target = sys.argv[1]
def say(what):
    with open("/tmp/tunnel.new", "w") as f:
        f.write(what)
    import os; os.replace("/tmp/tunnel.new", "/tmp/tunnel")
def ask():
    s = socket.create_connection(("orchestrator-egress", 3128), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        part = s.recv(4096)
        if not part:
            break
        head += part
    return s, head
end = time.monotonic() + 40
while True:  # (a gateway that reads its rules again, or restarts, answers nothing a while)
    try:
        s, head = ask()
        if head or time.monotonic() > end:
            break
        s.close()
    except OSError:
        if time.monotonic() > end:
            raise
    time.sleep(0.5)
if b" 200 " not in head.split(b"\r\n")[0] + b" ":
    say("refused " + head[:40].decode(errors="replace"))
    sys.exit()
say("open")
s.settimeout(20)  # (a round trip on a busy machine: only an end says cut)
while True:
    try:
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise OSError("closed")
    except OSError:
        say("cut")
        break
    time.sleep(0.1)
"""
"""Run in a sandbox, in the background: hold a CONNECT tunnel to argv[1] through the gateway,
a round trip every tenth of a second through the world's echo server; /tmp/tunnel says
open, then cut once the tunnel ends (or refused)."""


def start_holder(target: str) -> str:
    """The shell command that starts HOLD in the background and waits until it says."""
    code = base64.b64encode(HOLD.encode()).decode()
    return (
        f"rm -f {STATE}; echo {code} | base64 -d > /tmp/hold.py; "
        f"(setsid nohup python3 /tmp/hold.py {target} >/dev/null 2>&1 &); "
        f"for _ in $(seq 600); do [ -s {STATE} ] && break; sleep 0.1; done; cat {STATE}"
    )


def tunnel_state(rt: Runtime, want: str, within: float = 8) -> str:
    """The holder's state, once it says `want` (or what it says after `within` seconds)."""
    deadline = time.monotonic() + within
    while True:
        said = rt.execute(f"cat {STATE}").stdout.strip()
        if said == want or time.monotonic() > deadline:
            return said
        time.sleep(0.2)


SETUP = f"""\
network: {{egress: none}}
setup:
  egress: [allowed.test, "allowed.test:7000"]
  commands:
    - python3 -c "import urllib.request as u; open('got', 'w').write(u.urlopen('http://allowed.test/', timeout=30).read().decode())"
    - {start_holder("allowed.test:7000")!r}
"""  # noqa: E501


def test_setup_reaches_its_host_the_agent_after_it_cannot_and_setups_tunnel_is_cut(
    world: World, tmp_path: Path
) -> None:
    with spawn_runtime(env_file(tmp_path, "phased", SETUP)) as rt:
        assert rt.setup_result is not None and "open" in rt.setup_result.stdout
        assert rt.read_file("got") == hello("allowed.test")  # setup reached its host
        assert tunnel_state(rt, "cut") == "cut"  # what setup left open went with it
        after, again = probe(rt, get("http://allowed.test/"), get("https://allowed.test/"))
        refused(after)  # the agent's phase: network.egress none, through the gateway
        assert again["error"] is not None and "403" in again["error"], again
        denied = rt.execute(start_holder("allowed.test:7000")).stdout
        assert denied.startswith("refused"), denied


def test_set_egress_narrows_and_widens_a_running_sandbox_cutting_only_what_it_takes_away(
    world: World, tmp_path: Path
) -> None:
    body = 'network: {egress: [allowed.test, "allowed.test:7000"]}\n'
    with spawn_runtime(env_file(tmp_path, "live", body)) as rt:
        assert rt.execute(start_holder("allowed.test:7000")).stdout == "open"
        # widening keeps every tunnel
        widened = rt.set_egress(["allowed.test", "allowed.test:7000", "denied.test"])
        assert widened == "allowed.test, allowed.test:7000, denied.test"
        [reached] = probe(rt, get("http://denied.test/"))
        ok(reached, hello("denied.test"))
        time.sleep(0.5)
        assert tunnel_state(rt, "open", within=0) == "open"
        # narrowing cuts the tunnel to what it took away, and refuses it from then on
        assert rt.set_egress(["denied.test"]) == "denied.test"
        assert tunnel_state(rt, "cut") == "cut"
        lost, kept = probe(rt, get("http://allowed.test/"), get("http://denied.test/"))
        refused(lost)
        ok(kept, hello("denied.test"))
        assert rt.set_egress("none") == "none"
        [closed] = probe(rt, get("http://denied.test/"))
        refused(closed)
        # usage still counts across the gateway's restart, and says it is short: the tunnel
        # the restart cut was never logged
        counted = rt.usage().egress
        assert counted is not None and counted.allowed >= 2 and not counted.complete


def test_the_callers_policy_bounds_setup_and_set_egress(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_EGRESS", "allowed.test")
    fetch = (
        'python3 -c "import urllib.request as u, urllib.error as e\n'
        "for h in ('allowed.test', 'denied.test'):\n"
        "  try: print(h, u.urlopen('http://' + h + '/', timeout=30).status)\n"
        '  except e.HTTPError as x: print(h, x.code)"'
    )
    body = f"setup:\n  egress: [allowed.test, denied.test]\n  commands: [{json.dumps(fetch)}]\n"
    with spawn_runtime(env_file(tmp_path, "bounded", body)) as rt:
        assert rt.setup_result is not None
        assert rt.setup_result.stdout.split("\n")[:2] == ["allowed.test 200", "denied.test 403"]
        assert any(w.startswith("setup.egress: denied.test not allowed") for w in rt.warnings)
        assert rt.set_egress(["denied.test"]) == "none"  # the caller's policy: nothing
        assert any("set_egress: denied.test not allowed" in w for w in rt.warnings)
        assert rt.set_egress("all") == "allowed.test"  # all, narrowed to the policy
        [through] = probe(rt, get("http://allowed.test/"))
        ok(through, hello("allowed.test"))


def test_set_egress_refuses_where_there_is_no_gateway_and_bad_entries(
    world: World, tmp_path: Path
) -> None:
    closed = env_file(tmp_path, "closed", "")
    with spawn_runtime(closed) as rt, pytest.raises(UsageError, match="no egress gateway"):
        rt.set_egress(["allowed.test"])
    with spawn_runtime(env_file(tmp_path, "listed", "network: {egress: [allowed.test]}\n")) as rt:
        with pytest.raises(UsageError, match="not an allowlist entry"):
            rt.set_egress(["allowed.test", "a b"])
        [still] = probe(rt, get("http://allowed.test/"))  # nothing changed
        ok(still, hello("allowed.test"))


def test_aio_and_the_cli_change_egress(world: World, tmp_path: Path) -> None:
    import asyncio

    path = env_file(tmp_path, "shell", "network: {egress: [allowed.test]}\n")
    before = labelled_ids()
    up = subprocess.run([*CLI, "up", str(path)], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        got = subprocess.run(
            [*CLI, "egress", ident, "denied.test,allowed.test"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == f"{ident}: egress allowed.test, denied.test"
        bad = subprocess.run(
            [*CLI, "egress", ident, "nope!"], capture_output=True, text=True, timeout=120
        )
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        assert "not an allowlist entry" in bad.stderr

        async def narrow() -> str:
            async with await aio.attach(ident) as rt:
                return await rt.set_egress("none")

        assert asyncio.run(narrow()) == "none"
        # leaving `async with` of an attached one left it running, as `with` does
        alive = subprocess.run(
            [*CLI, "exec", ident, "--", "true"], capture_output=True, text=True, timeout=120
        )
        assert alive.returncode == 0, alive.stderr
    finally:
        subprocess.run([*CLI, "down", ident], capture_output=True, timeout=300)
    assert labelled_ids() <= before


# ----- attacks (a hostile review of set_egress) ----------------------------------------------


def test_the_gateway_itself_is_never_a_destination_whatever_an_entry_says(
    world: World, tmp_path: Path
) -> None:
    """An entry for the gateway's own loopback let a sandbox tunnel from the gateway to
    itself: its requests then came from 127.0.0.1, as the gateway's own do (the cache
    manager's, whose answer says what a narrowing must cut), and spent 127.0.0.1's
    connection budget until that answer failed. Such a tunnel is refused."""
    body = 'network: {egress: ["127.0.0.1:3128", "0.0.0.0/8", allowed.test]}\n'
    with spawn_runtime(env_file(tmp_path, "itself", body)) as rt:
        results = probe(
            rt,
            tunnel("127.0.0.1:3128"),
            tunnel("0.0.0.0:3128"),
            tunnel("127.0.0.2:3128"),
            via_proxy(
                "GET http://127.0.0.1:3128/squid-internal-mgr/active_requests HTTP/1.0\r\n\r\n",
                body=True,
            ),
        )
        for answer in results:
            assert answer["error"] is None and " 403 " in answer["status_line"], answer
        [through] = probe(rt, get("http://allowed.test/"))  # (the list works otherwise)
        ok(through, hello("allowed.test"))


def test_a_change_that_died_half_way_makes_the_next_narrowing_cut(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change killed after Squid took its rules, before it wrote what holds, left the old
    value on record: the next narrowing took the host it removes for one never allowed, and
    cut nothing. What holds is recorded as unknown until a change is done."""
    from orchestrator.backends.container.engine.containers import ContainerOps

    body = "network: {egress: [allowed.test]}\n"
    with spawn_runtime(env_file(tmp_path, "halfway", body)) as rt:
        signal = ContainerOps.signal

        def dies(self: ContainerOps, container: str, sig: str, *, action: str) -> None:
            signal(self, container, sig, action=action)
            raise KeyboardInterrupt  # (the caller killed after its HUP)

        monkeypatch.setattr(ContainerOps, "signal", dies)
        with pytest.raises(KeyboardInterrupt):
            rt.set_egress(["allowed.test", "denied.test:7000"])
        monkeypatch.undo()
        assert tunnel_state_after(rt, start_holder("denied.test:7000")) == "open"
        assert rt.set_egress(["allowed.test"]) == "allowed.test"
        assert tunnel_state(rt, "cut") == "cut"


def tunnel_state_after(rt: Runtime, command: str) -> str:
    """What the holder says once `command` (start_holder) ran, its first word."""
    return rt.execute(command, timeout=120).stdout.split(" ")[0]


def test_set_egress_works_on_a_paused_environment_and_names_what_it_cannot_change(
    world: World, tmp_path: Path
) -> None:
    """A harness cuts a paused agent's egress before it lets it run again; a service with
    `egress: all` (outside the gateway, which the sandbox can reach) is named."""
    body = (
        "network: {egress: [allowed.test]}\n"
        f"services:\n  relay: {{image: {BUSYBOX_IMAGE}, command: [sleep, '600'], egress: all}}\n"
    )
    with spawn_runtime(env_file(tmp_path, "pausedeg", body)) as rt:
        rt.pause()
        assert rt.set_egress("none") == "none"
        rt.resume()
        [closed] = probe(rt, get("http://allowed.test/"))
        refused(closed)
        assert any(w.startswith("set_egress: services relay reach outside") for w in rt.warnings)


LOOP = r"""
import time, urllib.request
while True:
    try:
        urllib.request.urlopen("http://allowed.test/echo", timeout=5).read()
    except Exception:
        pass
    time.sleep(0.02)
"""


@pytest.mark.parametrize("tunnel", [False, True], ids=["gets", "gets-and-a-tunnel"])
def test_the_last_count_holds_what_the_sandbox_did_until_it_went(
    world: World, tmp_path: Path, tunnel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Found by two hostile reviews) Squid logs a tunnel once it ends, and the last count
    was read while the sandbox still ran: a tunnel open then, and requests begun after it,
    were never counted, while the count said it was whole. It is read again once the
    sandbox is gone and before its gateway goes: whole, it holds every request the world's
    server saw (a loop of GETs until the last moment; a tunnel held open to the end, which
    the gateway may still hold then: the count then says it is short)."""
    from orchestrator.backends.docker.runtime import ComposeRuntime

    asked_early: list[int] = []  # the last reading's own question, which the recount makes

    def held(_: ComposeRuntime) -> bool:
        asked_early.append(1)
        return True

    monkeypatch.setattr(ComposeRuntime, "_egress_held", held)
    body = 'network: {egress: [allowed.test, "allowed.test:7000"]}\n'
    with spawn_runtime(env_file(tmp_path, f"counted{int(tunnel)}", body)) as rt:
        echoed = len(world.requests("allowed.test"))
        if tunnel:
            assert rt.execute(start_holder("allowed.test:7000")).stdout == "open"
        before = rt.usage().egress  # (asked: the last reading counts egress)
        assert before is not None, before
        rt.write_file("/tmp/loop.py", LOOP)
        rt.execute("setsid python3 /tmp/loop.py >/dev/null 2>&1 </dev/null &", check=True)
        time.sleep(2)
    last = rt.usage()
    seen = len(world.requests("allowed.test")) - echoed
    assert last.final and last.egress is not None and seen > 0, (last, seen)
    # whole, it is exact: every GET the server saw, and the tunnel (one under way as the
    # sandbox went may be held open by the gateway a while: then it says it is short)
    counted = last.egress.allowed - before.allowed
    assert not last.egress.complete or counted == seen + tunnel, (before, last.egress, seen)
    assert not asked_early  # (asked once, by the recount: one exec in the gateway, not two)


def test_the_last_count_of_a_gateway_gone_already_says_it_is_short_at_once(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that cannot say what it holds (gone before the removal: killed here) is
    asked once, and the count says it is short: the recount asked again until its 5 s were
    out, for an answer that could not come."""
    from orchestrator.backends.docker import egress_change
    from orchestrator.backends.docker.network import GATEWAY

    asked: list[object] = []
    real = egress_change.open_requests

    def spied(*args: Any, **kwargs: Any) -> int | None:
        said = real(*args, **kwargs)
        asked.append(said)
        return said

    monkeypatch.setattr(egress_change, "open_requests", spied)
    with spawn_runtime(env_file(tmp_path, "gone", "network: {egress: [allowed.test]}\n")) as rt:
        assert rt.usage().egress is not None  # (asked: the removal counts again)
        gateway = rt.project.container_of(GATEWAY)  # type: ignore[attr-defined]
        subprocess.run(["docker", "kill", gateway], check=True, capture_output=True, timeout=60)
    last = rt.usage()
    assert last.final and last.egress is not None and not last.egress.complete, last
    assert asked == [None]


def test_a_removal_that_fails_before_its_recount_leaves_the_count_short(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Found by a hostile review) The last reading leaves what the gateway holds to the
    recount at removal; a removal that failed before it (the engine's own race under load,
    "unable to remove filesystem") never brought it, and the count said it was whole."""
    from orchestrator.backends.docker import lifecycle
    from orchestrator.errors import DockerError

    def racy(self: lifecycle.Project, before_gateway: object = None) -> None:
        raise DockerError(f"removing project {self.name}: unable to remove filesystem")

    monkeypatch.setattr(lifecycle.Project, "_remove_by_api", racy)
    with spawn_runtime(env_file(tmp_path, "rmfail", "network: {egress: [allowed.test]}\n")) as rt:
        assert rt.usage().egress is not None  # (asked: the removal counts again)
    last = rt.usage()
    assert last.final and last.egress is not None and not last.egress.complete, last
