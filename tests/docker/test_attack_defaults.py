"""Issue 37 on the real engine. Item 7: a file that names no `resources` ran with no memory
and no process limit (1,100 threads started) while admission counted 512 MiB; every
container, the environment's own gateway and forwarder too, now runs with limits that
`docker inspect` shows, and admission's ticket is their sum. Item 6 and the suspected port
item: a file that mounts the state folder, or publishes a port on every address, is refused
by `up` before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import PolicyError, spawn_runtime
from orchestrator.sandbox.backend import Amounts
from orchestrator.services import admission
from tests.conftest import labelled_ids
from tests.docker import cgroups
from tests.docker.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, MakeEnv

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "orchestrator"]
GiB = 1024**3
DEFAULT = (GiB, 10**9, 1024)
"""Memory (bytes), NanoCpus and PidsLimit of a container whose file names none of them."""
INFRA = (256 * 1024**2, 5 * 10**8, 1024)
"""Those of the environment's own gateway and forwarder."""


@pytest.fixture(autouse=True)
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Its own state folder (its own ledger), admission on."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    for name in ("ADMISSION", "DEFAULT_MEMORY", "DEFAULT_CPUS", "DEFAULT_PIDS", "MAX_CPUS"):
        monkeypatch.delenv(f"ORCHESTRATOR_{name}", raising=False)
    return tmp_path / "state"


