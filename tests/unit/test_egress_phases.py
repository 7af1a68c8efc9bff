"""Egress by phase (`setup.egress`) and on a running environment (`set_egress`), as far as
it is pure: what a phased file compiles to, what each backend refuses, which changes take
something away (and so cut what is open), and the rules a change writes."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.backends.docker.egress_change import CHANGING, PROBE, marked, now
from orchestrator.backends.docker.network import (
    FRONT_UID_FILE,
    GATEWAY,
    PROXY_PORT,
    PROXY_URL,
    RULES_FILE,
    gateway_rules,
)
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.errors import SpecError
from orchestrator.spec.egress import parse, takes_away
from orchestrator.spec.loader import load_environment_text
from orchestrator.spec.policy import Policy
from tests.unit.test_egress import BASE, compiled

PHASED = BASE + "setup: {egress: [pypi.test], commands: ['true']}\n"


def test_a_phased_sandbox_reaches_out_only_through_the_gateway_whose_rules_are_the_runs(
    tmp_path: Path,
) -> None:
    """`egress: none` after setup: the sandbox still goes through the gateway (setup needs
    it), and the rules the gateway starts with let nothing through: a start, a wake or a
    render that never runs setup holds the sandbox to network.egress."""
    doc, c = compiled(PHASED, tmp_path)
    main = doc["services"]["main"]
    assert c.infra == (GATEWAY,) and c.proxied == ("main",)
    assert main["environment"]["HTTPS_PROXY"] == PROXY_URL and main["dns"] == ["127.0.0.1"]
    assert main.get("network_mode") != "none"
    assert c.files[RULES_FILE] == gateway_rules("none")
    assert "http_access allow" not in c.files[RULES_FILE]
    assert c.egress == {"main": "none"}


def test_all_after_setup_goes_through_the_gateway_too(tmp_path: Path) -> None:
    doc, c = compiled(PHASED + "network: {egress: all}\n", tmp_path)
    assert c.proxied == ("main",)
    assert "egress" not in doc["services"]["main"].get("networks", [])  # no routed network
    assert c.files[RULES_FILE] == gateway_rules("all")


def test_a_setup_egress_equal_to_the_files_changes_nothing(tmp_path: Path) -> None:
    text = BASE + "network: {egress: none}\nsetup: {egress: none, commands: ['true']}\n"
    doc, c = compiled(text, tmp_path)
    assert c.infra == () and doc["services"]["main"]["network_mode"] == "none"


def test_the_callers_policy_narrows_setup_saying_so(tmp_path: Path) -> None:
    text = BASE + "setup: {egress: [pypi.test, evil.test], commands: ['true']}\n"
    _, c = compiled(text, tmp_path, policy=Policy(egress=["pypi.test"]))
    assert any(w.startswith("setup.egress: evil.test not allowed") for w in c.warnings)
    _, closed = compiled(text, tmp_path, policy=Policy(egress="none"))
    assert closed.infra == ()  # nothing for setup either: no gateway at all


def test_a_service_sharing_the_gateway_is_refused_naming_both(tmp_path: Path) -> None:
    text = PHASED + "services:\n  web: {image: w, egress: [a.test]}\n"
    with pytest.raises(SpecError, match=r"setup\.egress") as caught:
        compiled(text, tmp_path)
    assert "services.web.egress" in str(caught.value)
    # a service with none (or all) never shares its rules: fine
    compiled(PHASED + "services:\n  db: {image: d, egress: none}\n", tmp_path)


def test_a_sandbox_without_a_bridge_network_refuses_setup_egress(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"setup\.egress"):
        compiled(PHASED + "network: {mode: none}\n", tmp_path)


def test_swarm_and_local_refuse_setup_egress(tmp_path: Path) -> None:
    from orchestrator.backends.local import LocalRuntime

    env = load_environment_text(PHASED, base_dir=tmp_path)
    with pytest.raises(SpecError, match=r"setup\.egress"):
        compile_stack(env, StackOptions(project="orch-eg-1", labels={}))
    local = load_environment_text(
        PHASED.replace("image: img\n", "backend: local\n"), base_dir=tmp_path
    )
    with pytest.raises(SpecError, match=r"setup\.egress"):
        LocalRuntime.check(local, Policy())


def test_a_bad_setup_entry_names_its_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"setup\.egress"):
        load_environment_text(BASE + "setup: {egress: ['a b']}\n", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("old", "new", "cut"),
    [
        ("none", "all", False),
        ("none", ["a.test"], False),
        (["a.test"], ["a.test", "b.test"], False),
        (["a.test:443"], ["a.test"], False),  # (a name's default ports hold 443)
        (["*.a.test"], ["x.a.test"], True),
        (["x.a.test"], ["*.a.test"], False),
        (["a.test"], ["b.test"], True),
        (["a.test"], "none", True),
        ("all", ["a.test"], True),
        ("all", "all", False),
        (["10.0.0.0/8"], ["10.1.0.0/16"], True),
    ],
)
def test_what_takes_something_away(old: object, new: object, cut: bool) -> None:
    assert takes_away(parse(old), parse(new)) is cut  # type: ignore[arg-type]


NAMES = st.lists(st.sampled_from(["a.test", "b.test", "*.a.test", "a.test:7000"]), max_size=4)


@given(NAMES, NAMES)
def test_a_change_that_takes_nothing_away_keeps_every_entry(old: list[str], new: list[str]) -> None:
    before, after = parse(old), parse(new)
    if not takes_away(before, after) and isinstance(before, tuple):
        assert isinstance(after, tuple)
        assert all(any(n.covers(o) for n in after) for o in before)


def test_a_changes_rules_answer_its_marker_first_and_nothing_else_does() -> None:
    text = marked(parse(["a.test"]), "00ff")
    first, *_ = [line for line in text.splitlines() if line.startswith("http_access")]
    assert first == "http_access deny orch_phase"
    assert "orch-phase-00ff.invalid" in text and "deny_info 404:" in text
    assert "http_access allow orch_e0" in text
    for held in ("none", "all"):
        assert "404" not in gateway_rules(parse(held))


def test_what_holds_now_is_read_back_or_taken_as_all(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    assert now(tmp_path, "a.test, b.test:7000") == parse(["a.test", "b.test:7000"])
    assert now(tmp_path, "") == "all"  # nothing known: the safe guess cuts
    (tmp_path / "gateway" / "egress").write_text("none\n")
    assert now(tmp_path, "all") == "none"
    (tmp_path / "gateway" / "egress").write_text("not an entry!\n")
    assert now(tmp_path, "none") == "all"


def test_none_and_all_stand_alone() -> None:
    """`orchestrator egress ID none,example.com` took `none` for a host's name."""
    for value in (["none", "a.test"], ["ALL"]):
        with pytest.raises(ValueError, match="stand alone"):
            parse(value)


