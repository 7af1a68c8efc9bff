"""Hostile review of issue 26 (pause, suspend, admission): attacks that break it today.
Each test states the attack; each fails on the change as reviewed (R26)."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from orchestrator import UsageError, spawn_runtime
from tests.docker.conftest import MakeEnv

CLI = [sys.executable, "-m", "orchestrator"]


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def _paused(container: str) -> bool:
    out = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Paused}}", container],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() == "true"


def _containers(ident: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=org.orchestrator.project={ident}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_sigkill_during_cli_suspend_leaves_the_environment_paused(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """Attack 3 (kill during suspend): `orchestrator suspend ID` of a detached environment
    froze its containers itself (`docker pause` from the client, then commits, then
    `docker unpause`). SIGKILLed while it committed, nothing ever thawed them: the detached
    environment stayed paused for good. The engine's own `commit --pause` unpauses whatever
    becomes of its client: the environment runs on (as after a failed suspend)."""
    path = make_env(
        "setup:\n  commands: ['dd if=/dev/urandom of=/var/big bs=1M count=400 2>/dev/null']\n",
        name="r26kill",
    )
    env = {**os.environ, "ORCHESTRATOR_ADMISSION": "0"}
    up = _cli("up", str(path), env=env)
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    saved = tmp_path / "suspend.out"
    try:
        [main] = _containers(ident)
        # the engine's own events, from before the suspend starts: a loaded engine answers
        # an inspect more slowly than the whole commit lasts (a poll missed it once)
        events = subprocess.Popen(
            [
                "docker",
                "events",
                "--since",
                f"{time.time() - 1:.3f}",
                "--filter",
                f"container={main}",
                "--filter",
                "event=pause",
                "--format",
                "{{.Action}}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            with saved.open("wb") as out:
                proc = subprocess.Popen(
                    [*CLI, "suspend", ident], env=env, stdout=out, stderr=subprocess.DEVNULL
                )
            assert events.stdout is not None
            seen = select.select([events.stdout], [], [], 120)[0]
            assert seen and events.stdout.readline().strip() == b"pause", "no pause in 120 s"
            proc.send_signal(signal.SIGKILL)
        finally:
            events.kill()
            events.communicate()
        assert proc.wait() == -signal.SIGKILL, "the suspend ended before it could be killed"
        _cli("ps", env=env)  # whoever looks next may undo it
        deadline = time.monotonic() + 120  # the engine's own commit may take a while to end
        while _paused(main) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _paused(main), "the environment was left frozen by a killed suspend"
    finally:
        subprocess.run(["docker", "unpause", *_containers(ident)], capture_output=True)
        _cli("down", ident, env=env)
        record = saved.read_text().strip() if saved.exists() else ""
        if record:  # (it ended before the kill: its record holds the images)
            _cli("snapshot", "--rm", record, env=env)


def test_up_n_over_the_budget_fails_at_once(make_env: MakeEnv) -> None:
    """Attack 3 (`up -n N` over the budget): all or none, so the batch's first ones hold
    the room its last one waits for: it waits on itself the whole admission timeout (600 s
    by default) before failing with exit 1. Expected: a batch that can never fit (N x its
    request over the budget) fails at once, exit 2, as one over the whole budget does."""
    path = make_env("", name="r26n", image="orchestrator-test/busybox:1")
    env = {
        **os.environ,
        "ORCHESTRATOR_MAX_MEMORY": "1g",
        "ORCHESTRATOR_DEFAULT_MEMORY": "512m",
        # far past the bound below: a batch waiting on itself is told from a slow start
        # (a loaded machine's CLI has taken 19 s to start and say no)
        "ORCHESTRATOR_ADMISSION_TIMEOUT": "600",
    }
    started = time.monotonic()
    done = _cli("up", "-n", "3", str(path), env=env, timeout=90)
    took = time.monotonic() - started
    for ident in done.stdout.split():
        _cli("down", ident, env=env)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert took < 60, f"waited {took:.0f} s on its own batch"
    assert "Traceback" not in done.stderr


def test_sigkill_during_snapshot_leaves_a_part_file_nobody_removes(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """Attack 3 / disk (hostpack): `rt.snapshot()` of an environment whose workspace is a
    host folder has the host's tar write `.snapshot-*.part` in the snapshots folder. SIGKILL
    the process mid-pack: the .part file (up to the snapshot limit, 1 GiB by default) stays
    for good; no reaper, guardian or `orchestrator cleanup` knows that name, and every kill
    adds one. Expected: `cleanup` (or the next snapshot) removes a .part whose writer is
    gone (e.g. name it after the writer's pid + start time, or flock it while written)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with open(workspace / "big", "wb") as fh:
        fh.truncate(3 * 1024**3)  # sparse: reads as 3 GiB of zeros, takes no disk here
    path = make_env("", name="r26part", image="orchestrator-test/busybox:1")
    state = Path(os.environ["ORCHESTRATOR_STATE_DIR"])
    env = {
        **os.environ,
        "ORCHESTRATOR_ADMISSION": "0",
        "ORCHESTRATOR_SNAPSHOT_LIMIT": str(4 * 1024**3),
    }
    script = (
        "import sys\n"
        "from orchestrator import spawn_runtime\n"
        "rt = spawn_runtime(sys.argv[1], workspace=sys.argv[2])\n"
        "print('up', flush=True)\n"
        "rt.snapshot()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path), str(workspace)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = state / "snapshots"
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        deadline = time.monotonic() + 60
        while not list(folder.glob("*.part")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()  # reaped, its pipes closed
    time.sleep(1)  # the orphaned tar gets EPIPE and ends; the guardian takes it down
    _cli("cleanup", env=env)
    left = [(p.name, p.stat().st_size) for p in folder.glob("*.part")]
    for part in folder.glob("*.part"):
        part.unlink()
    assert not left, f"left behind by a killed snapshot: {left}"


def _snapshot_images(state: Path) -> list[str]:
    """Ids of the snapshot images made with the state folder `state`."""
    key = "org.orchestrator.snapshot.state"
    listed = subprocess.run(
        ["docker", "image", "ls", "-q", "--no-trunc", "--filter", f"label={key}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for ident in listed:
        label = subprocess.run(
            [
                "docker",
                "image",
                "inspect",
                "--format",
                f'{{{{index .Config.Labels "{key}"}}}}',
                ident,
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if label == str(state.resolve()):
            found.append(ident)
    return found


def test_a_woken_environment_s_images_go_with_down(make_env: MakeEnv) -> None:
    """Nothing left behind: `orchestrator wake NAME` consumes the record and says its
    images "go with the woken environment"; but `orchestrator down ID` (another process:
    an attached runtime, which knows nothing of the record) leaves them, as orphans that
    only a later `ps`/`cleanup` reaps: a whole container filesystem per suspend/wake cycle
    stays on disk after `down`. Expected: none of our snapshot images remain after down."""
    path = make_env("", name="r26wake", image="orchestrator-test/busybox:1")
    state = Path(os.environ["ORCHESTRATOR_STATE_DIR"])
    before = set(_snapshot_images(state))  # (another test's in this worker's state folder)
    env = {**os.environ, "ORCHESTRATOR_ADMISSION": "0"}
    up = _cli("up", str(path), env=env)
    assert up.returncode == 0, up.stderr
    suspended = _cli("suspend", up.stdout.strip(), env=env)
    assert suspended.returncode == 0, suspended.stderr
    woken = _cli("wake", suspended.stdout.strip(), env=env)
    assert woken.returncode == 0, woken.stderr
    down = _cli("down", woken.stdout.strip(), env=env)
    left = [i for i in _snapshot_images(state) if i not in before]
    for ident in left:  # ours, by id
        subprocess.run(["docker", "image", "rm", "-f", ident], capture_output=True)
    assert down.returncode == 0, down.stderr
    assert not left, f"left behind after wake + down: {left}"


def _tar_of(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_an_archive_naming_the_aside_folder_breaks_replace(make_env: MakeEnv) -> None:
    """Attack 1 (REPLACE's aside folder): reset / resume / wake move the old workspace into
    `$d/.orchestrator-old.$$` (the shell's pid: small and guessable in a container) and
    remove it in the background while tar unpacks beside it. A workspace that held
    `.orchestrator-old.1` ... `.orchestrator-old.N` (a hostile sandbox writes them; a
    snapshot keeps them) makes the restore unpack into the folder being removed: the
    removal fails (the restore fails with a misleading "permission denied", and a pool
    throws the environment away) or deletes what was just restored. Expected: the
    archive's tree restored whole (aside folder under an unguessable name, excluded from
    the unpack, or outside the workspace)."""
    path = make_env("", name="r26aside")
    archive = _tar_of(
        [("keep.txt", b"precious")]
        + [(f".orchestrator-old.{k}/keep", b"x") for k in range(1, 2000)]
    )
    with spawn_runtime(path) as rt:
        # a workspace that takes a while to remove, so the removal and tar overlap
        rt.execute("mkdir junk && cd junk && seq 1 20000 | xargs touch", timeout=120)
        rt.reset(archive)
        out = rt.execute(
            "cat keep.txt; echo; for d in .orchestrator-old.*; do "
            "[ -e $d/keep ] || echo MISSING $d; done; ls -a | grep -c orchestrator-old; "
            "[ ! -e junk ] && echo no-junk",
            timeout=60,
        )
        assert out.stdout.split() == ["precious", "1999", "no-junk"], out.stdout[:500]


def test_a_service_s_image_volume_is_never_lost_silently(make_env: MakeEnv, tmp_path: Path) -> None:
    """Suspend's promise, "a database sidecar's files too": every official database image
    (postgres, mysql, mariadb, redis, mongo) declares `VOLUME` for its data folder, so its
    files live in an anonymous volume, which `docker commit` never includes. Suspend says
    nothing, wake starts the sidecar on an empty volume: the database is silently gone.
    Expected: the volume's content is saved and restored (or suspend refuses, naming it)."""
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "Dockerfile").write_text("FROM orchestrator-test/busybox:1\nVOLUME /data\n")
    tag = f"orchestrator-r26-volume:{os.getpid()}"
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(tmp_path / "img")], capture_output=True, check=True
    )
    body = f"services:\n  db:\n    image: {tag}\n    command: [sh, -c, 'sleep 100000']\n"
    path = make_env(body, name="r26vol", image="orchestrator-test/busybox:1")
    try:
        with spawn_runtime(path) as rt:
            rt.service("db").execute("echo stored > /data/store", timeout=30)
            with pytest.raises(UsageError, match=r"service 'db' keeps /data in a volume"):
                rt.suspend()
            # refused before anything was saved or stopped: the environment runs on
            assert rt.service("db").execute("cat /data/store").stdout == "stored\n"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-n", "0"])
