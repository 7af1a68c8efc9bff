"""Admission by capacity (issue 26, item 3): the ledger's rules (budget math, a fair queue,
dead holders dropped, hostile ticket files), then real spawns on the local backend, from
threads and from two processes, never over the budget."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from subprocess import Popen

import pytest

from orchestrator import AdmissionTimeout, OrchestratorError, UsageError, settings, spawn_runtime
from orchestrator.sandbox.backend import Amounts, request
from orchestrator.services import admission
from orchestrator.services.ledger import TICKET_MAX, Ledger, process_start
from orchestrator.spec.loader import Environment, load_environment_text

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(autouse=True)
def own_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own state folder (its own ledger) and a small budget."""
    state = tmp_path / "state"
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    monkeypatch.setenv("ORCHESTRATOR_MAX_MEMORY", "256m")
    monkeypatch.setenv("ORCHESTRATOR_MAX_CPUS", "4")
    for name in ("ADMISSION", "DEFAULT_MEMORY", "DEFAULT_CPUS", "ADMISSION_TIMEOUT"):
        monkeypatch.delenv(f"ORCHESTRATOR_{name}", raising=False)
    return state / "admission"


def env(
    memory: str | None = "64m", *, cpus: float | None = None, services: str = ""
) -> Environment:
    res = ", ".join(
        [f"memory: {memory}"] * (memory is not None) + [f"cpus: {cpus}"] * (cpus is not None)
    )
    text = f"version: 1\nname: adm\nbackend: local\nresources: {{{res}}}\n{services}"
    return load_environment_text(text, source="adm.yaml")


def hold(memory: int, *, name: str = "held") -> admission.Admission:
    """An admission taken at once by this process (as a spawn's)."""
    ledger = Ledger()
    ticket = dataclasses.replace(ledger.enqueue(memory, 0.0, name), admitted=True)
    ledger.write(ticket)
    return admission.Admission(ledger, ticket)


def plant(folder: Path, name: str, data: dict[str, object] | bytes) -> Path:
    (folder / "tickets").mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / "tickets" / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def ticket_data(pid: int, memory: int, **more: object) -> dict[str, object]:
    return {
        "seq": 1,
        "pid": pid,
        "start": process_start(pid) or "1",
        "memory": memory,
        "cpus": 0.0,
        "env": "planted",
        "admitted": True,
        "anchor": "",
        **more,
    }


# ----- budget math ------------------------------------------------------------------------
def test_a_request_sums_the_main_sandbox_and_its_services_with_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services = (
        "services:\n  db: {image: x, resources: {memory: 32m, cpus: 0.5}}\n  web: {image: y}\n"
    )
    assert request(env("64m", cpus=1, services=services)) == Amounts(
        (64 + 32 + 1024) * MiB,
        2.5,  # web: the default limits, 1g and one CPU
    )
    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_MEMORY", "100m")
    monkeypatch.setenv("ORCHESTRATOR_DEFAULT_CPUS", "1")
    assert request(env(None)) == Amounts(100 * MiB, 1.0)


