"""The swarm backend on the test Swarm (`scripts/cluster`): placement, services on other
nodes, a start that cannot succeed, and an owner killed mid-run. (Execute, files, timeouts
and users are the conformance suite's, run on the Swarm too.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Snapshot, StartupError, UsageError, spawn_runtime
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, swarm_ids


def _node_of(manager: str, container: str) -> str:
    """The hostname of the node running `container` (asked of every node's engine)."""
    out = subprocess.run(
        ["docker", "-H", manager, "node", "ls", "--format", "{{.ID}} {{.Hostname}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        node, hostname = line.split()
        addr = subprocess.run(
            ["docker", "-H", manager, "node", "inspect", "--format", "{{.Status.Addr}}", node],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        found = subprocess.run(
            ["docker", "-H", f"tcp://{addr}:2375", "inspect", container],
            capture_output=True,
            check=False,
        )
        if found.returncode == 0:
            return hostname
    raise AssertionError(f"no node runs {container}")


def _env(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: sw\nbackend: swarm\nimage: {PYTHON_IMAGE}\n{body}")
    return path


def test_placement_and_a_service_on_another_node(swarm_cluster: str, tmp_path: Path) -> None:
    path = _env(
        tmp_path,
        "placement: ['node.hostname==node-1']\n"
        "services:\n"
        "  web:\n"
        f"    image: {BUSYBOX_IMAGE}\n"
        "    placement: ['node.hostname==node-2']\n"
        "    command: ['sh', '-c', 'mkdir -p /tmp/w && echo up > /tmp/w/index.html && "
        "sleep 2 && httpd -f -p 8080 -h /tmp/w']\n"
        "    healthcheck: {test: ['CMD', 'wget', '-qO-', 'http://127.0.0.1:8080/']}\n",
    )
    with spawn_runtime(path) as rt:
        assert _node_of(swarm_cluster, rt.info().container or "") == "node-1"
        web = rt.service("web")
        assert _node_of(swarm_cluster, web.connection().container or "") == "node-2"
        # the spawn waited for web's health (it sleeps 2 s before serving): no retry here
        got = rt.execute(
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://web:8080/').read())\""
        )
        assert got.stdout == "b'up\\n'\n", got.stderr


def test_a_sidecar_serving_the_static_assets_becomes_healthy(
    swarm_cluster: str, tmp_path: Path
) -> None:
    """Issue 20: Swarm started a service before its static assets were copied in, so a
    sidecar serving them never became healthy (the same file worked on docker). Now the
    service's command waits (bounded) until they are there, then runs as the file says."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("static on swarm\n")
    path = _env(
        tmp_path,
        "static_assets: [{name: site, path: site, save_path: site}]\n"
        "services:\n"
        "  web:\n"
        f"    image: {PYTHON_IMAGE}\n"
        "    user: '1000:1000'\n"
        "    command: [python3, -m, http.server, --directory, /static/site, '8080']\n"
        "    healthcheck:\n"
        '      test: [CMD, python3, -c, "import urllib.request as u; '
        "u.urlopen('http://127.0.0.1:8080/index.html')\"]\n",
    )
    with spawn_runtime(path) as rt:
        got = rt.execute(
            'python3 -c "import urllib.request as u; '
            "print(u.urlopen('http://web:8080/index.html').read().decode(), end='')\""
        )
        assert got.stdout == "static on swarm\n", got.stderr


def test_an_image_no_node_has_fails_the_start_and_leaves_nothing(
    swarm_cluster: str, tmp_path: Path
) -> None:
    path = tmp_path / "env.yaml"
    path.write_text("version: 1\nname: sw\nbackend: swarm\nimage: orchestrator-test/nowhere:1\n")
    before = swarm_ids(swarm_cluster)
    with pytest.raises(StartupError, match="main"):
        spawn_runtime(path)
    assert swarm_ids(swarm_cluster) <= before


def test_a_killed_owner_leaves_no_stack(swarm_cluster: str, tmp_path: Path) -> None:
    path = _env(tmp_path, "")
    before = swarm_ids(swarm_cluster)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from orchestrator import spawn_runtime; "
            f"rt = spawn_runtime({str(path)!r}); print('up', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    assert child.stdout is not None and child.stdout.readline() == "up\n"
    assert swarm_ids(swarm_cluster) > before  # the stack runs
    child.kill()
    child.wait()
    child.stdout.close()
    deadline = time.monotonic() + 60
    while swarm_ids(swarm_cluster) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not swarm_ids(swarm_cluster) - before  # its guardian took the stack down


def test_cli_run_on_swarm(swarm_cluster: str, tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: cli\nimage: {PYTHON_IMAGE}\n")  # a docker file
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--on",
            "swarm",
            str(path),
            "--",
            "echo out; echo err >&2; exit 3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (3, "out\n") and "err\n" in done.stderr


def test_cli_on_another_engine(remote_engine: str, tmp_path: Path) -> None:
    """`--host`: the whole life of an environment on another machine's engine."""
    cli = [sys.executable, "-m", "orchestrator", "--host", remote_engine]
    path = tmp_path / "env.yaml"
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "a.txt").write_text("asset\n")
    path.write_text(
        f"version: 1\nname: far\nimage: {PYTHON_IMAGE}\nuser: '1000:1000'\n"
        "static_assets: [{name: a, path: assets, save_path: a}]\n"
        "setup: {commands: ['cat {{static:a}}/a.txt > copied']}\n"
    )
    up = subprocess.run([*cli, "up", str(path)], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        local = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"name={ident}"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert local.stdout == ""  # not on this machine's engine
        shown = subprocess.run(
            [*cli, "exec", ident, "--", "cat copied; id -u"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.stdout == "asset\n1000\n", shown.stderr
    finally:
        subprocess.run([*cli, "down", ident], check=True, capture_output=True, timeout=120)
    listed = subprocess.run([*cli, "ps", "--json"], capture_output=True, text=True, check=True)
    assert ident not in listed.stdout
    mounted = tmp_path / "m.yaml"
    mounted.write_text(
        f"version: 1\nname: far\nimage: {PYTHON_IMAGE}\n"
        f"mounts: [{{source: {tmp_path}, target: /m}}]\n"
    )
    refused = subprocess.run(
        [*cli, "run", str(mounted), "--", "true"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "mounts.0" in refused.stderr


@pytest.fixture
def registry(swarm_cluster: str, tmp_path: Path) -> Iterator[str]:
    """Debian's docker-registry serving on the test Swarm's network gateway, as
    docs/scale-out.md tells for real hosts; its address."""
    import shutil
    import socket

    from tests.conftest import cannot_run

    binary = shutil.which("docker-registry")
    if binary is None:
        cannot_run(
            "docker-registry is not installed (scripts/build-images registry installs it as root)"
        )
    gateway = subprocess.run(
        [
            "docker",
            "network",
            "inspect",
            "-f",
            "{{(index .IPAM.Config 0).Gateway}}",
            "orch-cluster",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with socket.socket() as probe:  # a free port on that address
        probe.bind((gateway, 0))
        port = probe.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nstorage: {filesystem: {rootdirectory: "
        f"{tmp_path / 'data'}}}}}\nhttp: {{addr: '{gateway}:{port}'}}\n"
    )
    server = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex((gateway, port)) == 0:
                    break
            time.sleep(0.1)
        yield f"{gateway}:{port}"
    finally:
        server.terminate()
        server.wait(10)


def test_an_image_reaches_the_nodes_through_a_local_registry(
    swarm_cluster: str, registry: str, tmp_path: Path
) -> None:
    """Pushed once (here from the manager's engine), pulled by the node a task lands on."""
    image = f"{registry}/team/sandbox:{uuid.uuid4().hex[:8]}"
    manager = ["docker", "-H", swarm_cluster]
    subprocess.run([*manager, "tag", PYTHON_IMAGE, image], check=True)
    try:
        subprocess.run([*manager, "push", "-q", image], check=True, capture_output=True)
    finally:
        subprocess.run([*manager, "rmi", image], check=True, capture_output=True)
    path = tmp_path / "env.yaml"
    path.write_text(
        f"version: 1\nname: reg\nbackend: swarm\nimage: {image}\n"
        "placement: ['node.hostname==node-2']\n"
    )
    with spawn_runtime(path) as rt:
        assert rt.execute("python3 -c 'print(6 * 7)'").stdout == "42\n"
        node2 = _node_engine(swarm_cluster, "node-2")
    pulled = subprocess.run(["docker", "-H", node2, "image", "inspect", image], capture_output=True)
    assert pulled.returncode == 0  # node-2 had only the test images before: it pulled this one
    subprocess.run(["docker", "-H", node2, "rmi", image], check=True, capture_output=True)


def _node_engine(manager: str, hostname: str) -> str:
    fmt = "{{.Status.Addr}}"
    addr = subprocess.run(
        ["docker", "-H", manager, "node", "inspect", "--format", fmt, hostname],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"tcp://{addr}:2375"


def test_a_spawn_on_another_engine(remote_engine: str, tmp_path: Path) -> None:
    """spawn_runtime(host=...): this environment there, the process's engine untouched."""
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: spawnfar\nimage: {PYTHON_IMAGE}\nuser: '1000:1000'\n")
    far = ["docker", "-H", remote_engine]
    with spawn_runtime(path, host=remote_engine) as rt:
        container = rt.info().container or ""
        assert rt.execute("id -u").stdout == "1000\n"
        here = subprocess.run(["docker", "inspect", container], capture_output=True)
        there = subprocess.run([*far, "inspect", container], capture_output=True)
        assert (here.returncode, there.returncode) == (1, 0)
    gone = subprocess.run([*far, "inspect", container], capture_output=True)
    assert gone.returncode == 1


def test_a_filesystem_snapshot_on_another_engine_is_removed_there(
    remote_engine: str, tmp_path: Path
) -> None:
    """The record keeps the engine that holds the image: removal reaches it there, and a
    resume on another engine says where the image is."""
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: snapfar\nimage: {PYTHON_IMAGE}\n")
    far = ["docker", "-H", remote_engine]
    with spawn_runtime(path, host=remote_engine) as rt:
        snap = rt.snapshot(tmp_path / "far.tar", filesystem=True)
    assert Snapshot.find(snap.path).host == remote_engine
    assert (
        subprocess.run([*far, "image", "inspect", snap.image], capture_output=True).returncode == 0
    )
    with pytest.raises(UsageError, match=f"is on the engine at {remote_engine}"):
        spawn_runtime(path, resume=snap)
    snap.remove()
    assert (
        subprocess.run([*far, "image", "inspect", snap.image], capture_output=True).returncode == 1
    )
