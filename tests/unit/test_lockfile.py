"""Lock files without an engine: the text a lock is written as reads back the same; a lock
that is not one is a SpecError at its line; what a build is made of is hashed by content
(not by where or when it was written), never through a link or into a FIFO; the local
backend locks versions only, and the swarm backend refuses a locked file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator import SpecError, UsageError, get_runtime_class, lock_environment
from orchestrator.backends.docker import fingerprint
from orchestrator.backends.docker.fingerprint import content_digest
from orchestrator.spec.loader import load_environment_text
from orchestrator.spec.lockfile import Lock, LockedBuild, LockedImage, lock_text, read_lock
from orchestrator.spec.policy import Policy

ID = "sha256:" + "ab" * 32


def test_a_lock_reads_back_as_it_was_written(tmp_path: Path) -> None:
    lock = Lock(
        file="env.yaml",
        orchestrator="1.0",  # (a number in YAML, were it not quoted)
        templates="abc",
        images={"image": LockedImage(image="python:3.11", id=ID)},
        builds={"services.web.build": LockedBuild(inputs="cd" * 32, bases={"x:1": ID})},
        gateway=LockedImage(image="orchestrator/gateway:1", id=ID),
    )
    path = tmp_path / "env.yaml.lock"
    path.write_text(lock_text(lock))
    assert read_lock(path) == lock
    assert read_lock(tmp_path / "none.lock") is None


def test_a_bad_field_is_placed_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "env.yaml.lock"
    path.write_text(
        'version: 1\nfile: "e"\norchestrator: "0"\ntemplates: "t"\n'
        "images:\n  image:\n    image: a\n    id: sha256:nothex\n"
    )
    with pytest.raises(SpecError) as caught:
        read_lock(path)
    [issue] = caught.value.issues
    assert issue.field == "images.image.id" and issue.line == 8, issue
    assert "orchestrator lock" in issue.fix


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "Dockerfile").write_text("FROM x\nCOPY . /\n")
    (root / "sub" / "a.txt").write_text("a\n")
    (root / "link").symlink_to("/etc/passwd")


def test_inputs_are_hashed_by_content_wherever_and_whenever_written(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _tree(one)
    time.sleep(0.01)
    _tree(two)  # another place, other times and inodes: the same tree
    digest = content_digest(one, None, {"A": "1"}, skip=frozenset())
    assert digest == content_digest(two, None, {"A": "1"}, skip=frozenset())
    assert digest != content_digest(one, None, {"A": "2"}, skip=frozenset())
    os.utime(one / "sub" / "a.txt", (0, 0))  # a touch changes nothing
    assert digest == content_digest(one, None, {"A": "1"}, skip=frozenset())
    (one / "sub" / "a.txt").write_text("b\n")  # an edit does
    assert digest != content_digest(one, None, {"A": "1"}, skip=frozenset())
    (two / "sub" / "a.txt").chmod(0o755)  # and so do permissions
    assert digest != content_digest(two, None, {"A": "1"}, skip=frozenset())
    skip = frozenset({"env.yaml.lock"})
    unlocked = content_digest(one, None, {}, skip=skip)
    (one / "env.yaml.lock").write_text("x")  # the lock itself is left out
    assert content_digest(one, None, {}, skip=skip) == unlocked
    assert content_digest(one, None, {}, skip=frozenset()) != unlocked


def test_a_hostile_context_is_never_followed_or_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # opened, it would wait for a writer forever
    before = content_digest(tmp_path, None, {}, skip=frozenset())
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to("/etc/hostname")  # another target: another text
    assert content_digest(tmp_path, None, {}, skip=frozenset()) != before
    monkeypatch.setattr(fingerprint, "LOCK_BYTES", 4)
    with pytest.raises(ValueError, match="too large to lock"):
        content_digest(tmp_path, None, {}, skip=frozenset())
    monkeypatch.setattr(fingerprint, "LOCK_BYTES", 1 << 20)
    monkeypatch.setattr(fingerprint, "LOCK_FILES", 2)
    with pytest.raises(ValueError, match="too large to lock"):
        content_digest(tmp_path, None, {}, skip=frozenset())


def test_the_local_backend_locks_versions_only(tmp_path: Path) -> None:
    env = tmp_path / "env.yaml"
    env.write_text("version: 1\nname: loc\nbackend: local\n")
    done = lock_environment(env, backend="local", policy=Policy(allow_unisolated=True))
    lock = read_lock(done.path)
    assert lock is not None and not lock.images and not lock.builds and done.written


def test_swarm_refuses_a_locked_file_and_to_lock_one(tmp_path: Path) -> None:
    (tmp_path / "env.yaml").write_text("version: 1\nname: sw\nimage: busybox\n")
    env = load_environment_text(
        "version: 1\nname: sw\nimage: busybox\n",
        source=str(tmp_path / "env.yaml"),
        base_dir=tmp_path,
    )
    swarm = get_runtime_class("swarm")
    with pytest.raises(UsageError, match="swarm backend does not run locked files"):
        swarm.make_lock(env, Policy())
    (tmp_path / "env.yaml.lock").write_text("version: 1\n")
    with pytest.raises(SpecError, match="swarm backend does not run locked files"):
        swarm.check(env, Policy())