def test_the_default_budget_is_a_share_of_host_memory_and_no_bound_on_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPU limits are ceilings on shared time: counted, bounded only where the caller says.
    Bounded by default (4 x the host's), a file with a few services and the default 1 CPU
    each took the whole budget of a 2-CPU host, and every other spawn waited 600 s."""
    monkeypatch.delenv("ORCHESTRATOR_MAX_MEMORY")
    monkeypatch.delenv("ORCHESTRATOR_MAX_CPUS")
    got = admission.budget()
    assert got.memory == int(settings.host_memory() * 0.75) > 0
    assert got.cpus == float("inf")


@pytest.mark.parametrize("value", ["lots", "0", "-1g", "1e400g"])
def test_a_bad_budget_names_the_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_MAX_MEMORY", value)
    with pytest.raises(UsageError, match="ORCHESTRATOR_MAX_MEMORY must be a size"):
        admission.admit(env())


def test_a_request_over_the_whole_budget_fails_at_once_and_queues_nothing(
    own_ledger: Path,
) -> None:
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"more than this host admits at once.*MAX_MEMORY"):
        admission.admit(env("300m"))
    with pytest.raises(UsageError, match="5 CPUs"):
        admission.admit(env("6m", cpus=5))
    assert time.monotonic() - started < 1
    assert not (own_ledger / "tickets").exists() or not os.listdir(own_ledger / "tickets")


def test_admission_off_touches_no_ledger(own_ledger: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ADMISSION", "0")
    assert admission.admit(env("300m")) is None
    assert not own_ledger.exists()


# ----- the queue --------------------------------------------------------------------------
def test_a_large_request_is_not_overtaken_by_small_ones() -> None:
    held = [hold(64 * MiB) for _ in range(3)]  # 192 of 256 MiB
    order: list[str] = []

    def ask(name: str, memory: str) -> None:
        got = admission.admit(env(memory), wait=10)
        order.append(name)
        assert got is not None

    def tickets(count: int) -> None:
        """Wait until the ledger holds `count` tickets: a thread started on a busy machine
        may take its place in the queue late."""
        deadline = time.monotonic() + 30
        while (found := len(Ledger().snapshot())) != count:
            assert time.monotonic() < deadline, f"{found} tickets, not {count}, after 30 s"
            time.sleep(0.02)

    big = threading.Thread(target=ask, args=("big", "128m"))
    big.start()
    tickets(4)  # the big one is at the head of the queue
    small = threading.Thread(target=ask, args=("small", "64m"))  # would fit now: must wait
    small.start()
    tickets(5)
    time.sleep(0.5)  # time for the small one to overtake, were it let
    assert order == []
    held[0].release()  # 128 admitted: room for the big one, then none for the small
    big.join(30)
    assert order == ["big"]
    time.sleep(0.3)
    assert order == ["big"]
    held[1].release()
    small.join(30)
    assert order == ["big", "small"]
    assert sum(t.memory for t in admission.admitted()) == 256 * MiB


def test_a_wait_past_its_deadline_says_what_holds_the_budget(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = [hold(128 * MiB, name="busy") for _ in range(2)]
    monkeypatch.setenv("ORCHESTRATOR_ADMISSION_TIMEOUT", "0.5")
    caplog.set_level(logging.INFO, logger=admission.ADMISSION_LOG)
    with pytest.raises(AdmissionTimeout) as caught:
        admission.admit(env("64m"))
    message = str(caught.value)
    assert "within 0.5 s" in message and "0.25 GiB of memory" in message
    assert "busy x2" in message and "ORCHESTRATOR_MAX_MEMORY" in message
    assert isinstance(caught.value, TimeoutError)
    assert any(
        "waiting for room: 0 ahead, 0.25 GiB of 0.25 GiB" in r.message for r in caplog.records
    )
    assert len(Ledger().snapshot()) == 2  # its waiting ticket went with it
    for h in held:
        h.release()
    assert Ledger().snapshot() == []


def test_a_dead_process_s_tickets_are_dropped(own_ledger: Path) -> None:
    plant(own_ledger, "000000000001-1-dead", ticket_data(dead_pid(), 256 * MiB))
    got = admission.admit(env(), wait=2)
    assert got is not None
    assert [t.env for t in admission.admitted()] == ["adm"]


def test_a_live_process_s_ticket_holds_until_it_dies(own_ledger: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        plant(own_ledger, "000000000001-x-live", ticket_data(sleeper.pid, 256 * MiB))
        with pytest.raises(AdmissionTimeout):
            admission.admit(env(), wait=0.3)
        reused = ticket_data(sleeper.pid, 256 * MiB, start="1")  # its pid, another start time
        plant(own_ledger, "000000000002-x-reused", reused)
        threading.Timer(0.3, sleeper.kill).start()
        assert admission.admit(env(), wait=5) is not None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_anchor_folder_holds_a_ticket_after_its_owner(own_ledger: Path, tmp_path: Path) -> None:
    projects = tmp_path / "state" / "projects"
    (projects / "orch-a-1").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    plant(
        own_ledger,
        "000000000001-1-a",
        ticket_data(dead_pid(), 192 * MiB, anchor=str(projects / "orch-a-1")),
    )
    plant(own_ledger, "000000000002-1-b", ticket_data(dead_pid(), 64 * MiB, anchor=str(outside)))
    assert [t.memory for t in Ledger().snapshot()] == [192 * MiB]  # outside ours: no anchor
    with pytest.raises(AdmissionTimeout):
        admission.admit(env("128m"), wait=0.3)
    (projects / "orch-a-1").rmdir()  # `down` removed it
    assert admission.admit(env("128m"), wait=2) is not None


# ----- hostile ledger files ---------------------------------------------------------------
def test_hostile_ticket_files_are_dropped_and_never_followed(
    own_ledger: Path, tmp_path: Path
) -> None:
    pid = os.getpid()
    victim = tmp_path / "victim"
    victim.write_text(json.dumps(ticket_data(pid, 256 * MiB)))
    planted = {
        "garbage": b"\x00\xff not json",
        "huge": json.dumps(ticket_data(pid, 256 * MiB, env="x" * (TICKET_MAX + 10))).encode(),
        "list": b"[1, 2]",
        "extra": json.dumps({**ticket_data(pid, 256 * MiB), "more": 1}).encode(),
        "bool-admitted": json.dumps({**ticket_data(pid, 256 * MiB), "admitted": 1}).encode(),
        "bool-pid": json.dumps({**ticket_data(pid, 256 * MiB), "pid": True}).encode(),
        "negative": json.dumps(ticket_data(pid, -(2**40))).encode(),
        "nan-cpus": json.dumps(ticket_data(pid, 0, cpus=float("nan"))).encode(),
        "inf-cpus": json.dumps(ticket_data(pid, 0, cpus=float("inf"))).encode(),
        "string-memory": json.dumps({**ticket_data(pid, 0), "memory": "256m"}).encode(),
    }
    for name, raw in planted.items():
        plant(own_ledger, name, raw)
    (own_ledger / "tickets" / "link").symlink_to(victim)
    os.mkfifo(own_ledger / "tickets" / "fifo")
    (own_ledger / "tickets" / "folder").mkdir()
    (own_ledger / "tickets" / "folder" / "inside").write_text("x")
    (own_ledger / "tickets" / "nested" / "deeper").mkdir(parents=True)
    (own_ledger / "seq").write_text("garbage")
    started = time.monotonic()
    got = admission.admit(env("256m"), wait=2)  # every planted ticket was dropped
    assert got is not None and time.monotonic() - started < 2
    assert sorted(os.listdir(own_ledger / "tickets")) == sorted([got.ticket.name, "nested"])
    assert json.loads(victim.read_text())["memory"] == 256 * MiB  # the link's target untouched
    got.release()


def test_a_ledger_that_is_not_our_private_folder_is_refused(
    own_ledger: Path, tmp_path: Path
) -> None:
    own_ledger.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    own_ledger.symlink_to(elsewhere)
    with pytest.raises(OrchestratorError, match="not a folder of this user"):
        admission.admit(env())
    assert os.listdir(elsewhere) == []
    own_ledger.unlink()
    own_ledger.mkdir(mode=0o755)
    os.chmod(own_ledger, 0o777)
    assert admission.admit(env(), wait=1) is not None
    assert own_ledger.stat().st_mode & 0o777 == 0o700  # made private again
    if os.geteuid() == 0:  # someone else's folder (we can make one only as root)
        os.chown(own_ledger, 65534, 65534)
        with pytest.raises(OrchestratorError, match="not a folder of this user"):
            admission.admit(env())


# ----- real spawns ------------------------------------------------------------------------
def test_twelve_spawns_from_threads_never_exceed_the_budget() -> None:
    alive, peak, admitted_peak, results = 0, 0, 0, []
    lock = threading.Lock()

    def one() -> None:
        nonlocal alive, peak, admitted_peak
        with spawn_runtime(env("64m"), env_vars={"X": "1"}) as rt:
            with lock:
                alive += 1
                peak = max(peak, alive)
            admitted_peak = max(admitted_peak, len(admission.admitted()))
            result = rt.execute("sleep 0.2; echo done", timeout=30)
            with lock:
                alive -= 1
                results.append(result)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 12 and all(r.stdout == "done\n" and not r.oom_killed for r in results)
    assert peak <= 4 and admitted_peak <= 4
    assert peak >= 2  # they did run side by side
    assert Ledger().snapshot() == []


CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from orchestrator import load_environment_text, spawn_runtime
    env = load_environment_text(
        "version: 1\\nname: adm\\nbackend: local\\nresources: {memory: 64m}\\n")
    log = sys.argv[1]
    def note(sign):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{sign} {time.monotonic()}\\n".encode())
        os.close(fd)
    def one():
        with spawn_runtime(env) as rt:
            note("+")
            assert rt.execute("sleep 0.2; echo ok").stdout == "ok\\n"
            note("-")
    threads = [threading.Thread(target=one) for _ in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    """
)