def applied(project: str, *, host: str = "") -> dict[str, tuple[int, int, int]]:
    """Memory, NanoCpus and PidsLimit of every container of a project, by service, as the
    engine (at `host`, else the default) holds them."""
    docker = ["docker", "--host", host] if host else ["docker"]
    ids = subprocess.run(
        [*docker, "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert ids, f"no container of {project}"
    seen = json.loads(
        subprocess.run(
            [*docker, "inspect", *ids], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    return {
        c["Config"]["Labels"]["com.docker.compose.service"]: (
            c["HostConfig"]["Memory"],
            c["HostConfig"]["NanoCpus"],
            c["HostConfig"]["PidsLimit"],
        )
        for c in seen
    }


def ticket_of(env: str) -> Amounts:
    [mine] = [t for t in admission.admitted() if t.env == env]
    return Amounts(mine.memory, mine.cpus)


def total(limits: dict[str, tuple[int, int, int]]) -> Amounts:
    return Amounts(
        sum(m for m, _, _ in limits.values()), sum(c for _, c, _ in limits.values()) / 1e9
    )


def test_every_container_gets_the_default_limits_and_admission_counts_them(
    make_env: MakeEnv,
) -> None:
    """A file with no `resources`, an allowlist and a published port: its main sandbox and
    its service run with the default memory, CPU and process limits, its gateway and
    forwarder with theirs, and its admission ticket is exactly what they hold together."""
    path = make_env(
        "network: {egress: [example.test], ports: [{container: 8000}]}\n"
        f"services: {{db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '3600']}}}}\n",
        name="lim",
        image=BUSYBOX_IMAGE,
    )
    with spawn_runtime(path) as rt:
        got = applied(rt.info().id)
        assert got == {
            "main": DEFAULT,
            "db": DEFAULT,
            "orchestrator-egress": INFRA,
            "orchestrator-ports": INFRA,
        }
        assert ticket_of("lim") == total(got)


def test_a_sandbox_without_network_gets_them_on_the_direct_path(make_env: MakeEnv) -> None:
    """The one-container project made through the Engine API (direct.py), not Compose."""
    with spawn_runtime(make_env("", name="limd", image=BUSYBOX_IMAGE)) as rt:
        got = applied(rt.info().id)
        assert got == {"main": DEFAULT}
        assert ticket_of("limd") == total(got)


THREADS = (
    "import threading, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(1100):\n"
    "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "        n += 1\n"
    "except RuntimeError:\n"
    "    pass\n"
    "print(n)\n"
)


def test_a_thread_bomb_stops_at_the_default_process_limit(make_env: MakeEnv) -> None:
    """The issue's bomb: 1,100 threads in a sandbox whose file names no limit. It stops
    below 1,024 (the executor holds a few), and the sandbox still answers."""
    with spawn_runtime(make_env("", name="bomb", image=PYTHON_IMAGE)) as rt:
        bomb = rt.execute(["python3", "-c", THREADS], timeout=120)
        started = int(bomb.stdout.strip())
        assert 900 < started < 1024, (started, bomb.stderr)
        assert rt.execute("echo alive", timeout=60).stdout == "alive\n"


def test_on_podman_the_defaults_hold_too(make_env: MakeEnv, podman_engine: str) -> None:
    path = make_env("", name="limp", image=PYTHON_IMAGE)
    with spawn_runtime(path, host=podman_engine) as rt:
        assert applied(rt.info().id, host=podman_engine) == {"main": DEFAULT}
        started = int(rt.execute(["python3", "-c", THREADS], timeout=120).stdout)
        assert 900 < started < 1024, started


def test_under_gvisor_they_are_set_and_the_bomb_stays_in_its_own_kernel(
    make_env: MakeEnv, gvisor_engine: str
) -> None:
    """gVisor's threads are tasks of its own kernel, not of the host's: the pids limit
    bounds the host tasks of its sandbox (its kernel's), and the memory limit what all its
    tasks take. The bomb starts its 1,100 threads there; the host's pid table never sees
    them (deviation, docs/security.md)."""
    path = make_env("isolation: gvisor\n", name="limg", image=PYTHON_IMAGE)
    with spawn_runtime(path) as rt:
        assert applied(rt.info().id) == {"main": DEFAULT}
        holding = THREADS.replace("print(n)", "print(n, flush=True)\ntime.sleep(30)")
        seen = []
        for event in rt.stream(["python3", "-c", holding], timeout=120):
            if event.kind == "stdout":  # every thread started and still alive
                seen.append((int(event.text), cgroups.pids(rt.info().container or "")))
                rt.kill()  # (ends the stream: nothing more to wait for)
                break
        [(started, host_tasks)] = seen
        assert started == 1100 and host_tasks < 256, (started, host_tasks)


def _up(file: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "up", str(file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=300,
    )


def test_up_refuses_a_file_that_mounts_the_state_folder_before_anything_starts(
    tmp_path: Path, own_state: Path
) -> None:
    """Item 6: a CI project whose state folder is `./.orch-state`; its file mounts it (to
    read another environment's private workspace and write the ledger). `up` exits 2 naming
    the field, and nothing is made: no container, no project folder, no ticket."""
    project = tmp_path / "proj"
    state = project / ".orch-state"
    (state / "admission").mkdir(parents=True)
    file = project / "env.yaml"
    file.write_text(
        f"version: 1\nname: grab\nimage: {BUSYBOX_IMAGE}\n"
        "mounts: [{source: ./.orch-state, target: /state}]\n"
    )
    before = labelled_ids()
    done = _up(file, ORCHESTRATOR_STATE_DIR=str(state))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "mounts.0.source" in done.stderr and "state folder" in done.stderr
    assert labelled_ids() == before
    assert not (state / "projects").exists() or not list((state / "projects").iterdir())
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(state)  # (restored by own_state's monkeypatch)
    with pytest.raises(PolicyError, match="state folder"):
        spawn_runtime(file)  # the library, the same
    assert labelled_ids() == before


def test_up_refuses_a_port_on_every_address_before_anything_starts(
    make_env: MakeEnv, own_state: Path
) -> None:
    file = make_env("network: {ports: [{container: 80, host_ip: 0.0.0.0}]}\n", name="wide")
    before = labelled_ids()
    done = _up(file)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "network.ports.0.host_ip" in done.stderr
    assert "ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1" in done.stderr
    assert labelled_ids() == before
    assert not (own_state / "projects").exists() or not list((own_state / "projects").iterdir())


@pytest.mark.parametrize("path", ["direct", "compose"])
def test_a_sandbox_cannot_fill_the_hosts_disk_through_its_log(
    make_env: MakeEnv, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root sandbox writes 40 MB to its first process's stdout, which the engine keeps as
    the container's log on the host: it keeps 16 MB at most (on the direct API path and
    through Compose alike)."""
    monkeypatch.setenv("ORCHESTRATOR_UP_PATH", "compose" if path == "compose" else "auto")
    with spawn_runtime(make_env("user: '0:0'\n", name=f"logcap{path}")) as rt:
        wrote = rt.execute(
            "head -c 40000000 /dev/zero | tr '\\0' x | fold -w 1000 > /proc/1/fd/1", timeout=120
        )
        assert wrote.exit_code == 0, wrote.stderr
        container = rt.info().container
        assert container is not None
        got = subprocess.run(
            ["docker", "inspect", "-f", "{{json .HostConfig.LogConfig}} {{.LogPath}}", container],
            capture_output=True,
            text=True,
            timeout=60,
        )
        config, log_path = got.stdout.rsplit(" ", 1)
        assert json.loads(config)["Config"] == {"max-size": "8m", "max-file": "2"}, config
        files = [Path(log_path.strip()), Path(log_path.strip() + ".1")]
        if os.access(files[0].parent, os.R_OK):  # (the engine's folder: root's)
            kept = sum(f.stat().st_size for f in files if f.exists())
            assert kept <= 17 * 1024 * 1024, kept
