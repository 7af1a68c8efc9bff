"""Issue 37, item 9, as a class: everything the project writes on the host is private to
its user, whatever the umask. Suspend records were written 0644 in 0755 folders, and
another local user read the workspace's secret from one. Here a whole lifecycle runs,
through the library and the CLI, under umask 0 (every file the process makes on its own
would be 0666, every folder 0777): up, exec, upload and download, snapshot, suspend and
wake, a pool, render --out, down; then the whole state folder is walked. No file or folder
may be open to group or others, and each must be this user's. What containers read through
a bind mount (the executor, a gateway's rules, a sandbox's name files) and a private
workspace (given to the sandbox user) are the exceptions, and only inside a project folder
that is 0700."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import labelled_ids
from tests.docker.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator"]
HANDED = ("workspace", "sandbox", "names", "gateway/rules")
"""What a project folder hands to containers, by path in it (see the module's docstring)."""

LIBRARY = r"""
import os, sys
from pathlib import Path
os.umask(0)
from orchestrator import Pool, spawn_runtime, wake

env, out = sys.argv[1], Path(sys.argv[2])
(out / "up").mkdir()
(out / "up" / "data").write_text("d")
with spawn_runtime(env) as rt:
    rt.execute("echo s3cret > secret", check=True)
    rt.write_file("a.txt", "x")
    rt.upload(out / "up", "up")
    rt.download("up", out / "down")
    rt.snapshot("lib-snap")
    rt.snapshot()
    record = rt.suspend("lib-suspended")
woken = wake(record.name)
assert woken.execute("cat secret", check=True).stdout == "s3cret\n"
woken.cleanup()
with Pool(env, size=1) as pool:
    held = pool.acquire()
    held.execute("true", check=True)
    pool.release(held)
"""


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        umask=0,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def open_to_others(root: Path) -> list[str]:
    """Every entry under `root` (itself too) that group or others may use, or that is not
    this user's; what a project folder hands to containers is looked at only for its owner
    (its project folder must be 0700)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for path in [here, *(here / n for n in [*dirnames, *filenames])]:
            info = path.lstat()
            rel = path.relative_to(root)
            if info.st_uid != os.geteuid():
                found.append(f"{rel} is uid {info.st_uid}'s")
            handed = (
                len(rel.parts) >= 3
                and rel.parts[0] == "projects"
                and any("/".join(rel.parts[2:]).startswith(h) for h in HANDED)
            )
            if handed:
                project = root / rel.parts[0] / rel.parts[1]
                if stat.S_IMODE(project.lstat().st_mode) != 0o700:
                    found.append(f"{project.relative_to(root)} holds {rel} but is not 0700")
            elif stat.S_IMODE(info.st_mode) & 0o077 and not stat.S_ISLNK(info.st_mode):
                found.append(f"{rel} is {stat.filemode(info.st_mode)}")
    return found


@pytest.mark.parametrize("door", ["cli", "library"])
def test_nothing_written_on_the_host_is_open_to_others_whatever_the_umask(
    tmp_path: Path, door: str
) -> None:
    """Through each door apart (two tests, so that they run side by side), each with a state
    folder of its own."""
    state = tmp_path / "state"  # made by this lifecycle, under umask 0
    file = tmp_path / "env.yaml"
    file.write_text(
        f"version: 1\nname: perm\nimage: {PYTHON_IMAGE}\nworkspace: {{mount: true}}\n"
        "network: {egress: [example.test], ports: [{container: 8000}]}\n"
        f"services: {{db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '3600']}}}}\n"
    )
    bare = tmp_path / "bare.yaml"  # one container, made through the Engine API (names/)
    bare.write_text(f"version: 1\nname: permbare\nimage: {BUSYBOX_IMAGE}\n")
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    env.pop("ORCHESTRATOR_ADMISSION", None)  # (its ledger is written too)
    before = labelled_ids()
    held = []
    try:
        if door == "library":
            lib = subprocess.run(
                [sys.executable, "-c", LIBRARY, str(file), str(tmp_path)],
                capture_output=True,
                text=True,
                env=env,
                timeout=900,
            )
            assert lib.returncode == 0, lib.stderr
            assert (state / "snapshots").is_dir()  # (the walk below has records to read)
        else:
            held.append(cli("up", str(file), env=env).stdout.split()[0])
            held.append(cli("up", str(bare), env=env).stdout.split()[0])
            cli("exec", held[0], "--", "sh", "-c", "echo s3cret > secret", env=env)
            cli("snapshot", held[0], "-o", "cli-snap", env=env)
            cli("render", "-o", str(tmp_path / "rendered"), str(file), env=env)
            cli("suspend", held[0], "-o", "cli-suspended", env=env)
            held.pop(0)
            assert (state / "snapshots" / "cli-suspended.tar").is_file()
            assert open_to_others(state) == []  # a project up, records, ledger, snapshots
            assert open_to_others(tmp_path / "rendered") == []
            woken = cli("wake", "cli-suspended", env=env).stdout.split()[0]
            held.append(woken)
        assert open_to_others(state) == []
    finally:
        for ident in held:
            subprocess.run([*CLI, "down", ident], capture_output=True, env=env, timeout=300)
        subprocess.run(
            [*CLI, "snapshot", "--rm", "lib-suspended"], capture_output=True, env=env, timeout=300
        )
    assert open_to_others(state) == []
    assert labelled_ids() <= before


def test_the_walk_sees_what_is_open(tmp_path: Path) -> None:
    """The walk itself can fail: a 0644 archive and a 0755 folder are seen."""
    (tmp_path / "snapshots").mkdir(mode=0o700)
    (tmp_path / "snapshots" / "a.tar").write_bytes(b"")
    os.chmod(tmp_path / "snapshots" / "a.tar", 0o644)
    (tmp_path / "projects" / "orch-x-00000000" / "sandbox").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "projects" / "orch-x-00000000", 0o755)
    os.chmod(tmp_path, 0o700)
    found = open_to_others(tmp_path)
    assert any("a.tar" in f for f in found) and any("is not 0700" in f for f in found)


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folder needs root")
def test_up_refuses_a_state_folder_someone_else_made_or_a_link(tmp_path: Path) -> None:
    """Another local user makes the state folder first (in /tmp, say) to read what we write
    in it, or puts a link there to a folder of its choice: `up` refuses before anything
    starts, naming the folder and the fix."""
    file = tmp_path / "env.yaml"
    file.write_text(f"version: 1\nname: permx\nimage: {BUSYBOX_IMAGE}\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    before = labelled_ids()
    for state in (theirs, link):
        done = subprocess.run(
            [*CLI, "up", str(file)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)},
            timeout=300,
        )
        assert done.returncode != 0, done.stdout
        assert "not a folder of this user" in done.stderr, done.stderr
        assert "ORCHESTRATOR_STATE_DIR" in done.stderr
    assert os.listdir(theirs) == [] and os.listdir(tmp_path / "elsewhere") == []
    assert labelled_ids() == before
