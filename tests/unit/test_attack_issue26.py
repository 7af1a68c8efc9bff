"""Hostile review of issue 26 (admission ledger): attacks that break it today (R26).
Each test states the attack and what should happen instead."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator import AdmissionTimeout, OrchestratorError
from orchestrator.services import admission
from orchestrator.services.ledger import Ledger
from orchestrator.spec.loader import Environment, load_environment_text

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


def env(memory: str = "64m") -> Environment:
    text = f"version: 1\nname: adm\nbackend: local\nresources: {{memory: {memory}}}\n"
    return load_environment_text(text, source="adm.yaml")


@pytest.mark.parametrize("kind", ["folder", "link", "dangling link"])
def test_a_lock_that_is_not_a_file_is_refused_with_our_error(
    own_ledger: Path, tmp_path: Path, kind: str
) -> None:
    """Attack 2 (hostile state folder): `admission/lock` made a folder or a link. The
    ledger opens it with O_NOFOLLOW, and the raw OSError (IsADirectoryError, ELOOP) escapes
    admit(): not an OrchestratorError, so the CLI prints a traceback (`orchestrator run`
    / `up` show `IsADirectoryError: ... admission/lock`). The folders beside it are checked
    and refused with a clear error; the lock should be too (or replaced, being ours)."""
    own_ledger.mkdir(parents=True, mode=0o700)
    (own_ledger / "tickets").mkdir(mode=0o700)
    lock = own_ledger / "lock"
    if kind == "folder":
        lock.mkdir()
    else:
        target = tmp_path / ("target" if kind == "link" else "missing")
        if kind == "link":
            target.write_text("")
        lock.symlink_to(target)
    try:
        got = admission.admit(env(), wait=2)
    except OrchestratorError as exc:
        assert "lock" in str(exc)
    else:
        assert got is not None
        got.release()


def test_a_stopped_waiter_at_the_head_starves_everyone(own_ledger: Path) -> None:
    """Attack 3 (fairness turned against liveness): only the head of the queue may be
    admitted, and only by its own process. A spawn that waits for room in another process
    (`orchestrator up` in a terminal) is stopped (Ctrl-Z, SIGSTOP, a debugger): its live,
    waiting ticket heads the queue for ever, and every later spawn of the user waits its
    whole timeout, though the budget is free. Expected: a head that has not looked at the
    queue for a while (a heartbeat on its ticket) is passed over until it looks again."""
    ledger = Ledger()
    held = dataclasses.replace(ledger.enqueue(256 * 1024**2, 0.0, "held"), admitted=True)
    ledger.write(held)
    hold = admission.Admission(ledger, held)
    child = textwrap.dedent(
        """
        from orchestrator.services import admission
        from orchestrator.spec.loader import load_environment_text
        text = "version: 1\\nname: other\\nbackend: local\\nresources: {memory: 128m}\\n"
        admission.admit(load_environment_text(text, source="o.yaml"), wait=60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        deadline = time.monotonic() + 20
        while len(Ledger().snapshot()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGSTOP)
        hold.release()  # the whole budget is free now
        try:
            got = admission.admit(env(), wait=8)
        except AdmissionTimeout as exc:
            pytest.fail(f"a stopped waiter holds the queue though the budget is free: {exc}")
        assert got is not None
        got.release()
    finally:
        proc.kill()
        proc.wait()


def test_a_too_long_suspend_name_is_a_usage_error(own_ledger: Path) -> None:
    """Caller mistake: `orchestrator suspend ID -o NAME` with a name longer than the file
    system allows. record_path accepts it (Path.exists() says False), the save fails with
    ENAMETOOLONG, and the clean-up of the half-made record raises again (unlink of the same
    name): an OSError traceback, exit 1, where a bad name is a usage error (exit 2). The
    environment must run on."""
    from orchestrator import UsageError, spawn_runtime

    with spawn_runtime(env()) as rt:
        with pytest.raises(UsageError):
            rt.suspend("a" * 300)
        assert rt.execute("echo alive").stdout.strip() == "alive"
