"""Podman as the engine (`--engine podman`, ORCHESTRATOR_ENGINE=podman, `host="podman"`): a
sandbox without network runs there as on Docker (the conformance suite's `docker-podman`
target runs every rule); what Podman does not do as Docker does is refused before anything
is made; a dead owner's sandbox is removed from Podman too; and rootless, the sandbox's root
is the engine's unprivileged user on the host."""

from __future__ import annotations

import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import (
    BackendUnavailable,
    SpawnOptions,
    SpecError,
    UsageError,
    settings,
    spawn_runtime,
)
from tests.conftest import (
    BUSYBOX_IMAGE,
    PODMAN,
    ROOT,
    cannot_run,
    labelled_ids,
    main_container,
)
from tests.docker.conftest import MakeEnv
from tests.docker.test_cli_manners import CLI, cli
from tests.docker.test_compose import ODD_STATE, snapshot_under_an_odd_state_folder


def on(host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "--host", host, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_spawn_that_names_podman_runs_there_and_nowhere_else(make_env: MakeEnv) -> None:
    before = labelled_ids()
    rt = spawn_runtime(make_env("", name="on-podman"), host="podman")
    try:
        container = main_container(rt)
        result = rt.execute("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
        labels = on(PODMAN, "inspect", "--format", "{{json .Config.Labels}}", container)
        assert labels.returncode == 0, labels.stderr
        assert f'"com.docker.compose.project":"{rt.info().id}"' in labels.stdout
        assert labelled_ids() == before  # nothing of it on Docker's engine
    finally:
        rt.cleanup()
    assert on(PODMAN, "inspect", container).returncode != 0  # removed from Podman


def test_the_engine_is_named_by_variable_option_or_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.settings import engine_host

    monkeypatch.delenv("ORCHESTRATOR_DOCKER_HOST", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///elsewhere.sock")
    monkeypatch.setenv("ORCHESTRATOR_ENGINE", "podman")
    assert engine_host() == PODMAN  # the named engine, over DOCKER_HOST
    monkeypatch.setenv("ORCHESTRATOR_ENGINE", "docker")
    assert engine_host() == "unix:///elsewhere.sock"  # the process's Docker
    monkeypatch.setenv("ORCHESTRATOR_DOCKER_HOST", "podman")
    assert engine_host() == PODMAN  # `-H podman`
    monkeypatch.setenv("ORCHESTRATOR_ENGINE", "kubernetes")
    monkeypatch.delenv("ORCHESTRATOR_DOCKER_HOST")
    with pytest.raises(UsageError, match="ORCHESTRATOR_ENGINE must be one of docker, podman"):
        engine_host()
    assert SpawnOptions(host="podman").host == PODMAN
    assert SpawnOptions(host="tcp://10.0.0.1:2375").host == "tcp://10.0.0.1:2375"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    assert settings.podman_socket() == "unix:///run/user/1234/podman/podman.sock"  # rootless


def test_the_cli_brings_one_up_on_podman_and_finds_it_again(make_env: MakeEnv) -> None:
    path = make_env("", name="cli-podman")
    up = cli("--engine", "podman", "up", str(path))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.split()[0]
    try:
        # the id remembers its engine: exec and down need no --engine
        done = cli("exec", ident, "--", "sh", "-c", "echo on-podman; exit 4")
        assert (done.returncode, done.stdout) == (4, "on-podman\n"), done.stderr
        listed = cli("--engine", "podman", "ps")
        assert ident in listed.stdout, listed
        # a listing on Docker's engine shows it too (its folder names Podman, which is
        # asked), and neither it nor a cleanup there takes a detached environment of
        # Podman's whose `up` process is gone
        here = cli("ps")
        # (another test's dead-owner project may be reaped meanwhile: only ours matters)
        assert ident in here.stdout and f"removed {ident}" not in here.stderr, here
        assert cli("cleanup").returncode == 0
        again = cli("exec", ident, "--", "echo", "still")
        assert (again.returncode, again.stdout) == (0, "still\n"), again.stderr
    finally:
        down = cli("down", ident)  # by id, wherever it runs
    assert down.returncode == 0, down.stderr
    assert ident not in cli("--engine", "podman", "ps").stdout
    bad = cli("--engine", "lxc", "ps")
    assert bad.returncode == 2 and "--engine must be one of docker, podman" in bad.stderr


REFUSED = {
    "services": f"services: {{db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '60']}}}}\n",
    "ports": "network: {ports: [{container: 8080}]}\n",
    "egress-all": "network: {egress: all}\n",
    "allowlist": "network: {egress: [example.test]}\n",
    "gvisor": "isolation: gvisor\n",
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_what_podman_cannot_keep_is_refused_before_anything_is_made(
    make_env: MakeEnv, what: str, tmp_path: Path
) -> None:
    """Podman ignores `internal` networks and `runtime:`, and runs no healthcheck itself:
    a file that needs them must not run there looking as if it did."""
    path = make_env(REFUSED[what], name=f"refused-{what}")
    state = tmp_path / "state"
    before = labelled_ids(PODMAN)
    done = cli("--engine", "podman", "up", str(path), env={"ORCHESTRATOR_STATE_DIR": str(state)})
    assert done.returncode == 3, done
    assert "the Podman engine does not give here" in done.stderr
    assert "Traceback" not in done.stderr
    assert labelled_ids(PODMAN) == before
    assert not any((state / "projects").glob("*/compose.yaml"))  # no folder left either


@pytest.mark.parametrize("what", ["mount-target", "workdir", "static-asset"])
def test_a_path_podman_would_read_as_mount_options_is_refused(
    make_env: MakeEnv, tmp_path: Path, what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Podman reads each mount back as comma-separated options, the last `src=` winning: a
    target `/m,src=/etc` would bind the host's /etc, writable, into the sandbox (a hostile
    file's way out). Any mount path with a comma is refused before anything is made (also
    where the caller accepts host folders by path, as Podman needs)."""
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS", "1")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret").write_text("the host's\n")
    lines = {
        "mount-target": f"mounts: [{{source: ./data, target: '/m,src={victim}'}}]\n",
        "workdir": f"workdir: '/w,src={victim}'\n",
        "static-asset": f"static_assets: [{{name: s, path: data, save_path: 'x,src={victim}'}}]\n",
    }
    path = make_env(lines[what], name=f"comma-{what}")
    (path.parent / "data").mkdir(exist_ok=True)
    before = labelled_ids(PODMAN)
    with pytest.raises(BackendUnavailable, match=r"Podman cannot mount .*,src="):
        spawn_runtime(path, host="podman")
    assert labelled_ids(PODMAN) == before
    assert os.listdir(victim) == ["secret"]
    with spawn_runtime(path) as rt:  # Docker takes the comma as part of the name
        assert rt.execute("cat /m*/secret /w*/secret /static/x*/secret").exit_code != 0


def test_a_snapshot_on_podman_records_podman_and_resumes_only_there(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORCHESTRATOR_ENGINE alone chose Podman: the snapshot's record says so, so a process
    working with Docker is told where it is rather than looking on the wrong engine."""
    from orchestrator.backends.container import images
    from orchestrator.backends.container.engine import Engine

    path = make_env("", name="podsnap")
    monkeypatch.setenv(settings.ENGINE.name, "podman")
    # Podman's API cannot mount a folder whose path holds `"` or `,`: refused, by name
    for odd in ('a"b', "a,b"):
        monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / odd))
        before = labelled_ids(PODMAN)
        with pytest.raises(BackendUnavailable, match="Podman cannot mount .*" + odd):
            spawn_runtime(path)
        assert labelled_ids(PODMAN) == before
        assert not list((tmp_path / odd / "projects").iterdir())
    odd = ODD_STATE.replace('"', "")
    snapshot_under_an_odd_state_folder(path, tmp_path, monkeypatch, PODMAN, odd)
    with spawn_runtime(path) as rt:
        quoted = rt.snapshot(tmp_path / 'x"y' / "s.tar", filesystem=True)  # in its record's path
        assert images.owned(quoted.image, quoted.record, Engine.at())
        quoted.remove()
        images_before = on(PODMAN, "images", "-q").stdout
        with pytest.raises(UsageError, match="must be UTF-8"):
            rt.snapshot(tmp_path / "x\udcffy" / "s.tar", filesystem=True)  # not UTF-8
        assert on(PODMAN, "images", "-q").stdout == images_before
        snap = rt.snapshot(tmp_path / "again.tar", filesystem=True)
    try:
        monkeypatch.delenv(settings.ENGINE.name)
        before = labelled_ids()
        with pytest.raises(UsageError, match=f"is on the engine at {PODMAN}"):
            spawn_runtime(path, resume=snap)
        assert labelled_ids() == before
        with spawn_runtime(path, resume=snap, host="podman") as rt:  # named: found there
            assert rt.execute("true").exit_code == 0
    finally:
        monkeypatch.setenv(settings.ENGINE.name, "podman")
        snap.remove()


def test_a_dead_owners_sandbox_on_podman_is_removed(make_env: MakeEnv, tmp_path: Path) -> None:
    """The owner named Podman for one spawn only; its guardian, on the process's engine,
    still finds that sandbox (its folder records its engine)."""
    path = make_env("", name="owner-podman")
    said = tmp_path / "guardian.log"
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from orchestrator import spawn_runtime; "
            "rt = spawn_runtime(sys.argv[1], host='podman'); "
            "print(rt.info().container, flush=True); time.sleep(600)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ORCHESTRATOR_GUARDIAN": "1", "ORCHESTRATOR_GUARDIAN_LOG": str(said)},
    )
    assert owner.stdout is not None
    try:
        container = owner.stdout.readline().strip()
        assert container, "the owner started nothing"
        assert on(PODMAN, "inspect", container).returncode == 0
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        # (1.5 s on an idle machine; Podman's one service, which the run's other Podman tests
        # keep busy, took over 30 s once under a full run's load)
        deadline = time.monotonic() + 90
        while on(PODMAN, "inspect", container).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        state = on(PODMAN, "inspect", "--format", "{{.State.Status}}", container)
        log = said.read_text() if said.exists() else "(the guardian said nothing)"
        assert state.returncode != 0, f"still on Podman after 90 s: {state.stdout} {log}"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()


