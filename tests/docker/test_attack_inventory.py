"""Attacks on what our labels, our owner-death handling and our CLI snapshot may be made to
do, against a real engine: a foreign container whose labels name a host folder, an owner
killed after its guardian, a workspace that packs to gigabytes, a crafted snapshot record."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUSYBOX_IMAGE
from tests.docker.conftest import MakeEnv

CLI = [sys.executable, "-m", "orchestrator"]
L = "org.orchestrator."


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@contextlib.contextmanager
def foreign_container(labels: dict[str, str]) -> Iterator[str]:
    """A container not started by us (any image, any owner) wearing our labels."""
    argv = ["run", "-d"]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    started = docker(*argv, BUSYBOX_IMAGE, "sleep", "600")
    assert started.returncode == 0, started.stderr
    ident = started.stdout.strip()
    try:
        yield ident
    finally:
        docker("rm", "-f", ident)


# ----- item 1 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["orch-evil-0badf00d", "victim"])
@pytest.mark.parametrize("how", ["down", "ps", "cleanup", "reap"])
def test_a_foreign_containers_labels_delete_no_host_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, name: str
) -> None:
    state = tmp_path / "state"
    (state / "projects").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    labels = {
        L + "managed": "1",
        L + "project": name,
        L + "env": "evil",
        L + "dir": f"{state}/projects/../../victim",
        L + "owner.pid": str(dead_pid()),  # its owner is gone: any reaper removes it
        L + "owner.start": "1",
        L + "owner.host": socket.gethostname(),
    }
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    with foreign_container(labels):
        if how == "reap":
            from orchestrator.backends.container.inventory import reap

            reap()
        else:
            argv = {"down": ["down", name, "--force"], "ps": ["ps"], "cleanup": ["cleanup"]}[how]
            subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120)
        assert (victim / "precious.txt").read_text() == "keep me\n"


# ----- item 9 ---------------------------------------------------------------------------------
OWNER = """
import sys, time
from orchestrator import spawn_runtime
rt = spawn_runtime(sys.argv[1])
print(rt.info().id, flush=True)
time.sleep(600)
"""


def guardian_of(owner: int) -> int:
    """The guardian process the owner started (its child running guardian.main)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == owner and b"orchestrator.backends.container.guardian" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no guardian among the children of {owner}")


def running(name: str) -> list[str]:
    flt = f"label={L}project={name}"
    return docker("ps", "-q", "--filter", flt, "--filter", "status=running").stdout.split()


def remove_leftovers(name: str) -> None:
    """What the test's project left, by id (its owner and guardian are dead)."""
    flt = f"label={L}project={name}"
    for ident in docker("ps", "-aq", "--filter", flt).stdout.split():
        docker("rm", "-f", "-v", ident)
    for ident in docker("network", "ls", "-q", "--filter", flt).stdout.split():
        docker("network", "rm", ident)
    from orchestrator.paths import projects_dir

    shutil.rmtree(projects_dir() / name, ignore_errors=True)


def test_services_stop_when_the_owner_dies_after_its_guardian(make_env: MakeEnv) -> None:
    stubborn = "trap '' TERM; while :; do sleep 1; done"  # ignores SIGTERM
    path = make_env(
        "services:\n"
        f"  db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '600']}}\n"
        f"  cache: {{image: {BUSYBOX_IMAGE}, command: [sh, -c, {json.dumps(stubborn)}]}}\n"
    )
    env = {**os.environ, "ORCHESTRATOR_GUARDIAN": "1"}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    name = ""
    try:
        name = owner.stdout.readline().strip()
        assert name.startswith("orch-t-"), name
        assert len(running(name)) == 3
        from orchestrator.backends.container.identity import KEPT_FILE
        from orchestrator.paths import projects_dir

        # spared by every reaper (other test runs reap dead owners' projects on this engine
        # too): what stops the services here can only be the mechanism under test
        (projects_dir() / name / KEPT_FILE).touch()
        os.kill(guardian_of(owner.pid), signal.SIGKILL)
        time.sleep(0.5)
        owner.kill()
        owner.wait(10)
        deadline = time.monotonic() + 20
        while running(name) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert running(name) == [], "services kept running after their owner died"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()
        if name:
            remove_leftovers(name)


