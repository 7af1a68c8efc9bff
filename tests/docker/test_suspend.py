"""Suspend to disk and wake (issue 26 item 2): a whole environment, its sidecar's own files
too, saved as images and the workspace, its containers removed, then woken under a new id."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator import (
    OrchestratorError,
    PolicyError,
    Runtime,
    Snapshot,
    UsageError,
    list_snapshots,
    reap,
    spawn_runtime,
    wake,
)
from orchestrator.backends.container import images
from orchestrator.sandbox.snapshot import records_folder, saving, snapshots_dir
from tests.conftest import BUSYBOX_IMAGE, labelled_ids
from tests.docker.conftest import MakeEnv, killed_owner

# A sidecar whose store is a file in its own filesystem (not a mount): it appends what it is
# sent, and serves the store on a published port.
STORE = (
    "mkdir -p /data /www && touch /data/store && "
    "(while true; do cp /data/store /www/store; sleep 0.2; done &) && "
    "httpd -f -p 8080 -h /www"
)
BODY = f"""\
setup:
  commands: ['echo setup >> setup.log']
  resume_commands: ['echo resumed >> setup.log']
services:
  db:
    image: {BUSYBOX_IMAGE}
    command: [sh, -c, {json.dumps(STORE)}]
    ports: [{{container: 8080, host_ip: 127.0.0.1}}]
"""


def _containers(project: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=org.orchestrator.project={project}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def _served(rt: Runtime) -> str:
    """The sidecar's store, through its published port (retried while httpd starts)."""
    [port] = [p for p in rt.info().ports if p.service == "db"]
    deadline = time.monotonic() + 20
    while True:
        try:
            url = f"http://127.0.0.1:{port.host}/store"
            with urllib.request.urlopen(url, timeout=5) as answer:
                return str(answer.read().decode())
        except (OSError, http.client.HTTPException):  # a reply cut while it starts, too
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_suspend_then_wake_a_two_service_environment(make_env: MakeEnv) -> None:
    path = make_env(BODY, name="susp")
    with spawn_runtime(path) as rt:
        db = rt.service("db")
        db.execute("echo row-1 >> /data/store && echo row-2 >> /data/store", check=True)
        rt.execute("mkdir -p /opt/tool && echo built > /opt/tool/out", user="0:0", check=True)
        rt.write_file("work.txt", "mine\n")
        old_id = rt.info().id
        assert _served(rt) in ("", "row-1\nrow-2\n")
        record = rt.suspend("susp-rec")
        assert rt.closed
    assert _containers(old_id) == []  # every container removed: its memory freed
    assert record.suspended and set(record.images) == {"main", "db"}
    assert all(images.owned(i, record.record) for i in record.images.values())
    assert record in list_snapshots()
    with wake(record.name) as woken:
        assert woken.info().id != old_id
        db = woken.service("db")
        assert db.execute("cat /data/store").stdout == "row-1\nrow-2\n"  # the sidecar's files
        assert woken.execute("cat /opt/tool/out work.txt").stdout == "built\nmine\n"
        assert woken.execute("cat setup.log").stdout == "setup\nresumed\n"  # resume_commands
        assert _served(woken) == "row-1\nrow-2\n"  # its port published again
        assert record not in list_snapshots()  # consumed: its images go with this one
    assert not any(images.exists(i) for i in record.images.values())


