"""The multi-service profile: every service is a sandbox. `from orchestrator.testing.services
import *` in a test module with a `conformance_target` fixture (a `Target` with a
`service_image`) runs these checks against two sidecars of one environment:

- `web`, whose command reads the static assets as it starts and serves them (a healthcheck
  holds the start until it answers): the assets are there before a service's command runs;
- `side`, a non-root sidecar (`user: "4321:4321"`, no passwd entry) with a `workdir` that is
  not in its image: made for it, its own, where its command, its commands and its relative
  file paths start.

Commands, files and timeouts on a sidecar keep the rules of the main sandbox. A backend
without extra containers lists the rule "services" in its `deviations`; the profile skips."""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import HealthcheckFailed, Runtime, Sandbox, load_environment, spawn_runtime
from orchestrator.errors import SandboxFileNotFound
from orchestrator.testing.conformance.kit import unique_sleep
from orchestrator.testing.target import (
    SIDE_UID,
    SIDE_WORKDIR,
    SITE,
    STARTED,
    STAT,
    Target,
    stat_argv,
)

__all__ = [
    "services_rt",
    "test_service_command_read_the_static_assets_as_it_started",
    "test_service_exit_codes_and_streams",
    "test_service_files_and_folders",
    "test_service_nonroot_started_in_its_own_workdir",
    "test_service_nonroot_writes_in_its_workdir",
    "test_service_reaches_another_by_name",
    "test_service_that_dies_as_it_starts_fails_the_start",
    "test_service_timeout_kills_the_whole_tree",
]


@pytest.fixture(scope="module")
def services_rt(
    conformance_target: Target, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runtime]:
    """One runtime of the profile's two-service file per target."""
    reason = conformance_target.deviation("services")
    if reason:
        pytest.skip(f"{conformance_target.id} deviates from 'services': {reason}")
    if conformance_target.service_image is None:
        pytest.skip(f"{conformance_target.id}: the target names no service_image")
    folder = tmp_path_factory.mktemp(f"services-{conformance_target.id}")
    with conformance_target.spawn_services(folder) as runtime:
        yield runtime


def _survivors(sandbox: Sandbox, marker: str) -> str:
    """Processes whose command line holds `marker` (the pattern never matches itself)."""
    pattern = marker[:-1] + "[" + marker[-1] + "]"
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null "
        f"| grep -q '{pattern}' && echo $f; done; true"
    )
    return sandbox.execute(script).stdout.strip()


def test_service_command_read_the_static_assets_as_it_started(services_rt: Runtime) -> None:
    web = services_rt.service("web")
    assert web.read_file("/tmp/at-start") == SITE  # copied by its command, first thing
    assert web.static_path("site") == "/static/site"
    assert web.execute(["cat", "/static/site/index.html"]).stdout == SITE


def test_service_reaches_another_by_name(services_rt: Runtime) -> None:
    probe = "import urllib.request as u; print(u.urlopen('http://web:8080/index.html').read())"
    r = services_rt.service("side").execute(["python3", "-c", probe], timeout=60)
    assert r.ok, r.stderr
    assert "static site" in r.stdout


def test_service_nonroot_started_in_its_own_workdir(services_rt: Runtime) -> None:
    side = services_rt.service("side")
    assert side.workdir == SIDE_WORKDIR
    assert side.read_file(STARTED) == f"{SIDE_WORKDIR}\n{SIDE_UID}\n"  # relative: the workdir


def test_service_nonroot_writes_in_its_workdir(services_rt: Runtime) -> None:
    side = services_rt.service("side")
    r = side.execute(f"pwd; id -u; python3 -c {shlex.quote(STAT)} '%u:%g %a' .")
    assert r.stdout == f"{SIDE_WORKDIR}\n{SIDE_UID}\n{SIDE_UID}:{SIDE_UID} 755\n", r.stderr
    name = f"notes-{uuid.uuid4().hex[:8]}"
    side.write_file(f"{name}/a.txt", "written\n")
    assert side.read_file(f"{SIDE_WORKDIR}/{name}/a.txt") == "written\n"
    owner = side.execute(stat_argv("%u", f"{name}/a.txt")).stdout.strip()
    assert owner == str(SIDE_UID)
    assert side.execute(f"echo more >> {name}/a.txt && mkdir {name}/sub").ok


