"""Hostile review of issue 21's change, against the real engine: what a hostile environment
file's services do to a start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import BUSYBOX_IMAGE, labelled_ids
from tests.docker.conftest import MakeEnv

CLI = str(Path(sys.executable).with_name("orchestrator"))


def test_cli_up_names_a_job_that_never_ends(make_env: MakeEnv, tmp_path: Path) -> None:
    """A `job: true` service that never exits (no `workdir`, so Compose itself waits for it
    with `service_completed_successfully`): `up` must fail at the up timeout naming the job,
    with its last log lines and the setting to raise, as the runtime's own wait does for a
    gated job. Today it says the *engine* did not answer in time and prints Compose's
    progress lines instead."""
    command = json.dumps("echo waiting-forever; sleep 600")
    path = make_env(
        f"services:\n  seed:\n    image: {BUSYBOX_IMAGE}\n    command: [sh, -c, {command}]\n"
        "    job: true\n",
        name="forever",
        image=BUSYBOX_IMAGE,
    )
    before = labelled_ids()
    started = time.monotonic()
    done = subprocess.run(
        [CLI, "up", str(path)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "ORCHESTRATOR_UP_TIMEOUT": "20"},  # a loaded engine starts slowly
    )
    assert time.monotonic() - started < 90
    assert labelled_ids() <= before  # nothing left behind (this part holds today)
    assert done.stdout.strip() == ""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert "job 'seed'" in done.stderr, done.stderr
    assert "waiting-forever" in done.stderr, done.stderr
    assert "engine did not answer" not in done.stderr, done.stderr


def _build_containers(marker: str) -> set[str]:
    """Ids of every container (any state) whose command holds `marker`."""
    out = subprocess.run(
        ["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {line.split()[0] for line in out.stdout.splitlines() if marker in line}


def test_a_failed_build_leaves_no_container(tmp_path: Path) -> None:
    """A Dockerfile whose RUN fails: `up` fails (exit 1, nothing on stdout) and must leave
    nothing behind. On an engine without buildx (the classic builder, as here) `compose
    build` keeps the failed step's container (exited, named at random, without our labels,
    so no `down` or reaper finds it): one more for every failed `up`."""
    marker = f"attack21-{os.getpid()}-{time.monotonic_ns()}"
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BUSYBOX_IMAGE}\nRUN echo {marker}; exit 7\n")
    path = tmp_path / "badbuild.yaml"
    path.write_text(f"version: 1\nname: badbuild\nbuild: {{context: {context}}}\n")
    before = labelled_ids()
    try:
        done = subprocess.run(
            [CLI, "up", str(path)],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
            env=os.environ.copy(),
        )
        left = _build_containers(marker)
    finally:
        for ident in _build_containers(marker):  # only what this test's build made
            subprocess.run(["docker", "rm", "-f", ident], capture_output=True, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout.strip() == ""
    assert "Traceback" not in done.stderr
    assert labelled_ids() <= before
    assert not left, f"the failed build left containers {sorted(left)}"
