"""Shared test plumbing: Docker detection (skip locally, fail under CI=true), automatic
markers, and the leak check that fails any Docker test leaving our labelled objects behind."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from orchestrator import Runtime
from orchestrator.backends.container.engine import api
from orchestrator.backends.docker import gateway
from orchestrator.backends.docker.build import CONTEXT_LABEL
from orchestrator.errors import OrchestratorError
from tests import grouping, rewrite_cache

ROOT = Path(__file__).resolve().parent.parent
PYTHON_IMAGE = os.environ.get("ORCHESTRATOR_PYTHON_IMAGE", "orchestrator-test/python:3.11")
BUSYBOX_IMAGE = os.environ.get("ORCHESTRATOR_BUSYBOX_IMAGE", "orchestrator-test/busybox:1")
LABEL = "org.orchestrator.managed=1"

# The suite is the caller of the many files here that say `backend: local`: it allows files
# to choose the unisolated backend (the attack tests that prove the refusal unset this).
os.environ["ORCHESTRATOR_ALLOW_UNISOLATED"] = "1"


def _ok(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def docker_problem() -> str | None:
    """Why Docker tests cannot run here, or None when they can."""
    if not _ok(["docker", "info"]):
        return "no reachable Docker engine (run scripts/bootstrap-docker)"
    if not _ok(["docker", "compose", "version"]):
        return "the Docker Compose v2 plugin is missing (run scripts/bootstrap-docker)"
    for image in (PYTHON_IMAGE, BUSYBOX_IMAGE):
        if not _ok(["docker", "image", "inspect", image]):
            return f"test image {image} is missing (run scripts/build-images)"
    if not _ok(["docker", "image", "inspect", gateway.LOCAL_BASE]):  # no registry to pull from
        return f"{gateway.LOCAL_BASE} is missing (run scripts/build-images gateway)"
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(why: str) -> NoReturn:
    """A test that cannot run on this machine (`why` says what is missing): skipped, but
    failed in CI (CI=true), where everything it needs must be there."""
    if in_ci():
        pytest.fail(f"CI=true but {why}")
    pytest.skip(why)


def marked(item: pytest.Item, name: str) -> bool:
    """Whether `item` carries the marker `name` (not merely the word among its keywords,
    where a parameter's id puts it too: a unit test's `[swarm]` started the test Swarm)."""
    return item.get_closest_marker(name) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec else {}
        target = params.get("conformance_target")
        backend = getattr(target, "backend", "")
        on_docker = backend in ("docker", "swarm") or str(params.get("config", "")).startswith(
            "docker"
        )
        if "docker" in path.parts or on_docker:
            item.add_marker(pytest.mark.docker)
        if (
            backend == "swarm"
            or "swarm" in path.parts
            or getattr(target, "id", "") == "docker-remote"
        ):
            item.add_marker(pytest.mark.swarm)
            item.add_marker(pytest.mark.usefixtures("swarm_cluster"))
        if getattr(target, "id", "") == "docker-podman" or "podman" in path.stem:
            item.add_marker(pytest.mark.podman)
            item.add_marker(pytest.mark.usefixtures("podman_engine"))
    # the Swarm's tests last: its cluster starts in the background meanwhile (see below);
    # within each part, the tests that share a module's environment first (each group goes
    # whole to one worker, in the order the groups first come: tests/grouping.py)
    groups = grouping.groups_of(items)
    items[:] = sorted(items, key=lambda item: (marked(item, "swarm"), item.nodeid not in groups))
    if os.environ.get("PYTEST_XDIST_WORKER") and RUN_DIR_ENV in os.environ:
        grouping.write(groups, Path(os.environ[RUN_DIR_ENV]))
    problem = docker_problem() if any(marked(i, "docker") for i in items) else None
    _DOCKER_OK[:] = [problem is None]
    if problem is None:
        return  # (what the run needs is prepared once the selection is known: below)
    for item in items:
        if marked(item, "docker"):
            if in_ci():
                item.add_marker(pytest.mark.usefixtures("_docker_required_in_ci"))
            else:
                item.add_marker(pytest.mark.skip(reason=f"Docker test skipped: {problem}"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Prepare what the selected tests need, once `-k` and `-m` have deselected the rest
    (they do so after the hook above): a run of one test started the test Swarm."""
    if _DOCKER_OK == [True] and any(marked(i, "docker") for i in session.items):
        _prepare_in_background(session.items)