def test_a_change_in_progress_is_read_as_all(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "egress").write_text(CHANGING)
    assert now(tmp_path, "none") == "all"


class FakeGateway(http.server.BaseHTTPRequestHandler):
    """Answers the probe's marker with 404, and the cache manager as `MANAGER` says."""

    manager: ClassVar[tuple[int, str]] = (200, "")

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.end_headers()

    def do_GET(self) -> None:
        code, body = self.manager
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def _self(port: int) -> str:
    return f"Connection: 0x1\n\tremote: 127.0.0.1:{port}\n\tlocal: 127.0.0.1:3128\nuri x\n"


@pytest.mark.parametrize(
    ("manager", "said"),
    [
        ((200, _self(1) + "Connection: 0x2\n\tremote: 10.0.0.2:5\n" * 2), "2"),
        ((200, _self(1)), "0"),
        ((502, ""), "unknown"),  # the manager did not answer: everything is cut
        ((200, "Connection: 0x2\n\tremote: 10.0.0.2:5\n"), "unknown"),  # not the whole list
    ],
)
def test_what_is_open_is_counted_or_said_unknown(
    manager: tuple[int, str], said: str, tmp_path: Path
) -> None:
    """The probe a change runs in the gateway (bash), against a stand-in on this machine's
    loopback: it counts the clients' open requests only from a whole answer that lists the
    asking request itself; anything else is "unknown", which cuts."""
    assert _probe(manager, tmp_path, uid=4_000_000_000) == said  # (a user with no socket)


def test_every_socket_of_the_fronts_user_counts_as_open(tmp_path: Path) -> None:
    """The plain-HTTP front's connections are counted by its user's TCP sockets, whatever
    their state: here this process's user, which holds at least the two ends of one."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as held:
        accepted, _ = listener.accept()
        with accepted:
            said = _probe((200, _self(1)), tmp_path, uid=os.getuid())
        assert held.fileno() >= 0
    assert said.isdigit() and int(said) >= 2, said
    missing = tmp_path / "gone"  # no user file: not known, which cuts
    assert _probe((200, _self(1)), missing, uid=None) == "unknown"
    (tmp_path / "front.uid").write_text("\n")  # nor one that names no user
    assert _probe((200, _self(1)), tmp_path, uid=None) == "unknown"


def _probe(manager: tuple[int, str], folder: Path, uid: int | None) -> str:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    uid_file = folder / "front.uid"
    if uid is not None:
        uid_file.write_text(f"{uid}\n")
    FakeGateway.manager = manager
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeGateway)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        script = PROBE.replace(f"/{PROXY_PORT}", f"/{port}").replace(FRONT_UID_FILE, str(uid_file))
        done = subprocess.run(
            [bash, "-c", script, "probe", "00ff", "20", "open"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_lock_file_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    """(paths.locked_file: egress changes, memory saves) Two holders of one lock go one
    after the other; one whose other never lets go fails, saying so, instead of waiting
    forever; a link in the lock file's place is refused, never followed."""
    import fcntl
    import os
    import time

    from orchestrator.errors import OrchestratorError
    from orchestrator.paths import locked_file

    path = tmp_path / ".lock"
    held = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    started = time.monotonic()
    busy = "orch-x-1: another change of its egress"
    with pytest.raises(OrchestratorError, match=busy), locked_file(path, 0.3, busy):
        pass
    assert time.monotonic() - started < 2
    os.close(held)  # (its lock goes with it)
    with locked_file(path, 0.3, "busy"):
        pass
    target = tmp_path / "elsewhere"
    link = tmp_path / "linked.lock"
    link.symlink_to(target)
    with pytest.raises(OSError), locked_file(link, 0.3, "busy"):
        pass
    assert not target.exists()
