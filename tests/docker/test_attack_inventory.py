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


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a folder of another user (needs root)")
def test_a_folder_of_another_user_never_makes_a_reap_reach_its_engine(fake_ssh: Path) -> None:
    """In a projects folder others can write, a folder that is not ours recording an engine
    (here `ssh://`) runs nothing and is left alone by a listing's reap."""
    from orchestrator import environments
    from orchestrator.backends.container.identity import ENGINE_FILE
    from orchestrator.paths import projects_dir

    folder = projects_dir() / f"orch-theirs-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / ENGINE_FILE).write_text("ssh://someone@far-away.invalid")
    for path in (folder / ENGINE_FILE, folder):
        os.chown(path, 65534, 65534)
    try:
        _, removed = environments()
        assert not fake_ssh.exists(), fake_ssh.read_text()
        assert folder.is_dir() and folder.name not in removed
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ----- removal by id, whatever others do to a project's objects -------------------------------
@contextlib.contextmanager
def project_of_ours(name: str) -> Iterator[tuple[str, str, str]]:
    """A project carrying our labels (its owner on another machine: no reaper here takes it
    meanwhile): a container on its own network, with its own volume; (container, network,
    volume) ids, removed by id afterwards."""
    made: list[tuple[str, ...]] = []
    labels = [f"--label={L}managed=1", f"--label={L}project={name}"]
    try:
        net = docker("network", "create", *labels, f"net-{name}").stdout.strip()
        made.append(("network", "rm", net))
        vol = docker("volume", "create", *labels, f"vol-{name}").stdout.strip()
        made.append(("volume", "rm", "-f", vol))
        started = docker(
            "run", "-d", "--network", net, "-v", f"{vol}:/v", *labels,
            f"--label={L}owner.pid=1", f"--label={L}owner.start=1",
            f"--label={L}owner.host=another-machine",
            "--label=com.docker.compose.service=main", BUSYBOX_IMAGE, "sleep", "600",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        cid = started.stdout.strip()
        made.insert(0, ("rm", "-f", cid))
        yield cid, net, vol
    finally:
        for argv in made:
            docker(*argv)


def _info(name: str) -> object:
    from orchestrator.backends.container.inventory import list_projects

    [info] = [p for p in list_projects() if p.name == name]
    return info


def exists(kind: str, ident: str) -> bool:
    return docker(kind, "inspect", ident).returncode == 0


def test_removal_never_takes_an_object_named_after_one_of_our_short_ids() -> None:
    """The engine takes a name before an id prefix: decoys named after our objects' short
    ids, with none of our labels, outlive the removal; ours go at the first try."""
    from orchestrator.backends.container.inventory import remove_project

    name = f"orch-decoy-{uuid.uuid4().hex[:8]}"
    with project_of_ours(name) as (cid, net, vol):
        decoy_net = docker("network", "create", net[:12]).stdout.strip()
        decoy = docker("run", "-d", "--name", cid[:12], BUSYBOX_IMAGE, "sleep", "600")
        try:
            assert decoy.returncode == 0 and decoy_net, decoy.stderr
            remove_project(_info(name))  # type: ignore[arg-type]
            assert exists("container", decoy.stdout.strip())
            assert exists("network", decoy_net)
            assert not exists("container", cid) and not exists("network", net)
            assert not exists("volume", vol)
        finally:
            docker("rm", "-f", decoy.stdout.strip())
            docker("network", "rm", decoy_net)


def test_a_foreign_container_joined_to_our_network_does_not_keep_it() -> None:
    """Someone else's container connected to our network holds it in use: it is
    disconnected (not removed) and the network and volume go."""
    from orchestrator.backends.container.inventory import remove_project

    name = f"orch-joined-{uuid.uuid4().hex[:8]}"
    with project_of_ours(name) as (_, net, vol):
        other = docker("run", "-d", BUSYBOX_IMAGE, "sleep", "600").stdout.strip()
        try:
            assert docker("network", "connect", net, other).returncode == 0
            remove_project(_info(name))  # type: ignore[arg-type]
            assert not exists("network", net) and not exists("volume", vol)
            assert exists("container", other)
        finally:
            docker("rm", "-f", other)


def test_a_volume_someone_else_holds_stays_listed_as_ours_until_it_is_free() -> None:
    """A volume of ours that another's container mounts cannot go. It does not fail the
    removal (anyone could so make any removal fail, with a volume wearing our labels): the
    rest goes, and the volume stays listed as ours, for the removal that finds it free."""
    from orchestrator.backends.container.inventory import remove_project

    name = f"orch-held-{uuid.uuid4().hex[:8]}"
    with project_of_ours(name) as (cid, net, vol):
        other = docker("run", "-d", "-v", f"{vol}:/v", BUSYBOX_IMAGE, "sleep", "600")
        try:
            assert other.returncode == 0, other.stderr
            remove_project(_info(name))  # type: ignore[arg-type]
            assert not exists("container", cid) and not exists("network", net)
            assert _info(name).volumes == [vol]  # type: ignore[attr-defined]
        finally:
            docker("rm", "-f", other.stdout.strip())
        remove_project(_info(name))  # type: ignore[arg-type]
        assert not exists("volume", vol)


def test_a_forged_network_naming_a_dead_owner_spares_a_start_in_progress() -> None:
    """A start has made its folder (its owner recorded there) and no container yet. Someone
    on the engine makes a network wearing that project's name, its folder and a dead owner:
    a reap believes the folder's own record, and removes neither the folder nor anything."""
    from orchestrator import reap
    from orchestrator.backends.container.identity import claim_folder
    from orchestrator.paths import projects_dir

    name = f"orch-starting-{uuid.uuid4().hex[:8]}"
    folder = projects_dir() / name
    claim_folder(folder)  # its owner: this process, alive
    labels = {
        "managed": "1",
        "project": name,
        "dir": str(folder),
        "owner.pid": str(dead_pid()),
        "owner.start": "1",
        "owner.host": socket.gethostname(),
    }
    flags = [f"--label={L}{k}={v}" for k, v in labels.items()]
    net = docker("network", "create", *flags, f"net-{name}").stdout.strip()
    try:
        assert net and name not in reap()
        assert folder.is_dir() and exists("network", net)
    finally:
        docker("network", "rm", net)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_forged_network_listed_first_without_a_folder_spares_a_start_in_progress() -> None:
    """As above, but the forged network names no folder and sorts before ours (the engine
    lists networks by name): the project is judged by every object's labels, not the first
    listed one's, and a reap removes neither network nor the folder."""
    from orchestrator import reap
    from orchestrator.backends.container.identity import claim_folder
    from orchestrator.paths import projects_dir

    name = f"orch-starting-{uuid.uuid4().hex[:8]}"
    folder = projects_dir() / name
    claim_folder(folder)  # its owner: this process, alive
    owner = {"owner.pid": str(dead_pid()), "owner.start": "1", "owner.host": socket.gethostname()}
    ours = {"managed": "1", "project": name, "dir": str(folder)} | owner
    forged = {"managed": "1", "project": name} | owner
    made = []
    try:
        for prefix, labels in (("zz", ours), ("aa", forged)):
            flags = [f"--label={L}{k}={v}" for k, v in labels.items()]
            made.append(docker("network", "create", *flags, f"{prefix}-{name}").stdout.strip())
        assert all(made) and name not in reap()
        assert folder.is_dir() and all(exists("network", net) for net in made)
    finally:
        for net in made:
            docker("network", "rm", net)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_foreign_container_naming_a_dead_owner_does_not_condemn_our_live_project(
    make_env: MakeEnv,
) -> None:
    """Someone on a shared engine starts a container wearing our live project's labels, its
    folder and a dead owner of this machine. It is listed first (the newest): a reap still
    finds our owner alive through our own containers, and removes nothing of ours."""
    from orchestrator import reap, spawn_runtime
    from orchestrator.backends.container.inventory import list_projects

    with spawn_runtime(make_env("", name="victim2")) as rt:
        name = rt.info().id
        folder = Path(next(p for p in list_projects() if p.name == name).labels[f"{L}dir"])
        labels = {
            f"{L}managed": "1",
            f"{L}project": name,
            f"{L}dir": str(folder),
            f"{L}owner.pid": str(dead_pid()),
            f"{L}owner.start": "1",
            f"{L}owner.host": socket.gethostname(),
            "com.docker.compose.service": "main",
        }
        with foreign_container(labels) as foreign:
            [info] = [p for p in list_projects() if p.name == name]
            assert info.containers[0][0] == foreign  # the forged labels come first
            assert name not in reap()
            assert folder.is_dir() and rt.execute("echo alive").stdout == "alive\n"