def test_twelve_spawns_from_two_processes_never_exceed_the_budget(tmp_path: Path) -> None:
    log = tmp_path / "events"
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(log)], cwd=ROOT) for _ in range(2)
    ]
    codes = [c.wait(120) for c in children]
    assert codes == [0, 0]
    events = sorted(
        (float(t), sign) for sign, t in (line.split() for line in log.read_text().splitlines())
    )
    assert [s for _, s in events].count("+") == 12
    alive = peak = 0
    for _, sign in sorted(events, key=lambda e: (e[0], e[1] == "+")):  # ends before starts
        alive += 1 if sign == "+" else -1
        peak = max(peak, alive)
    assert 2 <= peak <= 4
    assert Ledger().snapshot() == []


def test_a_failed_spawn_gives_its_room_back() -> None:
    failing = env("256m", services="setup: {commands: ['exit 3']}\n")
    for _ in range(2):  # the second would wait forever if the first kept its room
        with pytest.raises(OrchestratorError, match="exited with 3"):
            spawn_runtime(failing)
    assert Ledger().snapshot() == []


# ----- the CLI ----------------------------------------------------------------------------
def cli(file: Path, *args: str, timeout: str = "20", stderr: Path | None = None) -> Popen[str]:
    env = {**os.environ, "ORCHESTRATOR_ADMISSION_TIMEOUT": timeout}
    with contextlib.ExitStack() as stack:
        err = subprocess.PIPE if stderr is None else stack.enter_context(stderr.open("w"))
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "run", str(file), *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
            env=env,
        )


