"""The Docker backend against a real engine: services, health, networking, users, limits,
labels, recovery and cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from orchestrator import (
    HealthcheckFailed,
    OrchestratorError,
    Policy,
    PolicyError,
    Runtime,
    RuntimeClosed,
    RuntimeResult,
    SandboxUnavailable,
    UsageError,
    environments,
    spawn_runtime,
)
from orchestrator.backends.container.identity import LABEL_SNAPSHOT_RECORD, LABEL_SNAPSHOT_STATE
from orchestrator.backends.container.inventory import list_projects, reap
from orchestrator.backends.container.service import ServiceSandbox
from orchestrator.errors import ExecutorLost
from orchestrator.testing.conformance.kit import unique_sleep
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids, main_container
from tests.docker.conftest import MakeEnv

ROOT = Path(__file__).resolve().parents[2]


def project_objects(name: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=org.orchestrator.project={name}"],
        capture_output=True,
        text=True,
    )
    nets = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", f"label=org.orchestrator.project={name}"],
        capture_output=True,
        text=True,
    )
    return out.stdout.split() + nets.stdout.split()


def test_multi_service_by_name_and_published_port() -> None:
    with spawn_runtime(ROOT / "environments" / "multi-service.yaml") as rt:
        r = rt.execute(
            [
                "python3",
                "-c",
                "import urllib.request as u; print(u.urlopen('http://web:8080/').read().decode())",
            ],
            timeout=20,
        )
        assert r.stdout == "hello from web\n\n", r.stderr
        [port] = rt.info().ports
        assert port.service == "web" and port.host_ip == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port.host}/", timeout=10).read()
        assert body == b"hello from web\n"
        name = rt.info().id
        # two containers, the port forwarder, the network and the forwarder's way in
        assert len(project_objects(name)) == 5
    assert project_objects(name) == []


def test_unhealthy_service_is_named_with_its_logs_and_cleaned(make_env: MakeEnv) -> None:
    path = make_env(
        "services:\n  db:\n"
        f"    image: {BUSYBOX_IMAGE}\n"
        "    command: [sh, -c, 'echo db-log-line; sleep 600']\n"
        "    healthcheck: {test: [CMD, 'false'], interval: 200ms, retries: 2}\n"
    )
    before = labelled_ids()
    with pytest.raises(HealthcheckFailed) as info:
        spawn_runtime(path)
    assert "service 'db' never became healthy" in str(info.value)
    assert "db-log-line" in str(info.value)
    assert labelled_ids() <= before  # nothing of ours stayed


def test_missing_image_is_a_clear_error_and_leaves_nothing(make_env: MakeEnv) -> None:
    before = labelled_ids()
    with pytest.raises(OrchestratorError) as info:
        spawn_runtime(make_env("", image="orchestrator-test/does-not-exist:0"))
    assert "does-not-exist" in str(info.value)
    assert labelled_ids() <= before  # nothing of ours stayed


def test_no_network_by_default_and_internal_with_services(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("")) as rt:
        assert rt.execute("ls /sys/class/net").stdout.split() == ["lo"]
    with spawn_runtime(
        make_env(f"services: {{db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '600']}}}}\n")
    ) as rt:
        nets = subprocess.run(
            [
                "docker",
                "network",
                "ls",
                "-q",
                "--filter",
                f"label=org.orchestrator.project={rt.info().id}",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        info = json.loads(
            subprocess.run(
                ["docker", "network", "inspect", *nets], capture_output=True, text=True
            ).stdout
        )
        assert [n["Internal"] for n in info] == [True]
        assert info[0]["IPAM"]["Config"][0]["Subnet"].startswith("10.213.")


def test_user_host_owns_workspace_files(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUID", "4321")
    monkeypatch.setenv("HGID", "4322")
    ws = tmp_path / "ws"
    ws.mkdir()
    ws.chmod(0o777)
    with spawn_runtime(make_env("user: host\n"), workspace=ws) as rt:
        rt.execute("echo x > made.txt", check=True)
    st = (ws / "made.txt").stat()
    assert (st.st_uid, st.st_gid) == (4321, 4322)


def test_memory_hog_is_reported_out_of_memory(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("resources: {memory: 64m}\n")) as rt:
        r = rt.execute(
            ["python3", "-c", "x = bytearray(400 * 1024 * 1024); print('survived')"], timeout=60
        )
        assert r.exit_code == 137 and r.oom_killed and "survived" not in r.stdout
        assert rt.execute("echo alive").stdout == "alive\n"


def test_fork_bomb_is_contained(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("resources: {pids: 64}\n")) as rt:
        r = rt.execute("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=4)
        assert "fork" in r.stderr.lower()  # the pids limit stopped it
        deadline = time.monotonic() + 10  # its processes die; their pids come back
        while True:
            try:
                assert rt.execute("echo alive", timeout=30).stdout == "alive\n"
                break
            except SandboxUnavailable:
                assert time.monotonic() < deadline, "the sandbox never recovered"
                time.sleep(0.2)
    assert subprocess.run(["true"]).returncode == 0  # the host is fine too


def test_labels_name_owner_env_and_digest(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("network: {outbound: true}\n", name="labelled")) as rt:
        assert rt.info().id.startswith("orch-labelled-")
        [info] = [p for p in list_projects() if p.name == rt.info().id]
        labels = info.labels
        assert labels["org.orchestrator.owner.pid"] == str(os.getpid())
        assert labels["org.orchestrator.env"] == "labelled"
        assert labels["org.orchestrator.digest"] == rt.env.digest
        assert labels["org.orchestrator.started"].endswith("Z")
        assert len(info.networks) == 1


def test_executor_recovers_after_kill_9(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("user: '1000:1000'\n")) as rt:
        assert rt.execute("true").exit_code == 0 and rt.info().exec_mode == "executor"
        import threading

        errors: list[BaseException | RuntimeResult] = []

        def in_flight() -> None:
            try:
                errors.append(rt.execute("sleep 31337 & sleep 31337; wait", timeout=60))
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=in_flight)
        t.start()
        # the command runs before its executor is killed (a fixed pause was once too short
        # on a busy machine: the kill came first, and the command then ran on)
        deadline = time.monotonic() + 20
        while len(sleeping(rt)) < 2:
            assert time.monotonic() < deadline and t.is_alive(), errors
            time.sleep(0.1)
        subprocess.run(
            [
                "docker",
                "exec",
                "-u",
                "0",
                main_container(rt),
                "sh",
                "-c",
                # the executor alone: its spawners, forked from it, carry its command line
                # too, and one killed first (the glob sorts pids as text) reports its
                # command's end before the executor goes, a normal 137
                "for p in /proc/[0-9]*; do grep -q 'agen[t].py' $p/cmdline 2>/dev/null "
                "|| continue; up=$(awk '/^PPid:/ {print $2}' $p/status); "
                "grep -q 'agen[t].py' /proc/$up/cmdline 2>/dev/null || kill -9 ${p#/proc/}; "
                "done; true",
            ],
            check=True,
        )
        # (the loss is told by asking the engine about the container, which a loaded CI
        # machine answered past 20 s once: the call's own timeout bounds the wait instead)
        t.join(60)
        assert not t.is_alive(), "the call did not end once its executor was killed"
        assert len(errors) == 1 and isinstance(errors[0], ExecutorLost), errors
        assert rt.execute("echo back").stdout == "back\n"
        # the new executor killed what the dead one had left running (a SIGKILLed process
        # may take a moment to be gone on a busy machine)
        deadline = time.monotonic() + 10
        while (left := sleeping(rt)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == []


def sleeping(rt: Runtime) -> list[str]:
    """The pids of the `sleep 31337` processes in the sandbox."""
    found = rt.execute(
        "for p in /proc/[0-9]*; do tr '\\000' ' ' < $p/cmdline 2>/dev/null "
        "| grep -q 'sleep 3133[7]' && echo $p; done; true",
        user="root",
    )
    return found.stdout.split()


def test_image_without_python_falls_back_to_plain_exec(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("", image=BUSYBOX_IMAGE)) as rt:
        r = rt.execute("echo hi; exit 3")
        assert (r.stdout, r.exit_code, rt.info().exec_mode) == ("hi\n", 3, "plain")
        assert any("falling back" in w for w in rt.warnings)


def test_keep_after_cleanup_keeps_stopped_containers(make_env: MakeEnv) -> None:
    rt = spawn_runtime(make_env("keep_after_cleanup: true\n"))
    name = rt.info().id
    rt.cleanup()
    try:
        [info] = [p for p in list_projects() if p.name == name]
        assert {state for _, _, state in info.containers} == {"exited"}
    finally:
        from orchestrator.backends.container.inventory import remove_project

        remove_project(info)
    assert project_objects(name) == []


def test_reaper_removes_projects_of_dead_owners_only(make_env: MakeEnv) -> None:
    path = make_env("")
    code = (
        f"import os; from orchestrator import spawn_runtime; rt = spawn_runtime({str(path)!r}); "
        "print(rt.info().id, flush=True); os._exit(0)"
    )
    env = {**os.environ, "ORCHESTRATOR_GUARDIAN": "0"}  # leave the orphan to reap()
    orphan = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    with spawn_runtime(path) as mine:
        # (other tests' dead owners' projects are reaped too: one whose removal another
        # process holds past the wait fails there, which says nothing of this test's own)
        failures: list[OrchestratorError] = []
        removed = reap(failures=failures)
        assert not [f for f in failures if orphan in str(f) or mine.info().id in str(f)]
        assert mine.info().id not in removed
        # every process's reaper removes projects of dead owners: another test process's
        # may have been first (then the orphan is gone already)
        assert orphan in removed or project_objects(orphan) == []
        assert mine.execute("echo still").stdout == "still\n"
    assert project_objects(orphan) == []


def test_cli_up_exec_ps_down_multi_service() -> None:
    cli = [sys.executable, "-m", "orchestrator"]
    up = subprocess.run(
        [*cli, "up", "--json", str(ROOT / "environments" / "multi-service.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    try:
        r = subprocess.run(
            [*cli, "exec", info["id"], "--", "wget", "-q", "-O-", "http://web:8080/"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode != 0:  # the python image has no wget: use python
            r = subprocess.run(
                [
                    *cli,
                    "exec",
                    info["id"],
                    "--",
                    "python3",
                    "-c",
                    "import urllib.request as u;"
                    "print(u.urlopen('http://web:8080/').read().decode(), end='')",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert r.returncode == 0 and r.stdout == "hello from web\n", r.stderr
        ps = json.loads(
            subprocess.run([*cli, "ps", "--json"], capture_output=True, text=True).stdout
        )
        [row] = [p for p in ps if p["id"] == info["id"]]
        assert row["owner"] == "detached" and row["ports"][0]["host"] == info["ports"][0]["host"]
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{row['ports'][0]['host']}/", timeout=10
        ).read()
        assert body == b"hello from web\n"
        assert subprocess.run([*cli, "exec", info["id"], "--", "exit 7"]).returncode == 7
        logs = subprocess.run([*cli, "logs", info["id"], "web"], capture_output=True, text=True)
        assert logs.returncode == 0 and "web: serving on 8080" in logs.stdout
        shell = subprocess.run(
            [*cli, "shell", info["id"]],
            input="echo $((6 * 7))\nexit\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shell.returncode == 0 and shell.stdout.strip().endswith("42")
    finally:
        down = subprocess.run([*cli, "down", info["id"]], capture_output=True, text=True)
    assert down.returncode == 0 and project_objects(info["id"]) == []


def test_doctor_passes() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "doctor",
            str(ROOT / "environments" / "python.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout
    assert "[fail]" not in r.stdout and "] Docker engine" in r.stdout  # (a warning on 20.10.24)


def test_doctor_probes_the_main_image_whatever_the_services(tmp_path: Path) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(
        f"version: 1\nname: doc\nimage: {PYTHON_IMAGE}\n"
        "services: {db: {image: 'orchestrator-test/absent:0'}}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", str(env)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "[fail] image orchestrator-test/absent:0 not present" in r.stdout
    assert f"[pass] fast executor can run in {PYTHON_IMAGE}" in r.stdout


def test_host_networking_needs_the_callers_opt_in(make_env: MakeEnv) -> None:
    path = make_env("network: {mode: host}\n")
    before = labelled_ids()
    with pytest.raises(PolicyError, match="host networking is not allowed"):
        spawn_runtime(path)
    assert labelled_ids() <= before  # nothing of ours stayed
    with spawn_runtime(path, policy=Policy(allow_host_network=True)) as rt:
        # the host's own network namespace, by its inode: other tests' veths come and go
        # meanwhile, so comparing listings of interfaces raced them
        inside = rt.execute("readlink /proc/self/ns/net").stdout.strip()
        assert inside == os.readlink("/proc/self/ns/net")
        seen = set(rt.execute("ls /sys/class/net").stdout.split())
        steady = {n for n in os.listdir("/sys/class/net") if n == "lo" or n.startswith("eth")}
        assert steady <= seen and len(seen) > 1
        assert any("WARNING: network.mode host" in w for w in rt.warnings)


def test_resource_limits_reach_the_cgroup(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("resources: {memory: 96m, cpus: 0.5, pids: 50}\n")) as rt:
        script = (
            "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max /sys/fs/cgroup/pids.max "
            "2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes "
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/pids/pids.max"
        )
        values = rt.execute(script).stdout.split()
    assert values[0] == str(96 * 1024 * 1024)
    assert values[1] == "50000"  # half of the 100 ms period
    assert values[-1] == "50"


def test_build_is_tagged_once_per_digest(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {BUSYBOX_IMAGE}\nRUN echo built > /built.txt\n")
    (tmp_path / "env.yaml").write_text("version: 1\nname: built\nbuild: {context: .}\n")
    from orchestrator import load_environment
    from orchestrator.backends.docker.buildplan import build_tags

    env = load_environment(tmp_path / "env.yaml")
    [tag] = build_tags(env)  # by what the build reads (the Dockerfile, args and context)
    try:
        for _ in range(2):
            with spawn_runtime(env) as rt:
                assert rt.execute("cat /built.txt").stdout == "built\n"
                project = rt.info().id
        images = subprocess.run(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert tag in images and not any(i.startswith(project) for i in images)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_daemon_down_gives_one_clear_message(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            str(ROOT / "environments" / "busybox.yaml"),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 3 and "Docker engine is not reachable" in r.stderr
    assert "Traceback" not in r.stderr


def test_forgotten_runtime_is_removed_at_interpreter_exit(make_env: MakeEnv) -> None:
    path = make_env("")
    code = (
        f"from orchestrator import spawn_runtime; rt = spawn_runtime({str(path)!r}); "
        "print(rt.info().id, flush=True)"
    )
    name = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert name.startswith("orch-t-") and project_objects(name) == []


def test_taken_subnet_is_retried_with_another(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.backends.docker import start

    taken, free = "10.213.250.0/27", "10.213.250.32/27"
    net = subprocess.run(
        [
            "docker",
            "network",
            "create",
            "--subnet",
            taken,
            "--label",
            "org.orchestrator.managed=1",
            "--label",
            "org.orchestrator.project=test-occupier",
            "orch-test-occupier",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    picks = iter([taken, free])
    monkeypatch.setattr(start, "pick_subnet", lambda: next(picks))
    try:
        with spawn_runtime(make_env("network: {outbound: true}\n")) as rt:
            info = json.loads(
                subprocess.run(
                    ["docker", "network", "inspect", f"{rt.info().id}_default"],
                    capture_output=True,
                    text=True,
                ).stdout
            )
            assert info[0]["IPAM"]["Config"][0]["Subnet"] == free
    finally:
        subprocess.run(["docker", "network", "rm", net], capture_output=True)


def test_every_service_is_a_sandbox(tmp_path: Path) -> None:
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "hello.txt").write_text("static hello\n")
    path = tmp_path / "env.yaml"
    path.write_text(
        f"version: 1\nname: svc\nimage: {PYTHON_IMAGE}\n"
        "static_assets: [{name: data, path: assets, save_path: d}]\n"
        "network: {ports: [{container: 8000}]}\n"
        "services:\n"
        f"  web: {{image: {BUSYBOX_IMAGE}, command: [httpd, -f, -p, '8080'],"
        " ports: [{container: 8080}]}\n"
        f"  quiet: {{image: {BUSYBOX_IMAGE}, command: [sleep, '3600'], static_assets: false}}\n"
    )
    with spawn_runtime(path) as rt:
        assert rt.service("main") is rt
        with pytest.raises(UsageError, match="no service 'nope' \\(known: main, quiet, web\\)"):
            rt.service("nope")
        web, quiet = rt.service("web"), rt.service("quiet")
        r = web.execute(f"cat {web.static_path('data')}/hello.txt; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "static hello\n", "err\n")
        web.write_file("/tmp/x.bin", b"\x00\xff")
        assert web.read_file("/tmp/x.bin", text=False) == b"\x00\xff"
        web.upload(tmp_path / "assets", "/tmp/folder")  # folders both ways, by its own FIFOs
        assert web.download("/tmp/folder", tmp_path / "back") == ["hello.txt"]
        assert (tmp_path / "back" / "hello.txt").read_text() == "static hello\n"
        assert web.execute("id -u", user="nobody").stdout == "65534\n"
        s = unique_sleep()
        timed = web.execute(f"sleep {s} & sleep {s}; wait", timeout=1)
        assert timed.timed_out and timed.elapsed < 5
        left = web.execute(f"grep -l '[s]leep.{s}' /proc/[0-9]*/cmdline 2>/dev/null; true")
        assert left.stdout == ""
        with pytest.raises(UsageError, match="static_assets: false"):
            quiet.static_path("data")
        assert quiet.execute("test -e /static/d").exit_code == 1
        assert {p.service for p in rt.info().ports} == {"main", "web"}
        from orchestrator.backends.container.inventory import project_statuses

        [status] = [p for p in project_statuses()[0] if p.id == rt.info().id]  # ps --json
        assert {p.service for p in status.ports} == {"main", "web"}
        assert any("svc/web: the fast executor cannot run" in w for w in rt.warnings)
        subprocess.run(["docker", "kill", f"{rt.info().id}-quiet-1"], capture_output=True)
        with pytest.raises(SandboxUnavailable, match="its service 'quiet' is not running"):
            quiet.execute("true", timeout=10)
        assert rt.execute("echo main still").stdout == "main still\n"
    with pytest.raises(RuntimeClosed):
        web.execute("true")


def test_a_service_with_python_gets_its_own_executor(make_env: MakeEnv) -> None:
    body = (
        "services:\n"
        f"  worker: {{image: {PYTHON_IMAGE}, command: [sleep, '3600']}}\n"
        f"  app: {{image: {PYTHON_IMAGE}, command: [sleep, '3600'], user: nobody}}\n"
    )
    with spawn_runtime(make_env(body)) as rt:
        worker, app = rt.service("worker"), rt.service("app")
        assert isinstance(worker, ServiceSandbox) and isinstance(app, ServiceSandbox)
        assert worker.execute("id -u").stdout == "0\n" and worker.channel.mode == "executor"
        assert worker.execute("id -un", user="nobody").stdout == "nobody\n"
        r = worker.execute("echo out; echo err >&2; exit 5", timeout=10)
        assert (r.exit_code, r.stdout, r.stderr) == (5, "out\n", "err\n")
        # a non-root service: its executor (root without capabilities) cannot become its
        # user, so those commands go by docker exec; root's still go through the executor
        assert app.execute("id -un").stdout == "nobody\n"
        assert app.execute("id -u", user="root").stdout == "0\n"
        assert app.channel.mode == "executor"


def test_cli_snapshot_then_up_resume(make_env: MakeEnv) -> None:
    cli = [sys.executable, "-m", "orchestrator"]
    path = make_env(
        "user: '1000:1000'\nsetup: {commands: ['echo ran >> setup.log'], "
        "resume_commands: ['echo resumed >> setup.log']}\n",
        name="snap",
    )
    first = subprocess.run([*cli, "up", str(path)], capture_output=True, text=True, check=True)
    ident = first.stdout.strip()
    try:
        subprocess.run(
            [*cli, "exec", ident, "--", "echo mine > work.txt; echo fs > /tmp/mark"], check=True
        )
        saved = subprocess.run(
            [*cli, "snapshot", ident, "-o", "cli-snap", "--filesystem"],
            capture_output=True,
            text=True,
        )
        assert saved.returncode == 0 and saved.stdout.strip().endswith("cli-snap.tar"), saved
    finally:
        subprocess.run([*cli, "down", ident], capture_output=True, check=True)
    listed = subprocess.run([*cli, "snapshot", "--list"], capture_output=True, text=True)
    assert "cli-snap\tsnap\t" in listed.stdout and "\torchestrator-snapshot:" in listed.stdout
    second = subprocess.run(
        [*cli, "up", "--resume", "cli-snap", str(path)], capture_output=True, text=True
    )
    assert second.returncode == 0, second.stderr
    ident = second.stdout.strip()
    try:
        shown = subprocess.run(
            [*cli, "exec", ident, "--", "cat work.txt setup.log /tmp/mark"],
            capture_output=True,
            text=True,
        )
        assert shown.stdout == "mine\nran\nresumed\nfs\n"
    finally:
        subprocess.run([*cli, "down", ident], capture_output=True, check=True)
    removed = subprocess.run([*cli, "snapshot", "--rm", "cli-snap"], capture_output=True, text=True)
    assert removed.stdout == "removed cli-snap\n"
    missing = subprocess.run(
        [*cli, "up", "--resume", "cli-snap", str(path)], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no snapshot 'cli-snap'" in missing.stderr


def test_cli_exec_timeout_kills_the_tree_and_exits_124(make_env: MakeEnv) -> None:
    cli = [sys.executable, "-m", "orchestrator"]
    up = subprocess.run(
        [*cli, "up", str(make_env("", name="exect"))], capture_output=True, text=True
    )
    ident = up.stdout.strip()
    try:
        s = unique_sleep()
        r = subprocess.run(
            [*cli, "exec", "--timeout", "1", ident, "--", f"echo early; sleep {s} & sleep {s}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (r.returncode, r.stdout) == (124, "early\n") and "timed out after 1s" in r.stderr
        left = subprocess.run(
            [*cli, "exec", ident, "--", f"grep -l '[s]leep.{s}' /proc/[0-9]*/cmdline; true"],
            capture_output=True,
            text=True,
        )
        assert left.stdout == ""
        ok = subprocess.run(
            [*cli, "exec", "--timeout", "5", ident, "--", "exit 3"], capture_output=True
        )
        assert ok.returncode == 3
    finally:
        subprocess.run([*cli, "down", ident], capture_output=True, check=True)


ODD_STATE = "état $HOME \"q\" 'a' b\\c"
"""A state folder whose name a Dockerfile instruction would not read back as written:
non-ASCII, a variable, both quotes and a backslash."""


def snapshot_under_an_odd_state_folder(
    path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    engine: str = "",
    name: str = ODD_STATE,
) -> None:
    """A filesystem snapshot's image carries the record and state folder in its labels
    exactly, whatever their characters: only then is it owned, resumed and removed. The
    record names the process's engine (`engine`; "": the CLI's default)."""
    from orchestrator.backends.container import images
    from orchestrator.backends.container.engine import Engine

    state = tmp_path / name
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    client = Engine.at()  # the process's engine
    with spawn_runtime(path) as first:
        first.execute("echo built > /made", user="0:0")
        snap = first.snapshot(tmp_path / "fs.tar", filesystem=True)
    assert snap.host == engine
    labels = client.whales.image.inspect(snap.image).config.labels or {}
    assert labels[LABEL_SNAPSHOT_STATE] == str(state.resolve())
    assert labels[LABEL_SNAPSHOT_RECORD] == str(snap.record)
    assert images.owned(snap.image, snap.record, client)
    with spawn_runtime(path, resume=snap) as second:
        assert second.execute("cat /made").stdout == "built\n"
    snap.remove()
    assert not images.exists(snap.image, client)


def test_a_snapshot_image_is_owned_whatever_the_state_folder_is_called(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot_under_an_odd_state_folder(make_env("", name="oddstate"), tmp_path, monkeypatch)


def test_filesystem_snapshot_resumes_the_container_and_goes_with_it(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    from orchestrator.backends.container import images

    path = make_env("user: '1000:1000'\n", name="fssnap")
    with spawn_runtime(path) as first:
        first.execute("mkdir -p /opt/tool && echo built > /opt/tool/out", user="0:0")
        first.write_file("work.txt", "mine\n")
        snap = first.snapshot(tmp_path / "fs.tar", filesystem=True)
    assert snap.image and images.exists(snap.image)
    with spawn_runtime(path, resume=snap) as second:  # the container's files came back too
        assert second.execute("cat /opt/tool/out work.txt").stdout == "built\nmine\n"
        assert second.execute("id -u").stdout == "1000\n"  # still the file's user
        with pytest.raises(OrchestratorError):  # in use by a running container: kept
            snap.remove()
    snap.remove()
    assert not images.exists(snap.image) and not snap.path.exists()
    # an image whose snapshot record was deleted by hand is reaped like any leftover: by a
    # reap, and by a listing (`ps`), which asks the engine for them ahead (ahead.py)
    with spawn_runtime(path) as third:
        orphan = third.snapshot(tmp_path / "orphan.tar", filesystem=True)
        replaced = third.snapshot(tmp_path / "listed.tar", filesystem=True)
        listed = third.snapshot(tmp_path / "listed.tar", filesystem=True)  # in its place
    assert not images.exists(replaced.image)  # (it named the same record: no reap took it)
    orphan.record.unlink()
    reap()
    assert not images.exists(orphan.image) and images.exists(listed.image)
    listed.record.unlink()
    environments()
    assert not images.exists(listed.image)
    # one whose image was removed outside orchestrator cannot be resumed, and says why
    with spawn_runtime(path) as fourth:
        lost = fourth.snapshot(tmp_path / "lost.tar", filesystem=True)
    images.remove(lost.image)
    before = labelled_ids()
    with pytest.raises(UsageError, match=r"image \S+ is gone"):
        spawn_runtime(path, resume=lost)
    assert labelled_ids() == before  # refused before anything started
    lost.remove()


def test_a_snapshot_saved_over_the_one_it_resumed_leaves_no_image(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """Resumed from a snapshot, then saved again under its name (a harness's usual loop):
    the replaced image is in use by the resumed container and cannot go then; its record
    no longer names it, so a reap takes it once the container is gone, never the new one.
    Before, each such turn left an image until the snapshot itself was removed."""
    from orchestrator.backends.container import images

    path = make_env("", name="fsagain")
    with spawn_runtime(path) as first:
        snap = first.snapshot(tmp_path / "fs.tar", filesystem=True)
    with spawn_runtime(path, resume=snap) as second:
        again = second.snapshot(tmp_path / "fs.tar", filesystem=True)  # in its place
        assert again.image != snap.image and images.exists(snap.image)  # (in use)
        reap()
        assert images.exists(snap.image) and images.exists(again.image)
    reap()
    assert not images.exists(snap.image) and images.exists(again.image)
    again.remove()
    assert not images.exists(again.image)


def test_an_image_a_user_commits_from_a_resumed_sandbox_outlives_the_snapshot(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """A user's own `docker commit` of a container resumed from a snapshot inherits every
    label of the snapshot's image, its tag too: it is not ours. When the snapshot goes, a
    reap leaves it (before, it was removed as an orphan of the gone record), and a record
    naming it cannot resume it."""
    from orchestrator.backends.container import images

    path = make_env("", name="fsuser")
    with spawn_runtime(path) as first:
        snap = first.snapshot(tmp_path / "fs.tar", filesystem=True)
    user = ""
    try:
        with spawn_runtime(path, resume=snap) as rt:
            made = subprocess.run(
                [
                    "docker",
                    "commit",
                    "--change",
                    "LABEL org.orchestrator.test=1",
                    main_container(rt),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            user = made.stdout.strip()
        assert images.exists(user)
        assert not images.owned(user, snap.path.with_suffix(".json"))
        snap.remove()
        reap()
        assert images.exists(user) and not images.exists(snap.image)
    finally:
        if user:
            subprocess.run(["docker", "rmi", "-f", user], capture_output=True)
        snap.remove()


def test_a_reap_removes_the_orphan_it_judged_never_what_its_tag_names_later(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orphan is judged by id and tag, then removed: one that went by its tag removed
    whatever image the tag named by then (someone with the engine moved it meanwhile, onto
    an image of their own whose only name it is). It goes by the id judged now."""
    from orchestrator.backends.container import images

    def docker(*words: str) -> str:
        done = subprocess.run(["docker", *words], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    made = docker("create", "--label", "org.orchestrator.test=1", BUSYBOX_IMAGE, "true")
    victim = ours = ""
    try:
        victim = docker("commit", "--change", "LABEL org.orchestrator.test=1", made)
    finally:
        docker("rm", made)
    try:
        with spawn_runtime(make_env("", name="fsmoved")) as rt:
            snap = rt.snapshot(tmp_path / "fs.tar", filesystem=True)
        ours = docker("image", "inspect", "--format", "{{.Id}}", snap.image)
        snap.record.unlink()  # (removed by hand: its image is an orphan)
        judged = images._orphans()
        assert (ours, snap.image) in judged
        docker("tag", victim, snap.image)  # (moved between the judgement and the removal)
        monkeypatch.setattr(images, "_orphans", lambda engine=None: judged)
        assert snap.image in images.reap_orphans()
        assert images.exists(victim) and not images.exists(ours)
    finally:  # (each by the id this test made or judged)
        for image in (victim, ours):
            if image:
                subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def test_a_ctrl_c_as_a_snapshot_is_recorded_leaves_it_its_image(
    make_env: MakeEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that comes just as the record naming the image is written is held until
    the snapshot owns it: the snapshot the caller is told nothing of stands whole, its
    image with it (before, the failure path removed the image the record names)."""
    import signal

    from orchestrator.backends.container import images
    from orchestrator.sandbox import snapshot as snapshots

    real = snapshots.save

    def save(*args: Any, **kwargs: Any) -> snapshots.Snapshot:
        saved = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return saved

    monkeypatch.setattr(snapshots, "save", save)
    # (Python's own handler, whatever the run was started with: a shell's `&` ignores it)
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    kept, image = False, ""
    try:
        with spawn_runtime(make_env("", name="fsint")) as rt, pytest.raises(KeyboardInterrupt):
            rt.snapshot(tmp_path / "fs.tar", filesystem=True)
    finally:
        signal.signal(signal.SIGINT, was)
        if (tmp_path / "fs.json").exists():  # (whatever came of it, its image goes)
            snap = snapshots.Snapshot.find(tmp_path / "fs.tar")
            image = snap.image
            kept = bool(image) and images.exists(image)
            snap.remove()
    assert kept
    assert not images.exists(image)


def test_cleanup_gives_each_service_its_grace_and_leaves_nothing(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """A multi-container environment goes through the engine's API, without `compose down`:
    a service is sent SIGTERM and may save its work to a mounted folder first (the gateway
    is not waited for), and every container, network and volume goes."""
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # (the service writes as its own user)
    saver = "trap 'echo saved > /out/db; exit 0' TERM; while :; do sleep 0.1; done"
    body = (
        "network: {egress: [example.test]}\n"
        "volumes: [{volume: scratch, target: /scratch}]\n"
        "services:\n"
        f"  db: {{image: {BUSYBOX_IMAGE}, command: [sh, -c, {json.dumps(saver)}],"
        " mounts: [{source: ./out, target: /out}]}\n"
    )
    before = labelled_ids()
    rt = spawn_runtime(make_env(body, name="graceful"))
    assert rt.service("db").execute("true").exit_code == 0
    started = time.monotonic()
    rt.cleanup()
    assert time.monotonic() - started < 30
    assert (out / "db").read_text() == "saved\n"
    assert labelled_ids() <= before