# ----- rootless ----------------------------------------------------------------------------

ROOTLESS_UID = 65534
"""`nobody`: an unprivileged user with no subordinate ids, so Podman maps exactly one uid,
0 in the sandbox, to it (no user is added to the machine for this test)."""

ROOTLESS_SCRIPT = """
import os, pathlib, sys
from orchestrator import BackendUnavailable, SpecError, spawn_runtime
ws = pathlib.Path(sys.argv[2])
try:  # its engine cannot mount what this process holds open: the caller accepts paths
    spawn_runtime(sys.argv[1], workspace=ws).cleanup()
    print("unpinned: no", flush=True)
except SpecError as exc:
    print("unpinned:", "ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS=1" in str(exc), flush=True)
    os.environ["ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS"] = "1"
try:
    rt = spawn_runtime(sys.argv[1], workspace=ws)
    print("refused: no", flush=True)
except BackendUnavailable as exc:  # cgroup v1: no limit would hold; the caller accepts it
    print("refused:", "ORCHESTRATOR_ROOTLESS_WITHOUT_LIMITS=1" in str(exc), flush=True)
    os.environ["ORCHESTRATOR_ROOTLESS_WITHOUT_LIMITS"] = "1"
    rt = spawn_runtime(sys.argv[1], workspace=ws)
try:
    r = rt.execute("id -u; touch made-by-root; mkdir -p d && echo x > d/f")
    print(r.exit_code, r.stdout.strip(), r.stderr.strip(), flush=True)
finally:
    rt.cleanup()
for p in ("made-by-root", "d", "d/f"):
    print(p, (ws / p).stat().st_uid)
"""
"""Spawns as the rootless user: refused first where no limit can hold (cgroup v1, said so
in the error), then accepted without limits; what the sandbox's root makes, by owner."""


