"""The local backend keeps the leak rules too (no Docker needed)."""

from __future__ import annotations

import gc
import os
import time
import uuid
from pathlib import Path

import pytest

from orchestrator import load_environment_text, procutil, spawn_runtime


def running(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_daemons_that_left_the_command_tree_die_at_cleanup(tmp_path: Path) -> None:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    seconds = str(30000 + uuid.uuid4().int % 9999)
    with spawn_runtime(env) as rt:
        # a new session, reparented away from us: no process tree leads to it any more
        r = rt.execute(f"setsid sleep {seconds} >/dev/null 2>&1 < /dev/null & echo ok", timeout=10)
        assert r.stdout == "ok\n"
        time.sleep(0.3)
        assert running(f"sleep\0{seconds}"), "the daemon did not start"
    deadline = time.monotonic() + 5
    while running(f"sleep\0{seconds}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(f"sleep\0{seconds}") == []


def test_poll_reports_what_is_not_what_was_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    seconds = str(30000 + uuid.uuid4().int % 9999)
    with spawn_runtime(env) as rt:
        rt.execute(f"setsid sleep {seconds} >/dev/null 2>&1 < /dev/null &", timeout=10)
        with monkeypatch.context() as m:  # a kill that misses: the daemon lives on
            m.setattr(os, "kill", lambda pid, sig: None)
            m.setattr(procutil, "kill_tree", lambda pid, sig, known=None: [])
            rt.kill()
        time.sleep(0.3)
        assert running(f"sleep\0{seconds}") and rt.poll() is None
        rt.kill()
        deadline = time.monotonic() + 5
        while rt.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.poll() == 137 and running(f"sleep\0{seconds}") == []


def test_no_container_filesystem_to_snapshot_or_resume(tmp_path: Path) -> None:
    from dataclasses import replace

    from orchestrator import UsageError

    env = load_environment_text("version: 1\nname: fs\nbackend: local\n")
    with spawn_runtime(env) as rt:
        with pytest.raises(UsageError, match="no container filesystem"):
            rt.snapshot(tmp_path / "s.tar", filesystem=True)
        snap = rt.snapshot(tmp_path / "s.tar")
    with pytest.raises(UsageError, match="only the docker backend resumes"):
        spawn_runtime(env, resume=replace(snap, image="orchestrator-snapshot:x"))


def test_a_runtime_dropped_without_cleanup_leaves_nothing() -> None:
    """Collected without `with` or cleanup(): its processes and its folder go all the same."""
    rt = spawn_runtime(load_environment_text("version: 1\nname: dropped\nbackend: local\n"))
    seconds = str(30000 + uuid.uuid4().int % 9999)
    rt.execute(f"setsid sleep {seconds} >/dev/null 2>&1 < /dev/null &", timeout=10)
    token = f"sleep\0{seconds}"
    folder = Path(rt.info().workdir).parent
    deadline = time.monotonic() + 5
    while not running(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert folder.is_dir() and running(token)
    del rt
    gc.collect()
    assert not folder.exists()
    deadline = time.monotonic() + 5
    while running(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(token)