def test_service_exit_codes_and_streams(services_rt: Runtime) -> None:
    side = services_rt.service("side")
    assert side.execute("true").exit_code == 0
    assert side.execute("exit 3").exit_code == 3
    assert side.execute(["no-such-binary-xyz"]).exit_code == 127
    r = side.execute("echo out; echo err >&2; cat", stdin="in\n")
    assert (r.stdout, r.stderr) == ("out\nin\n", "err\n")


def test_service_files_and_folders(services_rt: Runtime, tmp_path: Path) -> None:
    side = services_rt.service("side")
    with pytest.raises(SandboxFileNotFound):
        side.read_file("missing.txt")
    src = tmp_path / "src"
    (src / "deep").mkdir(parents=True)
    (src / "deep" / "data.bin").write_bytes(bytes(range(256)) * 16)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    dest = f"up-{uuid.uuid4().hex[:8]}"
    side.upload(src, dest)
    assert side.execute([f"./{dest}/run.sh"]).stdout == "ran\n"
    assert side.execute(stat_argv("%u", f"{dest}/deep/data.bin")).stdout.strip() == str(SIDE_UID)
    side.download(dest, tmp_path / "back")
    assert (tmp_path / "back" / "deep" / "data.bin").read_bytes() == bytes(range(256)) * 16
    assert (tmp_path / "back" / "run.sh").stat().st_mode & 0o111


def test_service_timeout_kills_the_whole_tree(services_rt: Runtime) -> None:
    side = services_rt.service("side")
    s = unique_sleep()
    r = side.execute(f"sh -c 'sleep {s} & sleep {s}' & setsid sleep {s} & sleep {s}", timeout=1)
    assert r.timed_out and r.elapsed < 10
    time.sleep(0.3)
    assert _survivors(side, s) == ""
    assert side.execute("echo alive").stdout == "alive\n"  # the sidecar itself lives on


def test_service_that_dies_as_it_starts_fails_the_start(
    conformance_target: Target, tmp_path: Path
) -> None:
    """A sidecar that runs, then exits 0.3 s later, fails the start (HealthcheckFailed
    naming it, its exit code and its last log lines) and nothing of it is left running; a
    `job: true` service in the same file, which ended with exit 0, is fine."""
    reason = conformance_target.deviation("services")
    if reason:
        pytest.skip(f"{conformance_target.id} deviates from 'services': {reason}")
    image = conformance_target.service_image
    if image is None:
        pytest.skip(f"{conformance_target.id}: the target names no service_image")
    crash = "echo crash-log-line; sleep 0.3; exit 3"
    lines = [
        "version: 1",
        f"name: conf-crash-{conformance_target.id}",
        f"backend: {conformance_target.backend}",
        "services:",
        "  crash:",
        f"    image: {image}",
        f"    command: [sh, -c, {json.dumps(crash)}]",
        "  seed:",
        f"    image: {image}",
        "    job: true",
        "    command: [sh, -c, 'echo seeded']",
        *conformance_target.env_lines,
    ]
    path = tmp_path / "env.yaml"
    path.write_text("\n".join(lines) + "\n")
    with conformance_target.environment(), pytest.raises(HealthcheckFailed) as info:
        spawn_runtime(
            load_environment(path),
            backend=conformance_target.backend,
            policy=conformance_target.policy(),
        )
    message = str(info.value)
    assert "service 'crash' exited with code 3" in message
    assert "crash-log-line" in message
    assert "seed" not in message