def _python_for(uid: int) -> list[str] | None:
    """An interpreter `uid` may run with this one's packages: this one if it can reach it,
    else the system's of the same version; None when there is none."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for exe in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        probe = subprocess.run(
            ["runuser", "-u", "nobody", "--", exe, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(sys.version_info[:2])):
            return [exe]
    return None


@pytest.fixture
def rootless_folder() -> Iterator[Path]:
    """A folder of the rootless user's own: its home, runtime folder and workspace."""
    if shutil.which("runuser") is None or shutil.which("podman") is None:
        why = (
            "rootless Podman test skipped: runuser or podman is missing (scripts/bootstrap-podman)"
        )
        cannot_run(why)
    scratch = Path(tempfile.gettempdir()) / f"containers-user-{ROOTLESS_UID}"  # Podman's own
    made_scratch = not scratch.exists()
    top = Path(tempfile.mkdtemp(prefix="orch-rootless-"))
    top.chmod(0o755)
    for name in ("home", "run", "ws"):
        (top / name).mkdir(mode=0o700)
        os.chown(top / name, ROOTLESS_UID, ROOTLESS_UID)
    try:
        yield top
    finally:
        subprocess.run(
            ["pkill", "-u", str(ROOTLESS_UID), "-f", "podman system service"], check=False
        )
        # the user's own storage (its image, in its home): Podman's to remove, as that user
        subprocess.run(
            [
                "runuser",
                "-u",
                "nobody",
                "--",
                "env",
                f"HOME={top / 'home'}",
                f"XDG_RUNTIME_DIR={top / 'run'}",
                "podman",
                "system",
                "reset",
                "--force",
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )
        shutil.rmtree(top, ignore_errors=True)
        if made_scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def test_rootless_podman_maps_the_sandboxs_root_to_an_unprivileged_user(
    rootless_folder: Path,
) -> None:
    top = rootless_folder
    python = _python_for(ROOTLESS_UID)
    if python is None:
        cannot_run("no Python of this version that the rootless user may run")
    image = top / "busybox.tar"
    saved = subprocess.run(["docker", "save", "-o", str(image), BUSYBOX_IMAGE], check=False)
    assert saved.returncode == 0
    image.chmod(0o644)
    env_file = top / "env.yaml"
    env_file.write_text(f"version: 1\nname: rootless\nimage: {BUSYBOX_IMAGE}\nuser: root\n")
    env_file.chmod(0o644)
    script = top / "run.py"
    script.write_text(ROOTLESS_SCRIPT)
    script.chmod(0o644)
    paths = [str(ROOT), *site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    variables = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(top / "home"),
        "XDG_RUNTIME_DIR": str(top / "run"),
        "PYTHONPATH": os.pathsep.join(paths),
        "ORCHESTRATOR_ENGINE": "podman",
        "ORCHESTRATOR_STATE_DIR": str(top / "home" / "state"),
    }
    shell = (
        f"podman load -q -i {image} >/dev/null && "
        "(podman system service --time=0 >$XDG_RUNTIME_DIR/service.log 2>&1 &) && "
        "for i in $(seq 80); do [ -S $XDG_RUNTIME_DIR/podman/podman.sock ] && break; "
        "sleep 0.25; done && "
        f"cd $HOME && {python[0]} {script} {env_file} {top / 'ws'}"
    )
    done = subprocess.run(
        [
            "runuser",
            "-u",
            "nobody",
            "--",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in variables.items()),
            "sh",
            "-c",
            shell,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    unpinned, *lines = done.stdout.splitlines()
    # a rootless engine's own namespaces cannot take this process's descriptors
    assert unpinned == "unpinned: True", done.stdout
    cgroup_v1 = not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    assert lines[0] == ("refused: True" if cgroup_v1 else "refused: no"), done.stdout
    assert lines[1].startswith("0 0"), lines  # root in the sandbox, exit 0
    owners = dict(line.rsplit(" ", 1) for line in lines[2:])
    # on the host, what that root made belongs to the engine's user: not to root
    assert owners == {p: str(ROOTLESS_UID) for p in ("made-by-root", "d", "d/f")}, done.stdout


def test_podman_commands_spare_dockers_detached_environments(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """The other way round: a listing, a cleanup, a refused file and an `up` on Podman reap
    there; a detached environment on Docker's engine, whose `up` has exited, stays whole
    (its folder, its workspace, its record), and `down` on Podman's side reaches it."""
    base = make_env("", name="on-docker")
    refused = make_env(REFUSED["services"], name="refused-here")
    up = cli("up", str(base))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.split()[0]
    try:
        for args in (["ps"], ["cleanup"], ["up", str(refused)], ["run", str(base), "--", "true"]):
            done = cli("--engine", "podman", *args)
            assert "Traceback" not in done.stderr, done.stderr
            assert f"removed {ident}" not in done.stdout + done.stderr, (args, done)
            assert (ident in done.stdout) == (args == ["ps"]), (args, done.stdout)  # listed
        # Podman named the standard way: the docker CLI's own default is Podman for this one
        done = cli("ps", env={"DOCKER_HOST": PODMAN})
        assert ident in done.stdout and f"removed {ident}" not in done.stderr, done
        # reached on its own engine, whichever engine the caller names
        again = cli("--engine", "podman", "exec", ident, "--", "sh", "-c", "echo w > k && cat k")
        assert (again.returncode, again.stdout) == (0, "w\n"), again.stderr
    finally:
        down = cli("--engine", "podman", "down", ident)  # by id, on the engine it runs on
    assert down.returncode == 0, down.stderr
    assert ident not in cli("ps").stdout


@pytest.mark.parametrize("what", ["fifo", "huge", "garbage"])
def test_a_broken_engine_record_is_left_alone_and_hangs_nothing(
    make_env: MakeEnv, what: str
) -> None:
    """A project folder whose `engine` file is a FIFO, megabytes long or no address: `ps`,
    `cleanup` and `down` of another id end at once, say no traceback, and leave it be."""
    from orchestrator.paths import projects_dir

    state = Path(os.environ["ORCHESTRATOR_STATE_DIR"])
    assert projects_dir().is_relative_to(state)
    folder = projects_dir() / f"orch-broken-{what}-{os.getpid()}"
    folder.mkdir(parents=True)
    (folder / "owner").write_text(f"999999 1 {socket.gethostname()}\n")  # long gone
    record = folder / "engine"
    if what == "fifo":
        os.mkfifo(record)
    elif what == "huge":
        record.write_text("unix://" + "a" * 3_000_000)
    else:
        record.write_text("garbage not a host\n")
    try:
        for args in (["ps"], ["cleanup"], ["down", "orch-none-such-0000"]):
            done = subprocess.run(
                [*CLI, *args], capture_output=True, text=True, timeout=60, check=False
            )
            assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        assert folder.is_dir()  # not ours to judge: left alone
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_start_tried_again_keeps_its_engine_record(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start whose subnet was taken is made again in a new folder: that folder records its
    engine too (without it, a reaper on another engine would take the folder for its own)."""
    from orchestrator.backends.container.engine import SubnetOverlap
    from orchestrator.backends.docker import lifecycle

    real, folders = lifecycle.Project.up, []

    def taken_once(self: lifecycle.Project) -> None:
        folders.append((self.directory / "engine").read_text().strip())
        if len(folders) == 1:
            raise SubnetOverlap("Pool overlaps with other one on this address space")
        real(self)

    monkeypatch.setattr(lifecycle.Project, "up", taken_once)
    rt = spawn_runtime(make_env("", name="retried"), host="podman")
    try:
        assert folders == [PODMAN, PODMAN]
    finally:
        rt.cleanup()


def test_podman_is_given_no_pinned_folder_it_would_fill_and_re_own(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Podman fills a volume from the image and gives its folder the image's owner and mode
    the first time it mounts it, nocopy or not: a pinned folder's volume, the host folder
    itself, was filled with the image's set-user-ID program and opened to all (issue 37
    review). Podman gets host folders by path, only when the caller accepts that; a folder
    so mounted keeps its mode and gets nothing."""
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o700)
    path = make_env("mounts: [{source: ./data, target: /var, read_only: true}]\n", name="pin-pod")
    with pytest.raises(SpecError, match="Podman fills a volume"):
        spawn_runtime(path, host="podman")
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_UNPINNED_MOUNTS", "1")
    with spawn_runtime(path, host="podman") as rt:
        assert any("by path" in w for w in rt.warnings)
    assert os.listdir(data) == [] and data.stat().st_mode & 0o777 == 0o700
