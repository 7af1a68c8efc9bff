"""The state folder: absolute whatever the variables say, so every command and process finds
the same one; a relative ORCHESTRATOR_STATE_DIR is a usage error naming it (exit 2)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import UsageError
from orchestrator.paths import projects_dir, state_dir

CLI = Path(sys.executable).with_name("orchestrator")


@pytest.fixture
def no_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("ORCHESTRATOR_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_default_is_under_the_home_folder(no_state_dir: Path) -> None:
    assert state_dir() == no_state_dir / ".local" / "state" / "orchestrator"
    assert projects_dir() == state_dir() / "projects"


def test_an_absolute_xdg_state_home_is_used(
    no_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(no_state_dir / "xdg"))
    assert state_dir() == no_state_dir / "xdg" / "orchestrator"


def test_a_relative_xdg_state_home_is_ignored_as_xdg_says(
    no_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "state")
    assert state_dir() == no_state_dir / ".local" / "state" / "orchestrator"


def test_an_empty_home_does_not_make_the_folder_relative(
    no_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", "")
    assert state_dir().is_absolute()


def test_the_variable_wins_and_takes_a_tilde(
    no_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", "~/mine")
    assert state_dir() == no_state_dir / "mine"


@pytest.mark.parametrize("value", ["state", "./state", "~user-that-is-not-there/x"])
def test_a_relative_state_dir_names_the_variable(
    value: str, no_state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", value)
    with pytest.raises(UsageError, match="ORCHESTRATOR_STATE_DIR must be an absolute path"):
        state_dir()


def test_the_cli_exits_2_on_a_relative_state_dir(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": "state"}
    done = subprocess.run(
        [str(CLI), "snapshot", "--list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "ORCHESTRATOR_STATE_DIR must be an absolute path" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "state").exists()


_FORK_IN_A_LOCK = """
import os, sys
from orchestrator.paths import lock_descriptor, open_for_lock
lock, log = sys.argv[1], sys.argv[2]
pid = -1
try:
    with lock_descriptor(open_for_lock(lock, os.O_RDWR | os.O_CREAT)) as fd:
        pid = os.fork()
        if pid == 0:
            out = open(log, "w")  # takes the number the fork freed in the child
            print(out.fileno() == fd, file=sys.stderr)
finally:
    if pid == 0:  # the child left the block
        out.write("still open")
        out.close()
        os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_child_forked_inside_a_lock_block_keeps_what_reuses_its_number(tmp_path: Path) -> None:
    """The child's copy of a lock descriptor is closed at fork; leaving the block in the
    child must not close whatever the child opened since under that number."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_IN_A_LOCK, str(tmp_path / "lock"), str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "True"  # the child did reuse the number
    assert (tmp_path / "log").read_text() == "still open"


@pytest.mark.parametrize("kind", ["char device", "fifo", "link to a device", "regular"])
def test_read_regular_never_opens_what_is_not_a_regular_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A path a label names may be a device node a sandbox's root made (reachable through
    /proc/PID/root): its driver acts on an open, so nothing but a regular file is ever
    opened for reading; a FIFO would make us wait."""
    from orchestrator import paths

    target = tmp_path / "owner"
    if kind == "char device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "link to a device":
        target.symlink_to("/dev/null")
    else:
        target.write_text("1 2 host\n")
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: object) -> int:
        opened.append((os.fspath(path), flags))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    got = paths.read_regular(target, 100)
    readable = [p for p, flags in opened if not flags & getattr(os, "O_PATH", 0)]
    if kind == "regular":
        assert got == b"1 2 host\n" and len(readable) == 1
    else:
        assert got is None and readable == [], opened
    assert paths.read_regular(target, 100, follow=True) == (
        None if kind != "regular" else b"1 2 host\n"
    )


def test_read_regular_without_proc_still_reads_a_regular_file_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a mount namespace without /proc, the handle cannot be reopened through it: the
    file is checked, opened, and must be the one checked."""
    from orchestrator import paths

    real_open = os.open

    def no_proc(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: object) -> int:
        if os.fspath(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(2, "no /proc here")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_proc)
    regular, fifo = tmp_path / "owner", tmp_path / "fifo"
    regular.write_text("1 2 host\n")
    os.mkfifo(fifo)
    assert paths.read_regular(regular, 100) == b"1 2 host\n"
    assert paths.read_regular(fifo, 100) is None