def test_cli_suspend_and_wake(make_env: MakeEnv, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "orchestrator"]
    path = make_env(BODY, name="clisusp")
    up = subprocess.run([*cli, "up", str(path)], capture_output=True, text=True, check=True)
    ident = up.stdout.strip()
    woken = ""
    try:
        subprocess.run([*cli, "exec", ident, "--", "echo cli > f.txt"], check=True)
        done = subprocess.run(
            [*cli, "suspend", ident, "-o", "cli-susp"], capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stdout.strip() == "cli-susp", done.stderr
        assert _containers(ident) == []
        again = subprocess.run([*cli, "wake", "cli-susp", "--json"], capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        woken = json.loads(again.stdout)["id"]
        assert woken != ident and any(
            p["service"] == "db" for p in json.loads(again.stdout)["ports"]
        )
        out = subprocess.run([*cli, "exec", woken, "--", "cat f.txt"], capture_output=True)
        assert out.stdout == b"cli\n"
        missing = subprocess.run([*cli, "wake", "cli-susp"], capture_output=True, text=True)
        assert missing.returncode == 2 and "no snapshot 'cli-susp'" in missing.stderr
        assert "Traceback" not in missing.stderr
    finally:
        for i in (ident, woken):
            if i:
                subprocess.run([*cli, "down", i], capture_output=True, check=False)
    # the consumed record's images: the woken environment is gone, so the next reap (`ps`,
    # `cleanup`, any spawn) removes them
    subprocess.run([*cli, "ps"], capture_output=True, check=True)


def _forged(record: Snapshot, **changes: object) -> None:
    data = json.loads(record.record.read_text())
    data.update(changes)
    record.record.write_text(json.dumps(data))


def test_a_record_naming_a_foreign_image_is_refused(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record is a file: one naming an image that is not its own (the file's busybox, a
    tag made outside orchestrator) is neither run instead of the file's image nor removed."""
    path = make_env(BODY, name="forge")
    with spawn_runtime(path) as rt:
        record = rt.suspend("forged")
    own = record.images
    _forged(record, services={"db": BUSYBOX_IMAGE})
    before = labelled_ids()
    with pytest.raises(UsageError, match="is not that record's"):
        wake(record.name)
    assert labelled_ids() == before  # refused before anything started
    _forged(record, services={"db": "--help"})  # nor an option of the docker command
    with pytest.raises(UsageError):
        wake(record.name)
    _forged(record, services=own, host="tcp://203.0.113.9:2375")  # nor an engine it names
    with pytest.raises(UsageError, match="wake it there"):
        wake(record.name)
    _forged(record, host="", backend="local")  # nor a backend that isolates nothing
    with monkeypatch.context() as patch:
        patch.delenv("ORCHESTRATOR_ALLOW_UNISOLATED")
        with pytest.raises(PolicyError, match="unisolated"):
            wake(record.name)
    assert labelled_ids() == before
    _forged(record, backend="docker", services={"db": BUSYBOX_IMAGE})
    Snapshot.named(record.name).remove()  # the foreign image is left alone, its own goes
    assert images.exists(BUSYBOX_IMAGE) and not record.record.exists()
    assert not images.exists(own["main"])
    assert images.exists(own["db"])  # its own, no longer named by it: the reaper's
    reap()
    assert not images.exists(own["db"])


@pytest.mark.parametrize("kind", ["ssh", "unix"])
def test_removing_a_record_never_reaches_an_engine_only_the_record_names(
    make_env: MakeEnv, tmp_path: Path, fake_ssh: Path, kind: str
) -> None:
    """A record that names an engine this process does not (`ssh://`, which would run ssh;
    a `unix://` socket anyone may listen on) is removed with its archive, but its images
    are not looked for there: nothing is run and nothing connects. The images stay for the
    reap of the engine holding them."""
    path = make_env(BODY, name=f"far{kind}")
    with spawn_runtime(path) as rt:
        record = rt.suspend(f"far-record-{kind}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "engine.sock"))
    listener.listen(8)
    listener.setblocking(False)
    host = {"ssh": "ssh://someone@far-away.invalid", "unix": f"unix://{tmp_path}/engine.sock"}
    _forged(record, host=host[kind])
    try:
        Snapshot.named(record.name).remove()
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert not fake_ssh.exists(), fake_ssh.read_text()
    assert not record.record.exists() and not record.path.exists()
    assert all(images.exists(image) for image in record.images.values())
    reap()  # their record is gone: the reap of the engine that holds them removes them
    assert not any(images.exists(image) for image in record.images.values())


OWNER = textwrap.dedent(
    """
    import sys, time
    from orchestrator import spawn_runtime
    rt = spawn_runtime(sys.argv[1])
    record = rt.suspend(sys.argv[2], keep=sys.argv[3] == "keep")
    print(record.name, *record.images.values(), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "owned"])
def test_a_sigkilled_owners_suspended_environment(
    make_env: MakeEnv, tmp_path: Path, keep: bool
) -> None:
    """suspend() keeps the record for another process to wake by default; with keep=False
    the record and its images go when the owner dies (here by SIGKILL: its guardian)."""
    path = make_env(BODY, name=f"own{int(keep)}")
    name = f"owner-{'kept' if keep else 'owned'}"
    line = killed_owner(OWNER, str(path), name, "keep" if keep else "owned")
    assert line, "the owner did not suspend"
    made = line[1:]
    record = snapshots_dir() / f"{name}.json"
    deadline = time.monotonic() + 30
    while not keep and record.exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # its guardian notices within a second or so
    if keep:
        time.sleep(2)  # what a guardian would have done by now
        reap()  # and the reaper
        assert record.exists() and all(images.exists(i) for i in made)
        with wake(name) as woken:  # another process wakes it
            assert woken.service("db").execute("cat /data/store").ok
    else:
        assert not record.exists(), "the dead owner's suspended environment is still there"
        assert not any(images.exists(i) for i in made)


CRASH_ON_WAKE = (
    "if [ -f /data/woke ]; then sleep 0.3; echo dying on wake; exit 3; fi; "
    "mkdir -p /data && touch /data/woke && exec sleep 2147483647"
)


def test_a_sidecar_that_dies_as_it_wakes_fails_the_wake_and_leaves_nothing(
    make_env: MakeEnv,
) -> None:
    """The settle window of a wake overlaps its workspace's restore, and still holds: a
    service that dies just after it was first seen running fails the wake, with its exit
    code and last lines, and nothing of the woken environment is left."""
    body = f"""\
services:
  db:
    image: {BUSYBOX_IMAGE}
    command: [sh, -c, {json.dumps(CRASH_ON_WAKE)}]
"""
    before = labelled_ids()
    with spawn_runtime(make_env(body, name="crashwake")) as rt:
        record = rt.checkpoint()
    try:
        with pytest.raises(OrchestratorError, match="dying on wake"):
            wake(record.name, keep_record=True)
    finally:
        Snapshot.find(record.name).remove()
    assert labelled_ids() <= before


def test_an_image_whose_record_is_not_written_yet_is_no_orphan() -> None:
    """A save commits its images first and writes its record once the workspace is packed
    (minutes, for a large one): meanwhile every reap (any `ps`, a dead owner's guardian)
    took the images for orphans and removed them, and the record then named images that
    were gone. While a live process saves the record, they stay; after, they are orphans."""
    argv = ["docker", "run", "-d", "--label", "org.orchestrator.managed=1"]
    made = subprocess.run(
        [*argv, BUSYBOX_IMAGE, "sleep", "60"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    record = snapshots_dir() / "not-written-yet.json"
    records_folder(record)
    tag = ""
    try:
        with saving(record):
            tag = images.commit(made, record)
            assert images.reap_orphans() == [] and images.exists(tag)  # we save it still
        assert images.reap_orphans() and not images.exists(tag)  # we gave up: an orphan
        record.with_suffix(".pending").write_text("1 1 another-machine\n")  # (not judged)
        dead = f"{os.getpid()} 1 {socket.gethostname()}\n"  # (our pid, another start)
        record.with_name("crashed.pending").write_text(dead)
        images.reap_orphans()
        assert record.with_suffix(".pending").exists()
        assert not record.with_name("crashed.pending").exists()  # its saver is gone
    finally:
        record.with_suffix(".pending").unlink(missing_ok=True)
        subprocess.run(["docker", "rm", "-f", made], capture_output=True, timeout=60)
        if tag:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=60)
