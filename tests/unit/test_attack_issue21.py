"""Hostile review of issue 21's change (no engine needed): a local user planting the build
lock of scripts/build-images, and a hostile environment file whose service build context the
policy refuses (it must not be walked and read first)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Policy, PolicyError, backend_class, load_environment
from orchestrator.backends.docker import fingerprint as prints

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images"

# every image is "there": the script only takes its lock and looks
FAKE_DOCKER = "#!/bin/sh\nexit 0\n"
# flock FD: record which file the script locked, and say it is ours at once (never wait on
# the machine's real lock, which a full test run may hold)
FAKE_FLOCK = '#!/bin/sh\nreadlink "/proc/self/fd/9" > "$FAKE_STATE/locked"\nexit 0\n'


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    if sys.platform != "linux":
        pytest.skip("scripts/build-images is for Debian hosts")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("flock", FAKE_FLOCK)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ORCHESTRATOR_BUILD_LOCK"}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "FAKE_STATE": str(state)}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_build_lock_does_not_follow_a_planted_symlink(fake: dict[str, str], tmp_path: Path) -> None:
    """The script runs as root (bootstrap, the test suite). A lock path another account
    could plant (the default lives in the shared /tmp, and fs.protected_symlinks may be 0)
    must not be followed: `exec 9>>"$LOCK"` creates whatever file the link names (say
    /etc/nologin, which locks every other user out)."""
    target = tmp_path / "victim" / "nologin"
    target.parent.mkdir()
    link = tmp_path / "orchestrator-build-images.lock"
    link.symlink_to(target)
    done = _run({**fake, "ORCHESTRATOR_BUILD_LOCK": str(link)}, "busybox")
    assert not target.exists(), (
        f"build-images followed the symlink {link} and created {target} (rc "
        f"{done.returncode}, stderr {done.stderr!r})"
    )


def test_default_build_lock_is_not_in_a_world_writable_folder(fake: dict[str, str]) -> None:
    """The default lock must be where no other account can create it first: in a world-
    writable folder (/tmp) another user can plant a symlink there, or create the file and
    hold the lock, stalling every build on the machine for 20 minutes."""
    done = _run(fake, "busybox")
    locked = Path(fake["FAKE_STATE"]) / "locked"
    assert locked.exists(), f"the script took no lock: {done.stderr}"
    where = Path(locked.read_text().strip())
    mode = os.stat(where.parent).st_mode
    assert not mode & stat.S_IWOTH, (
        f"the default build lock {where} lies in {where.parent}, which every account may "
        f"write (mode {stat.filemode(mode)})"
    )


def test_refused_service_build_context_is_not_fingerprinted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service's `build.context` that the policy refuses (a secret folder, a folder outside
    the allowed roots) must be refused before anything reads it: today the fingerprint walks
    it (up to 20 000 entries / 2 s) and reads its Dockerfile (up to 1 MiB) first. The main
    sandbox's build is fingerprinted only after the check; a service's is not."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "Dockerfile").write_text("FROM scratch\n")
    (outside / "private.key").write_text("not for the file's author\n")
    folder = tmp_path / "env"
    folder.mkdir()
    path = folder / "env.yaml"
    path.write_text(
        "version: 1\nname: attack21\nimage: orchestrator-test/busybox:1\n"
        f"services:\n  db:\n    build: {{context: {outside}}}\n"
    )
    walked: list[Path] = []
    real = prints.fingerprint

    def spy(context: Path, *args: object, **kwargs: object) -> tuple[str, bool]:
        walked.append(context)
        return real(context, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("orchestrator.backends.docker.buildplan.fingerprint", spy)
    env = load_environment(path)
    with pytest.raises(PolicyError, match="outside the allowed roots"):
        backend_class(env).check(env, Policy.from_env())
    assert outside not in walked, "the refused context was walked and its Dockerfile read"


def test_validate_refuses_a_fifo_dockerfile(tmp_path: Path) -> None:
    """A dataset archive can carry a FIFO named Dockerfile. `validate` says ok, and `up`
    then hangs in the builder (which opens it) for the whole up timeout (900 s by default)
    and blames the engine ("the engine did not answer in time"). A Dockerfile that is not a
    regular file is a spec error, found before anything starts."""
    (tmp_path / "Dockerfile").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "Dockerfile")
    path = tmp_path / "env.yaml"
    path.write_text("version: 1\nname: attack21fifo\nbuild: {context: .}\n")
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "dockerfile" in done.stderr.lower()
    assert "Traceback" not in done.stderr


def test_fingerprint_sees_an_edit_that_keeps_size_and_mtime(tmp_path: Path) -> None:
    """`cp -p`, `tar -x`, `rsync -t` and `touch -r` keep a file's modification time; an edit of
    the same size then leaves the fingerprint, hence the tag, unchanged, and `up` runs the
    stale image. The inode change time (which no user can set) catches it at no cost."""
    from orchestrator.backends.docker.fingerprint import fingerprint

    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY app.py /\n")
    app = tmp_path / "app.py"
    app.write_text("print('v1')\n")
    before_stat = app.stat()
    before, complete = fingerprint(tmp_path, None, {})
    assert complete
    app.write_text("print('v2')\n")  # same size
    os.utime(app, ns=(before_stat.st_atime_ns, before_stat.st_mtime_ns))
    after, _ = fingerprint(tmp_path, None, {})
    assert after != before, "an edit that kept size and mtime kept the build's tag"


def test_fingerprint_sees_an_edit_of_a_linked_dockerfile(tmp_path: Path) -> None:
    """`app/Dockerfile -> ../docker/Dockerfile` (the policy allows it: the target lies under
    the file's folder) is followed by the builder, but the fingerprint hashes only the
    link's own metadata, and the target lies outside the walked context: an edit of the
    Dockerfile that is built keeps the tag, and `up` runs the stale image (issue 21 item 1
    again, for a common layout)."""
    from orchestrator.backends.docker.fingerprint import fingerprint

    (tmp_path / "docker").mkdir()
    real = tmp_path / "docker" / "Dockerfile"
    real.write_text("FROM scratch\nENV BUILT=yes\n")
    app = tmp_path / "app"
    app.mkdir()
    (app / "Dockerfile").symlink_to(Path("..") / "docker" / "Dockerfile")
    before, _ = fingerprint(app, None, {})
    real.write_text("FROM scratch\nENV BUILT=v2\n")
    after, _ = fingerprint(app, None, {})
    assert after != before, "an edit of the Dockerfile the builder reads kept the build's tag"
