"""Hostile review of issue 37, items 4 and 8: builds that ignored the file's egress, its limits
and the caller's isolation, and images pulled from whatever registry a file names. Each test
states the attack; each fails on the code before the fix. The only network peer is a
listener of the test's own on 127.0.0.1, which counts who connects."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import PolicyError, SpecError, load_environment, spawn_runtime
from orchestrator.backends.docker import build as build_mod
from orchestrator.backends.docker.buildplan import ImageBuild, build_tags
from orchestrator.spec.policy import Policy
from tests.conftest import BUSYBOX_IMAGE, labelled_ids


class Listener:
    """A TCP listener on 127.0.0.1 that answers nothing and counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.seen = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.seen += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    got = Listener()
    yield got
    got.close()


def _project(tmp_path: Path, dockerfile: str, body: str = "") -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "Dockerfile").write_text(dockerfile)
    (folder / "data.txt").write_text("in the context\n")
    env = folder / "env.yaml"
    env.write_text(f"version: 1\nname: b37\nbuild: {{context: .}}\n{body}")
    return env


def _remove_builds(env_file: Path) -> None:
    for tag in build_tags(load_environment(env_file)):
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def test_add_of_a_url_is_refused_and_nothing_is_fetched(tmp_path: Path, listener: Listener) -> None:
    """Item 4: an `egress: none` file's `ADD http://127.0.0.1:PORT/` was fetched by the engine
    itself, from the host's own network namespace, and put a host secret in the image. The
    Dockerfile is refused at its field before anything runs; the listener sees nobody."""
    env_file = _project(
        tmp_path,
        f"FROM {BUSYBOX_IMAGE}\nADD http://127.0.0.1:{listener.port}/secret /secret\n",
    )
    before = labelled_ids()
    with pytest.raises(SpecError) as err:
        spawn_runtime(load_environment(env_file))
    assert "build.dockerfile" in str(err.value) and "line 2: ADD" in str(err.value)
    assert listener.seen == 0 and labelled_ids() == before
    validate = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", str(env_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert validate.returncode == 2 and "ADD http://127.0.0.1" in validate.stderr


def test_a_build_runs_without_network_and_within_the_files_limits(tmp_path: Path) -> None:
    """Item 4: RUN steps ran on the default bridge (reaching host listeners) with no limit at
    all. They run with the network of the container the image is for (none unless its
    egress is all) and its memory and CPU limits."""
    env_file = _project(
        tmp_path,
        f"FROM {BUSYBOX_IMAGE}\n"
        "RUN ls /sys/class/net > /netifs && cd /sys/fs/cgroup && "
        "(cat memory.max cpu.max memory/memory.limit_in_bytes cpu/cpu.cfs_quota_us; true) "
        "> /limits 2>/dev/null\n",
        "resources: {memory: 96m, cpus: 0.5}\n",
    )
    try:
        with spawn_runtime(load_environment(env_file)) as rt:
            got = rt.execute("cat /netifs; echo --; cat /limits")
        nets, _, limits = got.stdout.partition("--\n")
        assert nets.split() == ["lo"], got
        assert str(96 * 1024 * 1024) in limits.split(), got
        assert "50000" in limits.split(), got  # cgroup v1's quota, or v2's "50000 100000"
    finally:
        _remove_builds(env_file)


def test_a_build_is_refused_when_the_caller_requires_gvisor(tmp_path: Path) -> None:
    """Item 4: under ORCHESTRATOR_ISOLATION=gvisor a build's RUN steps ran on the host's
    kernel. Such a build is refused at its field unless the caller allows it."""
    env_file = _project(tmp_path, f"FROM {BUSYBOX_IMAGE}\nRUN true\n")
    with pytest.raises(PolicyError) as err:
        spawn_runtime(load_environment(env_file), policy=Policy(isolation="gvisor"))
    assert "build" in str(err.value) and "ORCHESTRATOR_ALLOW_HOST_BUILD=1" in str(err.value)


def test_a_context_swapped_after_its_check_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1 for builds: the context, checked, was then read by the docker CLI by path: a
    sandbox that swapped it for a link put whatever the link names in the image. The build
    reads a private copy made without following links: a swap is refused, not built."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("host secret\n")
    env_file = _project(tmp_path, f"FROM {BUSYBOX_IMAGE}\nCOPY . /ctx\n")
    context = env_file.parent
    copy = build_mod._checked_copy

    def swapped(plan: ImageBuild, folder: Path, host: str) -> tuple[Path, Path]:
        aside = context.with_name("aside")
        context.rename(aside)
        context.symlink_to(secret)
        try:
            return copy(plan, folder, host)
        finally:
            context.unlink()
            aside.rename(context)

    monkeypatch.setattr(build_mod, "_checked_copy", swapped)
    try:
        with pytest.raises(SpecError, match="changed after it was checked"):
            spawn_runtime(load_environment(env_file))
    finally:
        _remove_builds(env_file)


def test_a_missing_base_image_is_never_pulled(tmp_path: Path, listener: Listener) -> None:
    """Item 8: a build's FROM of an image the engine lacks made it pull from whatever
    registry the name says (it sent a host listener the engine's and kernel's versions).
    It is refused, naming the image and the fix; nobody is contacted."""
    env_file = _project(tmp_path, f"FROM 127.0.0.1:{listener.port}/base:1\nRUN true\n")
    with pytest.raises(SpecError) as err:
        spawn_runtime(load_environment(env_file))
    assert "ORCHESTRATOR_ALLOW_PULL=1" in str(err.value) and listener.seen == 0


def test_a_missing_image_is_never_pulled(tmp_path: Path, listener: Listener) -> None:
    """Item 8: `image:` the engine lacks made it pull (the rendered project always said
    pull_policy: missing, `x-local` and `pull_policy: never` notwithstanding). The start is
    refused at the field, before anything is made, and no registry is contacted; for a
    service, and for a Compose file, too."""
    image = f"127.0.0.1:{listener.port}/missing:1"
    before = labelled_ids()
    for body in (
        f"version: 1\nname: p37\nimage: {image}\n",
        f"version: 1\nname: p37s\nimage: {BUSYBOX_IMAGE}\nservices: {{db: {{image: {image}}}}}\n",
    ):
        env_file = tmp_path / "env.yaml"
        env_file.write_text(body)
        with pytest.raises(SpecError) as err:
            spawn_runtime(load_environment(env_file))
        assert "ORCHESTRATOR_ALLOW_PULL=1" in str(err.value), err.value
        assert "image" in str(err.value)
    compose = tmp_path / "compose.yaml"
    compose.write_text(f"services:\n  default:\n    image: {image}\n    pull_policy: always\n")
    with pytest.raises((SpecError, PolicyError)):
        spawn_runtime(load_environment(compose))
    assert listener.seen == 0 and labelled_ids() == before
