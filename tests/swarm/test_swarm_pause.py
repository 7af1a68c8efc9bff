"""Pause on the test Swarm: every task of the environment frozen through its own node's
engine (main and a sidecar placed on two nodes), and a SIGKILLed owner's paused stack taken
down by its guardian (Swarm stops a paused task's container by its grace period's SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, swarm_ids

BODY = (
    "placement: ['node.hostname==node-1']\n"
    "services:\n"
    "  side:\n"
    f"    image: {BUSYBOX_IMAGE}\n"
    "    placement: ['node.hostname==node-2']\n"
    "    command: [sleep, '86400']\n"
)
OWNER = """
import subprocess, sys, time
from orchestrator import SandboxPaused, spawn_runtime
rt = spawn_runtime(sys.argv[1])
names = rt.info().container, rt.service("side").connection().container
rt.pause()
try:
    rt.service("side").execute("true")
except SandboxPaused:
    pass
else:
    raise SystemExit("a service call ran while paused")
print(*names, flush=True)
time.sleep(600)
"""


def _paused_on_some_node(manager: str, container: str) -> bool:
    out = subprocess.run(
        ["docker", "-H", manager, "node", "ls", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    for node in out:
        addr = subprocess.run(
            ["docker", "-H", manager, "node", "inspect", "--format", "{{.Status.Addr}}", node],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        state = subprocess.run(
            ["docker", "-H", f"tcp://{addr}:2375", "inspect", "-f", "{{.State.Paused}}", container],
            capture_output=True,
            text=True,
            check=False,
        )
        if state.returncode == 0:
            return state.stdout.strip() == "true"
    return False


def test_a_killed_owners_paused_stack_is_removed(swarm_cluster: str, tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: swp\nbackend: swarm\nimage: {PYTHON_IMAGE}\n{BODY}")
    before = swarm_ids(swarm_cluster)
    child = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    assert child.stdout is not None
    containers = child.stdout.readline().split()
    assert len(containers) == 2, containers
    assert all(_paused_on_some_node(swarm_cluster, c) for c in containers)
    child.kill()
    child.wait()
    child.stdout.close()
    deadline = time.monotonic() + 90
    while swarm_ids(swarm_cluster) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not swarm_ids(swarm_cluster) - before  # its guardian took the paused stack down
