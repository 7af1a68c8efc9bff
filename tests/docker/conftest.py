from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, spawn_runtime
from orchestrator.backends.docker.network import EGRESS_DNS_ENV, EGRESS_NETWORK_ENV
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.testing.world import World, start_world
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, bounded

MakeEnv = Callable[..., Path]
"""make_env(body, name="t", image=PYTHON_IMAGE) -> the file's path."""


@contextmanager
def leaving_by_world() -> Iterator[World]:
    """A test world whose network and resolver the environments started meanwhile leave by
    (the caller's shared egress network), with no caller egress policy of the machine's."""
    with start_world() as started, pytest.MonkeyPatch.context() as patch:
        patch.setenv(EGRESS_NETWORK_ENV, started.network)
        patch.setenv(EGRESS_DNS_ENV, started.resolver_ip)
        patch.delenv("ORCHESTRATOR_EGRESS", raising=False)
        yield started


@pytest.fixture
def make_env(tmp_path: Path) -> MakeEnv:
    """Write an environment file from the lines given; return its path."""

    def make(body: str, name: str = "t", image: str = PYTHON_IMAGE) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"version: 1\nname: {name}\nimage: {image}\n{body}")
        return path

    return make


def spawn_in_mode(mode: str, env: Path, **options: Any) -> Runtime:
    """spawn_runtime with ORCHESTRATOR_EXEC_MODE=`mode` (auto, plain) for the spawn alone:
    the runtime reads it when it starts; the process's own value is put back after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCHESTRATOR_EXEC_MODE", mode)
        return spawn_runtime(env, **options)


def within(seconds: float, fn: Callable[[], object]) -> object:
    """fn's result; fails (not hangs) if it has not returned within `seconds`; re-raises."""
    outcome, _ = bounded(fn, seconds)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def same_tree(rt: ComposeRuntime, out: Path) -> bool:
    here = sorted(
        f"{p.relative_to(out).as_posix()} {p.stat().st_size}" for p in out.rglob("*") if p.is_file()
    )
    there = rt.execute("cd tree && find . -type f -exec stat -c '%n %s' {} + | cut -c3- | sort")
    return here == there.stdout.splitlines()


__all__ = ["BUSYBOX_IMAGE", "PYTHON_IMAGE", "MakeEnv", "same_tree", "within"]


_LOADED = """
import atexit, json, sys
entry, words = sys.argv[1], json.loads(sys.argv[2])
sys.argv = ["orchestrator", *words]
# at exit, however it comes (`ps` and `down` leave without the interpreter's teardown)
atexit.register(
    lambda: print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})), file=sys.stderr)
)
__import__(entry, fromlist=["main"]).main()
"""


def loaded_by(entry: str, *args: str) -> tuple[str, set[str]]:
    """What `orchestrator ARGS` printed, started at module `entry`'s main (the command's
    own start, orchestrator.endpoint, or the full CLI, orchestrator.cli), and the top-level
    modules it loaded. Its exit status is the command's: a failed command (its error on
    stderr) is not taken for one that printed nothing."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, entry, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, set(json.loads(done.stderr.splitlines()[-1]))


_REACH = (
    "import os, socket, sys\n"
    "try:\n"
    "    os.chdir(sys.argv[1]); socket.socket(socket.AF_UNIX).connect(sys.argv[2])\n"
    "    print('CONNECTED')\n"
    "except PermissionError:\n"
    "    print('DENIED')\n"
)


def reaches(folder: Path, name: str, *, as_nobody: bool) -> str:
    """Whether a process of this machine connects to the socket `name` in `folder`:
    CONNECTED or DENIED; `as_nobody`: as another local user (needs root and setpriv)."""
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [sys.executable, "-I", "-c", _REACH, str(folder), name]
    done = subprocess.run(
        [*nobody, *argv] if as_nobody else argv, capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip()


@contextmanager
def engine_events(*kinds: str, settled: Sequence[str] = ()) -> Iterator[list[dict[str, object]]]:
    """The engine's events of these kinds (die, start, disconnect...) from the block's start
    to its end, as they came (filled in once it ends). Watched as they happen, never asked
    of the engine's history afterwards: it keeps only its last 256 events, which a loaded
    run's other workers overran once (the test then saw none). The watch is known to have
    begun, and to have been given all that came before the block's end, by a marker event
    of our own seen on it (a volume made and removed): guessed times (half a second to
    subscribe, a second after the end) lost a container's `die` once under load. `settled`:
    containers whose `die` the block's end must have seen (each one's `stop` returned)."""
    argv = ["docker", "events", "--filter", "event=create"]
    argv += [a for kind in kinds for a in ("--filter", f"event={kind}")]
    got: list[dict[str, object]] = []
    marks: set[str] = set()
    seen = threading.Condition()

    def read(lines: Iterator[bytes]) -> None:
        # (read as bytes, lines end at "\n" only: another test's label may hold U+0085 or
        # U+2028 unescaped)
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            actor = event.get("Actor") or {}
            if event.get("Type") == "volume" and event.get("Action") == "create":
                with seen:
                    marks.add(str(actor.get("ID", "")))
                    seen.notify_all()
            elif event.get("Action") in kinds:
                got.append(event)

    def mark(within: float = 60) -> None:
        """Make marker events until one is seen on the watch (one made before the watch
        began is never seen: another is made two seconds on)."""
        deadline = time.monotonic() + within
        while True:
            name = f"orch-test-mark-{uuid.uuid4().hex[:12]}"
            label = ["--label", "org.orchestrator.test=1"]
            try:
                subprocess.run(["docker", "volume", "create", *label, name], **QUIET)
            finally:
                subprocess.run(["docker", "volume", "rm", "-f", name], **QUIET)
            with seen:
                if seen.wait_for(functools.partial(set.__contains__, marks, name), timeout=2):
                    return
            assert time.monotonic() < deadline, "the engine's events never showed our marker"

    with subprocess.Popen([*argv, "--format", "{{json .}}"], stdout=subprocess.PIPE) as watch:
        assert watch.stdout is not None
        reader = threading.Thread(target=read, args=(iter(watch.stdout),), daemon=True)
        reader.start()
        try:
            mark()
            yield got
            if settled:  # the engine says a container died just after `stop` returns, under
                # the container's lock, which an inspect waits for
                subprocess.run(["docker", "inspect", *settled], capture_output=True, timeout=60)
            mark()
        finally:
            watch.terminate()
            watch.wait(timeout=60)
            reader.join(timeout=60)


QUIET: dict[str, Any] = {"capture_output": True, "timeout": 60, "check": True}


def killed_owner(script: str, *args: str) -> list[str]:
    """Run a Python `script` (with `args`) as an owner process, read the first line it
    prints, then SIGKILL it: that line's words (empty when it printed none)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    with proc:
        try:
            assert proc.stdout is not None
            return proc.stdout.readline().split()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
