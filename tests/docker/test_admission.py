"""Admission by capacity on Docker (issue 26, item 3): busybox environments declaring 64m
under a 256m budget never run more than four at once and all complete, none OOM-killed; an
environment left running by `orchestrator up` holds its room after that process, until `down`.
(The issue's full size, 40 x 2 GiB under 16 GiB, is bench/admission.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator import AdmissionTimeout, RuntimeResult, load_environment, spawn_runtime
from orchestrator.services import admission
from orchestrator.services.ledger import Ledger
from tests.conftest import labelled_ids
from tests.docker.conftest import BUSYBOX_IMAGE, MakeEnv

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ORCHESTRATOR_MAX_MEMORY", "256m")
    monkeypatch.setenv("ORCHESTRATOR_MAX_CPUS", "2")
    monkeypatch.delenv("ORCHESTRATOR_ADMISSION", raising=False)


def test_busybox_environments_never_exceed_the_budget(make_env: MakeEnv) -> None:
    env = load_environment(make_env("resources: {memory: 64m}\n", name="adm", image=BUSYBOX_IMAGE))
    before = labelled_ids()
    alive = peak = admitted_peak = 0
    results: list[RuntimeResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        nonlocal alive, peak, admitted_peak
        try:
            with spawn_runtime(env) as rt:
                with lock:
                    alive += 1
                    peak = max(peak, alive)
                admitted_peak = max(admitted_peak, len(admission.admitted()))
                result = rt.execute("head -c 20000000 /dev/zero | wc -c", timeout=60)
                with lock:
                    alive -= 1
                    results.append(result)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    assert len(results) == 8
    assert all(r.stdout.strip() == "20000000" and not r.oom_killed for r in results)
    assert 1 <= peak <= 4 and admitted_peak <= 4
    assert Ledger().snapshot() == []
    assert labelled_ids() <= before


def test_an_environment_left_up_holds_its_room_until_down(make_env: MakeEnv) -> None:
    file = make_env("resources: {memory: 192m}\n", name="admup", image=BUSYBOX_IMAGE)
    up = subprocess.run(
        [sys.executable, "-m", "orchestrator", "up", str(file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=180,
    )
    assert up.returncode == 0, up.stderr
    ident = up.stdout.split()[0]
    try:
        [held] = Ledger().snapshot()  # its process is gone: its project folder holds it
        assert held.admitted and held.memory == 192 * 1024 * 1024
        assert Path(held.anchor).name == ident
        small = load_environment(make_env("resources: {memory: 128m}\n", name="adm2"))
        with pytest.raises(AdmissionTimeout, match="admup x1"):
            admission.admit(small, wait=0.3)
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "orchestrator", "down", ident],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=180,
        )
    assert down.returncode == 0, down.stderr
    assert Ledger().snapshot() == []
