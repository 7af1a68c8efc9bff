"""Issue 21, item 4: a start waits for its extra services. A sidecar that exits during the
start, or just after it (a crash loop), fails it with its exit code and last log lines and
leaves nothing; a `job: true` service runs to completion first and must exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import (
    HealthcheckFailed,
    Sandbox,
    SandboxUnavailable,
    SpecError,
    load_environment,
    spawn_runtime,
)
from tests.conftest import BUSYBOX_IMAGE, labelled_ids
from tests.docker.conftest import MakeEnv

CLI = str(Path(sys.executable).with_name("orchestrator"))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=240, cwd=cwd, env=os.environ.copy()
    )


def _service(name: str, command: str, extra: str = "") -> str:
    return (
        f"  {name}:\n    image: {BUSYBOX_IMAGE}\n    command: [sh, -c, {json.dumps(command)}]\n"
        + extra
    )


def test_cli_up_fails_on_a_sidecar_that_exits(make_env: MakeEnv, tmp_path: Path) -> None:
    """`exit 3`, no healthcheck: `up` used to print an id and exit 0."""
    path = make_env("services:\n" + _service("db", "echo db-boot-line; exit 3"), name="crash")
    before = labelled_ids()
    done = _cli("up", str(path), cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout.strip() == ""  # no id: nothing to `down`
    assert "service 'db' exited with code 3" in done.stderr
    assert "db-boot-line" in done.stderr
    assert "job: true" in done.stderr  # what to do when it is meant to end
    assert "Traceback" not in done.stderr
    assert labelled_ids() <= before  # nothing left half-started


@pytest.mark.parametrize(
    ("gated", "after"), [(False, 0.3), (True, 0.6)], ids=["compose-waits", "runtime-waits"]
)
def test_a_sidecar_that_crashes_just_after_it_started_fails_the_start(
    make_env: MakeEnv, gated: bool, after: float
) -> None:
    """Running when first looked at, gone `after` seconds later. A gated one (with a
    `workdir`) runs its command only once the runtime has prepared it, well after its
    container started: its window runs from then, never from the container's start (which
    let one that died 0.6 s after it was released through)."""
    extra = "    workdir: /srv/db\n" if gated else ""
    crash = f"echo crashing-soon; sleep {after}; exit 4"
    path = make_env("services:\n" + _service("db", crash, extra))
    before = labelled_ids()
    started = time.monotonic()
    with pytest.raises(HealthcheckFailed) as info:
        spawn_runtime(path)
    assert time.monotonic() - started < 60
    assert "service 'db' exited with code 4" in str(info.value)
    assert "crashing-soon" in str(info.value)
    assert labelled_ids() <= before


def test_a_sidecar_that_exits_0_is_not_a_job(make_env: MakeEnv) -> None:
    path = make_env("services:\n" + _service("db", "echo bye"))
    with pytest.raises(HealthcheckFailed, match="service 'db' exited with code 0"):
        spawn_runtime(path)


def test_a_hostile_sidecars_log_reaches_the_terminal_defused(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """Its last log lines are shown, not its terminal escapes (nor megabytes of output)."""
    noisy = "head -c 3000000 /dev/zero | tr '\\0' x; echo; printf '\\033]0;owned\\007\\033[2J'"
    path = make_env("services:\n" + _service("db", noisy + "; echo last-line; exit 9"))
    done = _cli("up", str(path), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "code 9" in done.stderr and "last-line" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert len(done.stderr) < 10_000


@pytest.mark.parametrize("gated", [False, True], ids=["compose-waits", "runtime-waits"])
def test_a_job_runs_to_completion_before_the_main_sandbox(
    make_env: MakeEnv, tmp_path: Path, gated: bool
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    extra = f"    job: true\n    mounts: [{{source: {shared}, target: /shared}}]\n"
    extra += "    workdir: /srv/seed\n" if gated else ""
    seed = "sleep 1; echo seeded > /shared/seed.txt; echo seed-done"
    path = make_env(
        # setup is the first command the main sandbox runs: the job must have ended
        "setup: {commands: ['cat /shared/seed.txt']}\n"
        f"mounts: [{{source: {shared}, target: /shared}}]\n"
        "services:\n" + _service("seed", seed, extra)
    )
    with spawn_runtime(path) as rt:
        assert rt.execute("cat /shared/seed.txt").stdout == "seeded\n"
        assert b"seed-done" in b"".join(rt.logs("seed"))


def test_cli_up_with_a_job_succeeds(make_env: MakeEnv, tmp_path: Path) -> None:
    path = make_env("services:\n" + _service("seed", "echo seeding", "    job: true\n"))
    before = labelled_ids()
    done = _cli("up", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ident = done.stdout.strip()
    try:
        assert ident.startswith("orch-t-")
        got = _cli("exec", ident, "--", "echo", "hi", cwd=tmp_path)
        assert got.stdout == "hi\n", got.stderr
    finally:
        _cli("down", ident, cwd=tmp_path)
    assert labelled_ids() <= before


@pytest.mark.parametrize("gated", [False, True], ids=["compose-waits", "runtime-waits"])
def test_a_failing_job_fails_the_start_with_its_logs(
    make_env: MakeEnv, tmp_path: Path, gated: bool
) -> None:
    extra = "    job: true\n" + ("    workdir: /srv/seed\n" if gated else "")
    path = make_env("services:\n" + _service("seed", "echo seed-broke; exit 1", extra))
    before = labelled_ids()
    done = _cli("up", str(path), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "job 'seed' exited with code 1" in done.stderr
    assert "seed-broke" in done.stderr
    assert labelled_ids() <= before


def test_a_job_that_never_ends_fails_at_the_up_timeout(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the bound holds Compose's own `up` too: 5 s was once spent by a loaded engine making
    # the project's network alone, and the start failed there instead of at the job)
    monkeypatch.setenv("ORCHESTRATOR_UP_TIMEOUT", "20")
    extra = "    job: true\n    workdir: /srv/seed\n"  # the runtime's own wait
    path = make_env("services:\n" + _service("seed", "echo waiting-forever; sleep 600", extra))
    before = labelled_ids()
    started = time.monotonic()
    with pytest.raises(HealthcheckFailed, match="job 'seed' was not ready within 20s"):
        spawn_runtime(path)
    assert time.monotonic() - started < 90
    assert labelled_ids() <= before


def test_a_sidecar_that_dies_later_leaves_the_main_sandbox_usable(make_env: MakeEnv) -> None:
    dies = "while [ ! -e /tmp/die ]; do sleep 0.1; done; exit 5"  # when told, after the start
    path = make_env("services:\n" + _service("db", dies))
    with spawn_runtime(path) as rt:
        db = rt.service("db")
        db.execute("touch /tmp/die", check=True)
        deadline = time.monotonic() + 30
        while _runs(db):
            assert time.monotonic() < deadline, "db did not die"
            time.sleep(0.5)
        assert rt.execute("echo still-here").stdout == "still-here\n"


def _runs(sandbox: Sandbox) -> bool:
    try:
        sandbox.execute("true")
    except SandboxUnavailable as exc:
        assert "exit code 5" in str(exc)
        return False
    return True


def test_job_in_the_schema(tmp_path: Path) -> None:
    base = f"version: 1\nname: j\nimage: {BUSYBOX_IMAGE}\nservices:\n  seed:\n"
    base += f"    image: {BUSYBOX_IMAGE}\n"
    ok = tmp_path / "ok.yaml"
    ok.write_text(base + "    job: true\n")
    assert load_environment(ok).spec.services["seed"].job is True
    both = tmp_path / "both.yaml"
    both.write_text(base + "    job: true\n    healthcheck: {test: [CMD, 'true']}\n")
    with pytest.raises(SpecError, match="never healthy"):
        load_environment(both)
    odd = tmp_path / "odd.yaml"
    odd.write_text(base + "    job: sometimes\n")
    with pytest.raises(SpecError, match="job"):
        load_environment(odd)
    done = _cli("validate", str(both), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    schema = json.loads(_cli("schema", cwd=tmp_path).stdout)
    text = json.dumps(schema)
    assert '"job"' in text and "service_completed_successfully" in text
