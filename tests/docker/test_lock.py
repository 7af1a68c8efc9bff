"""Lock files (spec/lockfile.py, backends/docker/lockfile.py, `orchestrator lock`): a locked
file runs the image ids of its lock after a tag moved (and says so); a build whose inputs or
base changed is refused until `--update`; a lock that names an id the engine lacks, or that
is not a lock at all, fails with the fix before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import SpecError, lock_environment, spawn_runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-m", "orchestrator"]


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


def orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def tag() -> Iterator[str]:
    """A tag of this test's own (busybox's image to begin with), untagged after."""
    name = f"orchestrator-test/lock-{uuid.uuid4().hex[:8]}:1"
    assert docker("tag", BUSYBOX_IMAGE, name).returncode == 0
    try:
        yield name
    finally:
        docker("image", "rm", name)  # (a tag: the image stays under its own name)


def test_a_locked_file_runs_its_ids_after_the_tag_moved(tmp_path: Path, tag: str) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(
        f"version: 1\nname: lockimg\nimage: {tag}\n"
        f"services:\n  side:\n    image: {BUSYBOX_IMAGE}\n    command: [sleep, '600']\n"
    )
    done = lock_environment(env)
    assert done.written and done.path == tmp_path / "env.yaml.lock"
    assert lock_environment(env).written is False  # nothing changed: left as it is
    assert docker("tag", PYTHON_IMAGE, tag).returncode == 0  # the tag moves on
    with spawn_runtime(env) as rt:
        # busybox, as locked: no python3 in it, though the tag names the python image now
        assert rt.execute("command -v python3").exit_code != 0
        assert any(f"{tag} names sha256:" in w and "lock" in w for w in rt.warnings), rt.warnings
    with pytest.raises(SpecError) as caught:  # the lock is not rewritten behind one's back
        lock_environment(env)
    assert "--update" in str(caught.value) and tag in str(caught.value)
    changed = lock_environment(env, update=True)
    assert changed.written and any(tag in c for c in changed.changes), changed
    with spawn_runtime(env) as rt:
        assert rt.execute("command -v python3").exit_code == 0 and not rt.warnings


def test_each_service_gets_its_own_pin_whatever_its_name(tmp_path: Path, tag: str) -> None:
    """Service names may hold dots: `a.b` and `a` are two services, each pinned as itself."""
    env = tmp_path / "env.yaml"
    env.write_text(
        f"version: 1\nname: lockdots\nimage: {BUSYBOX_IMAGE}\nservices:\n"
        f"  a.b: {{image: {PYTHON_IMAGE}, command: [sleep, '600']}}\n"
        f"  a: {{image: {tag}, command: [sleep, '600']}}\n"
    )
    lock_environment(env)
    with spawn_runtime(env) as rt:
        assert rt.service("a.b").execute("command -v python3").exit_code == 0
        assert rt.service("a").execute("command -v python3").exit_code != 0


def test_a_linked_file_is_locked_beside_the_link_and_no_other_file_is_replaced(
    tmp_path: Path, tag: str
) -> None:
    """A file given through a link (a dataset's) is locked beside the link, never in the
    folder the link points to; a file in the lock's place that is no lock is never
    overwritten, --update or not."""
    victim, dataset = tmp_path / "victim", tmp_path / "dataset"
    victim.mkdir()
    dataset.mkdir()
    (victim / "env.yaml").write_text(f"version: 1\nname: locklink\nimage: {tag}\n")
    (victim / "yarn.lock").write_text("the victim's own file\n")
    (dataset / "yarn").symlink_to(victim / "env.yaml")
    done = lock_environment(dataset / "yarn", update=True)
    assert done.path == dataset / "yarn.lock" and done.written
    assert (victim / "yarn.lock").read_text() == "the victim's own file\n"
    assert sorted(p.name for p in victim.iterdir()) == ["env.yaml", "yarn.lock"]
    (dataset / "yarn.lock").write_text("not a lock: someone's notes\n")
    with pytest.raises(SpecError, match="not"):
        lock_environment(dataset / "yarn", update=True)
    assert (dataset / "yarn.lock").read_text() == "not a lock: someone's notes\n"


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Path]:
    """A file that builds its image from a Dockerfile copying data.txt; its builds removed
    after, by tag."""
    name = f"lockb{uuid.uuid4().hex[:8]}"
    (tmp_path / "env.yaml").write_text(f"version: 1\nname: {name}\nbuild: {{context: .}}\n")
    (tmp_path / "Dockerfile").write_text(f"FROM {BUSYBOX_IMAGE}\nCOPY data.txt /data.txt\n")
    (tmp_path / "data.txt").write_text("one\n")
    try:
        yield tmp_path
    finally:
        listed = docker("image", "ls", f"orchestrator-build/{name}-main", "--format", "{{.ID}}")
        for ident in set(listed.stdout.split()):
            docker("image", "rm", "-f", ident)


def test_a_build_whose_inputs_changed_is_refused_until_update(built: Path) -> None:
    env = built / "env.yaml"
    lock_environment(env)
    with spawn_runtime(env) as rt:
        assert rt.read_file("/data.txt") == "one\n"
    (built / "data.txt").write_text("two\n")
    before = labelled_ids()
    with pytest.raises(SpecError) as caught:
        spawn_runtime(env)
    assert "inputs of build" in str(caught.value) and "--update" in str(caught.value)
    assert labelled_ids() <= before  # refused before anything started
    check = orch("validate", str(env))
    assert check.returncode == 2 and "env.yaml.lock" in check.stderr, check.stderr
    done = lock_environment(env, update=True)
    assert any(c.startswith("build:") for c in done.changes), done.changes
    with spawn_runtime(env) as rt:
        assert rt.read_file("/data.txt") == "two\n"


def test_a_build_whose_base_moved_is_refused(built: Path, tag: str) -> None:
    env = built / "env.yaml"
    (built / "Dockerfile").write_text(f"FROM {tag}\nCOPY data.txt /data.txt\n")
    lock_environment(env)
    assert f'"{tag}": sha256:' in (built / "env.yaml.lock").read_text()
    assert docker("tag", PYTHON_IMAGE, tag).returncode == 0  # the base moves on
    with pytest.raises(SpecError) as caught:
        spawn_runtime(env)
    assert f"starts from {tag}" in str(caught.value), caught.value


def test_a_hand_edited_lock_naming_an_id_the_engine_lacks_fails_first(
    tmp_path: Path, tag: str
) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(f"version: 1\nname: lockmiss\nimage: {tag}\n")
    lock_environment(env)
    lock = tmp_path / "env.yaml.lock"
    text = lock.read_text()
    ident = text.split("id: sha256:")[1].split()[0]
    lock.write_text(text.replace(ident, "0" * 64))
    before = labelled_ids()
    up = orch("up", str(env))
    assert up.returncode == 2 and "Traceback" not in up.stderr, up.stderr
    assert "does not have" in up.stderr and "docker load" in up.stderr, up.stderr
    assert "env.yaml.lock: images.image" in up.stderr, up.stderr
    assert labelled_ids() <= before


@pytest.mark.parametrize(
    "lock",
    [
        "version: 1\nfile: x\norchestrator: x\ntemplates: x\nimages: {image: {image: a, id: x}}\n",
        "version: 2\n",
        "[unclosed\n",
        "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
        "fifo",
        "link",
        "huge",
    ],
)
def test_a_lock_that_is_not_one_is_a_spec_error_not_a_hang(
    tmp_path: Path, tag: str, lock: str
) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(f"version: 1\nname: lockbad\nimage: {tag}\n")
    path = tmp_path / "env.yaml.lock"
    if lock == "fifo":
        os.mkfifo(path)  # a read would wait for a writer forever
    elif lock == "link":
        (tmp_path / "elsewhere").write_text("version: 1\n")
        path.symlink_to(tmp_path / "elsewhere")
    elif lock == "huge":
        path.write_text("# " + "x" * (2 * 1024 * 1024) + "\n")
    else:
        path.write_text(lock)
    got: list[BaseException | None] = []

    def start() -> None:
        try:
            spawn_runtime(env).cleanup()
            got.append(None)
        except BaseException as exc:
            got.append(exc)

    runner = threading.Thread(target=start, daemon=True)
    began = time.monotonic()
    runner.start()
    runner.join(60)
    assert got and time.monotonic() - began < 60, "a start on a hostile lock hung"
    assert isinstance(got[0], SpecError), got
    assert "env.yaml.lock" in str(got[0]), got[0]