_DOCKER_OK: list[bool] = []
"""Whether the collection found Docker tests could run here (docker_problem: asked once)."""


PREPARED = "prepare.started"
_PREPARING: list[subprocess.Popen[bytes]] = []
"""The background starts of this worker (held: they run on past the collection)."""
PREPARE_DEADLINE = 900
"""Seconds the background start of the test Swarm may take (its node image and cluster)."""


def _prepare_in_background(items: list[pytest.Item]) -> None:
    """Start, once per run (the first worker to collect), what the collected tests would
    otherwise wait for when they come to it, in the background: Harbor's image (under
    build-images' own lock, which `build_test_image` waits on) and the test Swarm's node
    image and cluster (under the run's swarm lock, which `swarm_manager` waits on; its
    tests come last). A worker blocked on those took a minute or more of the run. What
    fails here is met again, and reported, by the fixture that needs it."""
    run_dir = Path(os.environ.get(RUN_DIR_ENV, ""))
    if RUN_DIR_ENV not in os.environ or not run_dir.is_dir():
        return
    try:
        os.close(os.open(run_dir / PREPARED, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return
    build = ["bash", str(ROOT / "scripts" / "build-images")]
    with open(run_dir / "prepare.log", "ab") as log:
        if any("harbor_image" in getattr(i, "fixturenames", ()) for i in items):
            _PREPARING.append(
                subprocess.Popen(
                    ["timeout", f"{BUILD_DEADLINE:g}", *build, "harbor"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            )
        if not any(marked(i, "swarm") for i in items):
            return
        with open(run_dir / "swarm.lock", "w") as lock:
            try:  # held by the background start until it ends (its processes hold the fd)
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a worker is starting it already
            if _ok(["docker", "network", "inspect", "orch-cluster"]):
                return
            script = " ".join(build) + f" swarm >/dev/null && {CLUSTER} up {SWARM_NODES}"
            _PREPARING.append(
                subprocess.Popen(
                    ["timeout", str(PREPARE_DEADLINE), "bash", "-c", script],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(lock.fileno(),),
                    start_new_session=True,
                )
            )
            (run_dir / SWARM_STARTED).touch()  # removed when the whole run ends


@pytest.fixture
def _docker_required_in_ci() -> None:
    pytest.fail(f"CI=true but Docker tests cannot run: {docker_problem()}")


def main_container(rt: Runtime) -> str:
    """The main container of a Docker runtime (for tests that act on it from outside)."""
    container = rt.info().container
    assert container is not None, f"{rt.name} runtime has no container"
    return container


def pause_container(container: str, tries: int = 5) -> None:
    """`docker pause` from outside, as a user would, tried again while the cgroup freezer
    gives up ("unable to freeze": on a loaded machine it can lose the race with processes
    forking; the library's own pause tries again the same way)."""
    for attempt in range(tries):
        done = subprocess.run(
            ["docker", "pause", container], capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0:
            return
        state = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Paused}}", container],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if state.stdout.strip() == "true":
            return  # the freezer got there after all
        assert "unable to freeze" in done.stderr and attempt < tries - 1, done.stderr
        time.sleep(0.2 * (attempt + 1))


def in_background(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """`call` started on a thread of its own (a daemon), and the list that will hold what it
    returned or raised once it ends."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def bounded(call: Callable[[], object], within: float) -> tuple[object, float]:
    """What `call` returned or raised, and how long it took; fails if it outlives `within`
    seconds (on a hanging call the thread is left behind, the runtime's cleanup ends it)."""
    started = time.monotonic()
    thread, out = in_background(call)
    thread.join(within)
    assert not thread.is_alive(), f"the call did not end within {within} s"
    return out[0], time.monotonic() - started


_SESSION_ROOT: list[str] = []
"""This test session's temporary root: every project folder of the session lies below it."""


PODMAN = "unix:///run/podman/podman.sock"
"""Root Podman's API socket, where scripts/bootstrap-podman starts it."""


def labelled_ids(host: str = "") -> set[str]:
    """Ids of every container, network, volume and snapshot image this session made: our
    label, and a project (or state) folder under the session's temporary root. Another
    run's on the same machine are not ours to count or to remove. `host`: another engine
    (Podman's), whose ids come prefixed with it. Asked of the engine's API on its socket
    where it has one here (a listing each, in this process: twice per module, a docker
    CLI per listing cost the run half a minute of CPU), else through the docker CLI."""
    root = _SESSION_ROOT[0] if _SESSION_ROOT else ""
    sock = _local_socket(host)
    listed = _listed_by_api(sock, root) if sock else _listed_by_cli(host, root)
    ids = {f"{host}|{i}" if host else i for i in listed}
    return ids if host else ids | _snapshot_images(root, sock)


def _local_socket(host: str) -> str | None:
    """The unix socket of `host` (or of the process's engine), if it is one on this
    machine; None for another kind of address (asked through the CLI)."""
    path = api.local_socket(host)
    return path if path is not None and os.path.exists(path) else None


def _api_get(sock: str, path: str, labels: list[str]) -> object:
    """GET `path` of the engine's API on `sock`, filtered by `labels` (bounded: 60 s)."""
    query = {"all": "1", "filters": json.dumps({"label": labels})}
    return api.call(f"listing {path}", sock, "GET", path, query=query, timeout=60)


def _listed_by_api(sock: str, root: str) -> set[str]:
    folder = "org.orchestrator.dir"
    out: set[str] = set()
    for kind, path, key, short in (
        ("ps", "/containers/json", "Id", True),
        ("network", "/networks", "Id", True),
        ("volume", "/volumes", "Name", False),
    ):
        got = _api_get(sock, path, [LABEL])
        rows = got.get("Volumes") or [] if isinstance(got, dict) else got
        assert isinstance(rows, list), got
        for row in rows:
            ident = str(row[key])[:12] if short else str(row[key])
            if ident and str((row.get("Labels") or {}).get(folder, "")).startswith(root):
                out.add(f"{kind}:{ident}")
    return out


def _listed_by_cli(host: str, root: str) -> set[str]:
    folder = '{{.Label "org.orchestrator.dir"}}'
    docker = ["docker", "--host", host] if host else ["docker"]
    out: set[str] = set()
    for kind, ident in (
        (["ps", "-a"], "{{.ID}}"),
        (["network", "ls"], "{{.ID}}"),
        (["volume", "ls"], "{{.Name}}"),
    ):
        listing = subprocess.run(
            [*docker, *kind, "--filter", f"label={LABEL}", "--format", f"{ident} {folder}"],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in listing.stdout.splitlines():
            name, _, where = line.partition(" ")
            if name and where.startswith(root):
                out.add(f"{kind[0]}:{name}")
    return out


def _snapshot_images(root: str, sock: str | None) -> set[str]:
    """Snapshot images made with a state folder under `root` (`image ls` cannot print
    labels: through the CLI, they are inspected)."""
    state = "org.orchestrator.snapshot.state"
    if sock is not None:
        got = _api_get(sock, "/images/json", [state])
        assert isinstance(got, list), got
        return {
            f"image:{row['Id']}"
            for row in got
            if str((row.get("Labels") or {}).get(state, "")).startswith(root)
        }
    listed = subprocess.run(
        ["docker", "image", "ls", "-q", "--no-trunc", "--filter", f"label={state}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not listed:
        return set()
    fmt = f'{{{{.Id}}}} {{{{index .Config.Labels "{state}"}}}}'
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", fmt, *listed],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found = (line.partition(" ") for line in out.splitlines())
    return {f"image:{ident}" for ident, _, where in found if where.startswith(root)}


@pytest.fixture(scope="module", autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a module of Docker tests that leaves labelled containers, networks, volumes or
    snapshot images."""
    uses_docker = any(
        marked(item, "docker")
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    )
    if not uses_docker or docker_problem() is not None:
        yield
        return
    uses_podman = any(
        marked(item, "podman")
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    ) and os.path.exists(PODMAN.removeprefix("unix://"))

    def ours() -> set[str]:
        return labelled_ids() | (labelled_ids(PODMAN) if uses_podman else set())

    before = ours()
    yield
    leaked = ours() - before
    if leaked:
        what = _described(leaked)  # before removal: what the failure says of each
        order = {"ps": 0, "network": 1, "volume": 2, "image": 3}  # a network in use stays
        kinds = {ident: ident.rpartition("|")[2].partition(":") for ident in leaked}
        for ident in sorted(leaked, key=lambda i: order[kinds[i][0]]):
            # remove only what this module created, by id
            kind, _, i = kinds[ident]
            host = ident.rpartition("|")[0]
            argv = {
                "ps": ["rm", "-f", "-v"],
                "network": ["network", "rm"],
                "volume": ["volume", "rm", "-f"],
                "image": ["rmi", "-f"],
            }[kind]
            docker = ["docker", "--host", host] if host else ["docker"]
            subprocess.run([*docker, *argv, i], capture_output=True, check=False)
        pytest.fail(f"{request.module.__name__} leaked Docker objects: {sorted(leaked)}\n{what}")


def _described(leaked: set[str]) -> str:
    """Each leaked container's name, state, creation time and labels, one line each: what
    tells which test (and which step of it) left it."""
    lines = []
    for ident in sorted(leaked):
        host, _, rest = ident.rpartition("|")
        kind, _, name = rest.partition(":")
        if kind != "ps":
            continue
        docker = ["docker", "--host", host] if host else ["docker"]
        fmt = "{{.Name}} {{.State.Status}} {{.Created}} {{json .Config.Labels}}"
        out = subprocess.run(
            [*docker, "inspect", "--format", fmt, name],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        lines.append(f"  {name}: {(out.stdout or out.stderr).strip()}")
    return "\n".join(lines)


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` first on PATH that only appends its arguments to the file returned (which
    exists once anything ran it): what reaching an `ssh://` engine would start, and no
    traffic at all."""
    bin_dir, ran = tmp_path / "fake-ssh-bin", tmp_path / "ssh-ran"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {ran}\nexit 255\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return ran


@pytest.fixture(scope="session", autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep project folders of test runs out of the user's state dir."""
    old = os.environ.get("ORCHESTRATOR_STATE_DIR")
    _SESSION_ROOT[:] = [str(tmp_path_factory.getbasetemp())]
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(tmp_path_factory.getbasetemp() / "state")
    yield
    _remove_builds(_SESSION_ROOT[0])
    if old is None:
        os.environ.pop("ORCHESTRATOR_STATE_DIR", None)
    else:
        os.environ["ORCHESTRATOR_STATE_DIR"] = old


def _remove_builds(root: str) -> None:
    """Remove the images this session built from contexts under its root, by id (never
    forced: one a container still uses stays, and the module that left that container
    fails). The engine keeps a build as a cache for the next spawn of its file; a test's
    file lives in a temporary folder no later run sees again."""
    for host in ("", PODMAN):
        sock = _local_socket(host)
        if sock is None or docker_problem() is not None:
            continue
        with contextlib.suppress(OrchestratorError):
            rows = _api_get(sock, "/images/json", [CONTEXT_LABEL])
            for row in rows if isinstance(rows, list) else []:
                context = str((row.get("Labels") or {}).get(CONTEXT_LABEL, ""))
                if context == root or context.startswith(root.rstrip("/") + "/"):
                    with contextlib.suppress(OrchestratorError):
                        api.call(
                            "removing a test build",
                            sock,
                            "DELETE",
                            f"/images/{row['Id']}",
                            timeout=60,
                        )


NODE_IMAGE = os.environ.get("ORCHESTRATOR_NODE_IMAGE", "orchestrator-test/node:1")
SWARM_LABEL = "org.orchestrator.managed=1"


def _lines(argv: list[str]) -> list[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return [line for line in out.stdout.splitlines() if line.strip()]


def swarm_ids(manager: str) -> set[str]:
    """Our services and networks on the Swarm, and our containers on each of its nodes,
    whose project folder lies under this session's temporary root."""
    root = _SESSION_ROOT[0] if _SESSION_ROOT else ""
    found: set[str] = set()
    m = ["docker", "-H", manager]
    for kind in (["service", "ls"], ["network", "ls"]):
        ids = _lines([*m, *kind, "-q", "--filter", f"label={SWARM_LABEL}"])
        for ident in ids:
            fmt = '{{index .Spec.Labels "org.orchestrator.dir"}}'
            if kind[0] == "network":
                fmt = '{{index .Labels "org.orchestrator.dir"}}'
            folder = _lines([*m, kind[0], "inspect", "--format", fmt, ident])
            if folder and folder[0].startswith(root):
                found.add(f"{kind[0]}:{ident}")
    for node in _lines([*m, "node", "ls", "-q"]):
        addr = _lines([*m, "node", "inspect", "--format", "{{.Status.Addr}}", node])[0]
        fmt = '{{.ID}} {{.Label "org.orchestrator.dir"}}'
        argv = ["docker", "-H", f"tcp://{addr}:2375", "ps", "-a", "--filter"]
        for line in _lines([*argv, f"label={SWARM_LABEL}", "--format", fmt]):
            ident, _, in_folder = line.partition(" ")
            if in_folder.startswith(root):
                found.add(f"container:{node}:{ident}")
    return found


BUILD_DEADLINE = 1500.0
"""Seconds `scripts/build-images TARGET` may take: its lock wait (20 min) and the build."""


def build_test_image(target: str, image: str) -> str | None:
    """Build what `scripts/build-images TARGET` builds (`image`) when it is missing; None when
    it is there, else why not. Bootstrap leaves the swarm node and Harbor's image to the
    tests that need them; the script builds under a machine-wide lock and looks again under
    it, so parallel workers and runs build each image once, and costs a tenth of a second
    when all is there."""
    argv = ["bash", str(ROOT / "scripts" / "build-images"), target]
    # its own session, so that a build past the deadline is killed whole (debootstrap too)
    build = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = build.communicate(timeout=BUILD_DEADLINE)  # its log lines only: small
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        build.communicate()
        return f"scripts/build-images {target} did not end within {BUILD_DEADLINE:g} s"
    if build.returncode != 0 or not _ok(["docker", "image", "inspect", image]):
        tail = "\n".join(err.strip().splitlines()[-10:])
        return f"image {image} could not be built (scripts/build-images {target}): {tail}"
    return None


@pytest.fixture(scope="session")
def swarm_manager() -> Iterator[str]:
    """The manager address of a Swarm for the swarm backend's tests: a running
    `scripts/cluster`, or one started here (and removed after). Fails the session if the tests
    leave anything on it."""
    problem = build_test_image("swarm", NODE_IMAGE)
    if problem is not None:
        cannot_run(f"Swarm test skipped: {problem}")
    run_dir = Path(os.environ[RUN_DIR_ENV])
    with open(run_dir / "swarm.lock", "w") as lock:  # the run's workers start it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _ok(["docker", "network", "inspect", "orch-cluster"]):
            up = subprocess.run(
                [CLUSTER, "up", str(SWARM_NODES)], capture_output=True, text=True, check=False
            )
            if up.returncode != 0:
                pytest.fail(f"could not start the test Swarm: {up.stderr.strip()}")
            (run_dir / SWARM_STARTED).touch()  # removed when the whole run ends
    line = subprocess.run([CLUSTER, "env"], capture_output=True, text=True, check=True).stdout
    manager = line.strip().partition("=")[2]
    yield manager
    leaked = swarm_ids(manager)  # this worker's own (by its temporary root)
    assert not leaked, f"the tests left these on the Swarm: {sorted(leaked)}"


def swarm_settings(manager: str) -> dict[str, str]:
    """The process settings that make `manager` the Swarm of the swarm backend."""
    return {
        "ORCHESTRATOR_SWARM_HOST": manager,
        "ORCHESTRATOR_SWARM_NODE_HOST": "tcp://{addr}:2375",
        # a Swarm's nodes pull each task's image (from the cluster's own registry here): the
        # caller's consent, which a file alone never gives
        "ORCHESTRATOR_ALLOW_PULL": "1",
    }


@pytest.fixture
def swarm_cluster(swarm_manager: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The Swarm's manager, made the process's Swarm for one test only (so that no later test
    on this worker inherits its settings, above all the consent to pull)."""
    for key, value in swarm_settings(swarm_manager).items():
        monkeypatch.setenv(key, value)
    return swarm_manager


def engine_info(template: str) -> str:
    """What `docker info --format TEMPLATE` says ("" when the engine does not answer)."""
    said = subprocess.run(
        ["docker", "info", "--format", template],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return said.stdout


@pytest.fixture(scope="session")
def gvisor_engine() -> str:
    """The engine runtime name of gVisor, which `isolation: gvisor` needs (scripts/bootstrap
    installs runsc and registers it where it may); skips without it (fails in CI)."""
    name = os.environ.get("ORCHESTRATOR_GVISOR_RUNTIME", "") or "runsc"
    if f'"{name}"' not in engine_info("{{json .Runtimes}}"):
        cannot_run(
            f"gVisor tests skipped: the engine has no runtime {name!r} (run scripts/bootstrap)"
        )
    return name


@pytest.fixture(scope="session")
def sealed_engine(gvisor_engine: str) -> str:
    """The engine runtime of gVisor with no network (scripts/bootstrap-gvisor registers it),
    on an engine whose checkpoint API is on, as root: what a checkpoint with memory needs."""
    name = os.environ.get("ORCHESTRATOR_GVISOR_SEALED_RUNTIME", "") or "runsc-sealed"
    said = engine_info("{{json .Runtimes}} {{.ExperimentalBuild}}")
    if f'"{name}"' not in said or not said.strip().endswith("true") or os.geteuid() != 0:
        cannot_run(
            f"memory checkpoints need the runtime {name!r}, an engine in experimental mode "
            "and root (scripts/bootstrap gives all three)"
        )
    return name


@pytest.fixture(scope="session")
def podman_engine() -> str:
    """Root Podman's API socket, where `--engine podman` goes (scripts/bootstrap-podman
    starts it, with the test images); skips without it (fails in CI)."""
    why = ""
    if os.geteuid() != 0:
        why = "the Podman tests run as root (rootless Podman is tested by its own user)"
    elif not _ok(["docker", "--host", PODMAN, "version"]):
        why = f"nothing answers on {PODMAN} (run scripts/bootstrap-podman)"
    else:
        for image in (PYTHON_IMAGE, BUSYBOX_IMAGE):
            if not _ok(["docker", "--host", PODMAN, "image", "inspect", image]):
                why = f"Podman has no image {image} (run scripts/bootstrap-podman)"
    if why:
        cannot_run(f"Podman tests skipped: {why}")
    return PODMAN


CLUSTER = str(ROOT / "scripts" / "cluster")
SWARM_NODES = 2
"""Nodes of the test Swarm: node-1 (the manager) and node-2, enough for placement across
machines and another machine's engine (`remote_engine`); a third cost the run about 40
CPU-seconds (its engine, its copy of the test images) and tested nothing more."""
RUN_DIR_ENV = "ORCHESTRATOR_TEST_RUN_DIR"
"""A folder of this test run that its xdist workers share (they inherit the environment)."""
SWARM_STARTED = "swarm.started"


_MADE_RUN_DIR: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if RUN_DIR_ENV not in os.environ:  # the controller (or a run without workers)
        _MADE_RUN_DIR.append(tempfile.mkdtemp(prefix="orch-test-run-"))
        os.environ[RUN_DIR_ENV] = _MADE_RUN_DIR[0]
        if config.getoption("numprocesses", default=None):  # workers to come: rewrite once
            rewrite_cache.write_for_workers(config, ROOT / "tests")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup`: our groups (tests/grouping.py); any other: xdist's own."""
    if config.getvalue("dist") != "loadgroup" or RUN_DIR_ENV not in os.environ:
        return None
    return grouping.SharedScheduling(config, Path(os.environ[RUN_DIR_ENV]), log)


def pytest_unconfigure(config: pytest.Config) -> None:
    """When the whole run ends (in the process that made the run's folder, not a worker):
    remove the test Swarm if the run started it."""
    if not _MADE_RUN_DIR:
        return
    run_dir = Path(_MADE_RUN_DIR.pop())
    os.environ.pop(RUN_DIR_ENV, None)
    if (run_dir / SWARM_STARTED).exists():
        with open(run_dir / "swarm.lock", "w") as lock:  # a start in the background ended
            deadline = time.monotonic() + PREPARE_DEADLINE
            while time.monotonic() < deadline:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.5)
            subprocess.run([CLUSTER, "down"], capture_output=True, check=False)
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def remote_engine(swarm_manager: str) -> str:
    """Another engine than this machine's: the last node of the test Swarm (plain Compose
    projects run there as on any engine)."""
    nodes = _lines(["docker", "-H", swarm_manager, "node", "ls", "-q"])
    fmt = "{{.Status.Addr}}"
    addr = _lines(["docker", "-H", swarm_manager, "node", "inspect", "--format", fmt, nodes[-1]])
    return f"tcp://{addr[0]}:2375"
