"""scripts/build-images builds what it is asked for (by default only what the quick start
uses), and parallel callers build an image once. Run against a stand-in `docker` and
`debootstrap` on PATH that record what they are asked, so nothing real is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images"
TAGS = {
    "ORCHESTRATOR_BUSYBOX_IMAGE": "e21-test/busybox:1",
    "ORCHESTRATOR_PYTHON_IMAGE": "e21-test/python:3.11",
    "ORCHESTRATOR_NODE_IMAGE": "e21-test/node:1",
}

# `docker image inspect TAG` succeeds once `docker import ... TAG` ran; every call is logged
FAKE_DOCKER = """#!/bin/sh
echo "docker $*" >> "$FAKE_STATE/log"
mark() { echo "$FAKE_STATE/image-$(echo "$1" | tr '/:' '__')"; }
if [ "$1 $2" = "image inspect" ]; then [ -e "$(mark "$3")" ]; exit; fi
if [ "$1" = import ]; then
  for last in "$@"; do :; done
  cat >/dev/null; touch "$(mark "$last")"; exit 0
fi
exit 0
"""
# debootstrap [options] SUITE TARGET MIRROR: slow enough for two callers to overlap
FAKE_DEBOOTSTRAP = """#!/bin/sh
echo "debootstrap $*" >> "$FAKE_STATE/log"
sleep 1
exit 0
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    if sys.platform != "linux":
        pytest.skip("scripts/build-images is for Debian hosts")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("debootstrap", FAKE_DEBOOTSTRAP)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    (state / "log").touch()
    # the busybox image is "there" (its build needs a static busybox and chroot)
    (state / "image-e21-test_busybox_1").touch()
    return {
        **os.environ,
        **TAGS,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_STATE": str(state),
        "ORCHESTRATOR_BUILD_LOCK": str(tmp_path / "build.lock"),
    }


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def _log(env: dict[str, str]) -> list[str]:
    return (Path(env["FAKE_STATE"]) / "log").read_text().splitlines()


def test_default_builds_only_what_the_quick_start_uses(fake: dict[str, str]) -> None:
    done = _run(fake)
    assert done.returncode == 0, done.stderr
    log = _log(fake)
    assert [line for line in log if "python3" in line and line.startswith("debootstrap")]
    assert not [line for line in log if "node" in line or "docker.io" in line], log


def test_bootstrap_asks_for_the_quick_start_images_and_the_gateway_base_only() -> None:
    text = (ROOT / "scripts" / "bootstrap").read_text()
    calls = [line for line in text.splitlines() if line.startswith("bash scripts/build-images")]
    calls = [line for line in calls if not line.lstrip().startswith("#")]
    assert [line.strip().rstrip("&").split() for line in calls] == [
        ["bash", "scripts/build-images", "busybox", "python", "gateway"]
    ]


def test_node_target_builds_the_node_image_alone(fake: dict[str, str]) -> None:
    done = _run(fake, "node")
    assert done.returncode == 0, done.stderr
    boots = [line for line in _log(fake) if line.startswith("debootstrap")]
    assert len(boots) == 1 and "docker.io" in boots[0], boots
    assert (Path(fake["FAKE_STATE"]) / "image-e21-test_node_1").exists()


def test_parallel_callers_build_an_image_once(fake: dict[str, str]) -> None:
    runs = [
        subprocess.Popen(
            ["bash", str(SCRIPT), "python"],
            env=fake,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for run in runs:
        _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
    boots = [line for line in _log(fake) if line.startswith("debootstrap")]
    assert len(boots) == 1, boots


def test_unknown_target_is_refused_naming_the_targets(fake: dict[str, str]) -> None:
    done = _run(fake, "nodes")
    assert done.returncode != 0
    assert "unknown target 'nodes'" in done.stderr
    assert "busybox, python, gateway, harbor, node, registry or swarm" in done.stderr
    assert not _log(fake)
