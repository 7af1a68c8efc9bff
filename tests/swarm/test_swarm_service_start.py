"""Issue 21, item 4, on the swarm backend: a sidecar that exits during the start fails it
with its exit code and logs and leaves nothing on the Swarm; a job runs to completion first
(Swarm has no depends_on: the runtime waits for it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import HealthcheckFailed, spawn_runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, swarm_ids


def _env(tmp_path: Path, services: str) -> Path:
    path = tmp_path / "env.yaml"
    path.write_text(
        f"version: 1\nname: sw\nbackend: swarm\nimage: {PYTHON_IMAGE}\nservices:\n{services}"
    )
    return path


def test_a_sidecar_that_exits_fails_the_start(swarm_cluster: str, tmp_path: Path) -> None:
    path = _env(
        tmp_path,
        f"  db:\n    image: {BUSYBOX_IMAGE}\n    command: [sh, -c, 'echo db-boot-line; exit 3']\n",
    )
    before = swarm_ids(swarm_cluster)
    with pytest.raises(HealthcheckFailed) as info:
        spawn_runtime(path)
    assert "service 'db' exited with code 3" in str(info.value)
    assert "db-boot-line" in str(info.value)
    assert swarm_ids(swarm_cluster) <= before


def test_a_job_ends_before_the_first_command(swarm_cluster: str, tmp_path: Path) -> None:
    path = _env(
        tmp_path,
        f"  seed:\n    image: {BUSYBOX_IMAGE}\n    job: true\n"
        "    command: [sh, -c, 'sleep 4; echo seeded']\n",
    )
    with spawn_runtime(path) as rt:
        assert b"seeded" in b"".join(rt.logs("seed"))  # it had ended: the start waited
        assert rt.execute("echo hi").stdout == "hi\n"


def test_a_failing_job_fails_the_start(swarm_cluster: str, tmp_path: Path) -> None:
    path = _env(
        tmp_path,
        f"  seed:\n    image: {BUSYBOX_IMAGE}\n    job: true\n"
        "    command: [sh, -c, 'echo seed-broke; exit 1']\n",
    )
    before = swarm_ids(swarm_cluster)
    with pytest.raises(HealthcheckFailed) as info:
        spawn_runtime(path)
    assert "job 'seed' exited with code 1" in str(info.value)
    assert "seed-broke" in str(info.value)
    assert swarm_ids(swarm_cluster) <= before