def test_the_cli_waits_for_room_says_so_and_runs(tmp_path: Path) -> None:
    file = tmp_path / "env.yaml"
    file.write_text("version: 1\nname: adm\nbackend: local\nresources: {memory: 128m}\n")
    held = [hold(128 * MiB), hold(128 * MiB)]
    said = tmp_path / "stderr"
    proc = cli(file, "--", "echo ran", stderr=said)
    deadline = time.monotonic() + 60
    while "waiting for room" not in said.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None  # waiting
        time.sleep(0.05)
    assert "waiting for room: 0 ahead, 0.25 GiB of 0.25 GiB admitted" in said.read_text()
    held[0].release()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, said.read_text()
    assert out == "ran\n"
    held[1].release()


def test_the_cli_gives_up_with_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "env.yaml"
    file.write_text("version: 1\nname: adm\nbackend: local\nresources: {memory: 128m}\n")
    held = [hold(128 * MiB), hold(128 * MiB)]
    proc = cli(file, "--", "echo ran", timeout="0.5")
    out, err = proc.communicate(timeout=60)
    assert (
        proc.returncode == 1
        and out == ""
        and "found no room within 0.5 s" in err
        and "Traceback" not in err
    )
    too_big = tmp_path / "big.yaml"
    too_big.write_text("version: 1\nname: big\nbackend: local\nresources: {memory: 1g}\n")
    proc = cli(too_big, "--", "echo ran")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "more than this host admits at once" in err
    for h in held:
        h.release()


def test_a_sigkilled_owner_s_room_comes_back() -> None:
    child = textwrap.dedent(
        """
        import time
        from orchestrator import load_environment_text, spawn_runtime
        env = load_environment_text(
            "version: 1\\nname: killed\\nbackend: local\\nresources: {memory: 256m}\\n")
        with spawn_runtime(env) as rt:
            print(rt.workdir, flush=True)
            time.sleep(120)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", child], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as proc:
        workdir = ""
        try:
            assert proc.stdout is not None
            workdir = proc.stdout.readline().strip()
            assert workdir.endswith("/workspace")
            [held] = admission.admitted()
            assert held.env == "killed" and held.pid == proc.pid
            with pytest.raises(AdmissionTimeout, match="killed x1"):
                admission.admit(env(), wait=0.3)
        finally:
            proc.kill()  # SIGKILL: no cleanup, no atexit
            proc.wait()
            if workdir:  # the local backend reaps no dead owner's folder (see the note)
                shutil.rmtree(Path(workdir).parent, ignore_errors=True)
    assert admission.admit(env("256m"), wait=5) is not None