# ----- item 10 --------------------------------------------------------------------------------
def limit_memory() -> None:
    """The CLI may not hold the workspace's gigabytes (heap only: the docker client's address
    space reservations are not counted)."""
    resource.setrlimit(resource.RLIMIT_DATA, (768 * 1024 * 1024, 768 * 1024 * 1024))


@pytest.fixture
def detached(make_env: MakeEnv) -> Iterator[str]:
    up = subprocess.run(
        [*CLI, "up", str(make_env("", name="big"))], capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        yield ident
    finally:
        subprocess.run([*CLI, "down", ident], capture_output=True, timeout=120)


def test_cli_snapshot_of_a_huge_sparse_file_is_refused_within_bounds(
    detached: str, tmp_path: Path
) -> None:
    made = subprocess.run(
        [*CLI, "exec", detached, "--", "truncate -s 2G big.bin && ls -s big.bin"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    env = {**os.environ, "ORCHESTRATOR_SNAPSHOT_LIMIT": str(4 * 1024 * 1024)}
    started = time.monotonic()
    r = subprocess.run(
        [*CLI, "snapshot", detached, "-o", str(tmp_path / "big.tar")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=limit_memory,
    )
    assert r.returncode != 0
    assert "more than the limit of 4194304 bytes" in r.stderr, r.stderr
    assert time.monotonic() - started < 60  # packing 2 GB of zeros would take minutes
    assert not (tmp_path / "big.tar").exists()


def test_cli_snapshot_packing_has_a_deadline(detached: str) -> None:
    made = subprocess.run(  # more than the executor packs in 0.01 s
        [*CLI, "exec", detached, "--", "head -c 64000000 /dev/urandom > big.bin"], timeout=60
    )
    assert made.returncode == 0
    started = time.monotonic()
    r = subprocess.run(
        [*CLI, "snapshot", detached, "--timeout", "0.01", "-o", "never"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "took more than 0.01s" in r.stderr, r.stderr
    assert time.monotonic() - started < 30


# ----- item 12 --------------------------------------------------------------------------------
def test_cli_rm_of_a_crafted_record_leaves_a_foreign_image_alone() -> None:
    from orchestrator.sandbox.snapshot import snapshots_dir

    tag = f"orch-attack-victim:{uuid.uuid4().hex[:12]}"
    assert docker("tag", BUSYBOX_IMAGE, tag).returncode == 0
    try:
        snapshots_dir().mkdir(parents=True, exist_ok=True)
        record = {"env": "x", "digest": "", "created": "", "size": 1, "image": tag}
        (snapshots_dir() / "crafted.json").write_text(json.dumps(record))
        (snapshots_dir() / "crafted.tar").write_bytes(b"x")
        r = subprocess.run(
            [*CLI, "snapshot", "--rm", "crafted"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert not (snapshots_dir() / "crafted.json").exists()  # the record itself goes
        assert docker("image", "inspect", tag).returncode == 0, "a foreign image was untagged"
    finally:
        docker("rmi", tag)  # our own tag only: the image stays under its other name


def test_a_hung_engine_in_a_folders_record_delays_a_listing_only_by_the_probe_bound(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """`ps` asks each engine our folders record (an environment `--engine podman` started is
    listed from Docker's side too). A folder naming an engine that accepts and never answers
    (written by anyone who can write the state folder) costs one bounded probe: the listing
    still comes, with the real environment in it, and the folder is left alone."""
    from orchestrator import environments, spawn_runtime
    from orchestrator.backends.container.identity import ENGINE_FILE
    from orchestrator.backends.container.inventory import PROBE_TIMEOUT
    from orchestrator.paths import projects_dir

    hung = socket.socket(socket.AF_UNIX)
    address = tmp_path / "hung.sock"
    hung.bind(str(address))
    hung.listen(8)  # accepts (in the backlog), never answers
    folder = projects_dir() / f"orch-hung-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / ENGINE_FILE).write_text(f"unix://{address}")
    try:
        with spawn_runtime(make_env("", name="listed", image=BUSYBOX_IMAGE)) as rt:
            started = time.monotonic()
            rows, removed = environments()
            took = time.monotonic() - started
            assert rt.info().id in {r.id for r in rows}
            assert folder.name not in {r.id for r in rows} | set(removed)
            assert took < 2 * PROBE_TIMEOUT + 20, took  # two bounded calls at most, once
        assert folder.is_dir()  # an engine that did not answer decides nothing
    finally:
        hung.close()
        shutil.rmtree(folder, ignore_errors=True)
