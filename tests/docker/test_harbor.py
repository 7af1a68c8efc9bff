"""Harbor runs its tasks on orchestrator (issue 42), through Harbor's own CLI: `harbor run
-e orchestrator.integrations.harbor:OrchestratorEnvironment`, in the test image
`scripts/build-images harbor` makes (Debian 13, Python 3.13, Harbor 0.26.0), against this
machine's engine. The image holds Harbor and our dependencies; this checkout, the engine's
socket, the docker CLI and a work folder are mounted at their own paths (the engine reads
the bind mounts our environments ask for by the host's paths). The container has no
network: Harbor reaches nothing but the engine.

Four shipped tasks (tests/data/harbor): a Dockerfile task, a Compose task whose agent reaches
a service by name, a `no-network` task whose agent tries the test world, and a task whose
agent has no network while its verifier has an allowlist; Harbor's oracle agent must score
1.0 on each, and the two that need no egress control score the same on Harbor's own
`docker` environment. Hostile tasks, as a dataset nobody reviewed could hold them: a
Compose file that mounts the host's root, and trials that leave links and FIFOs where
Harbor downloads its logs; neither reaches the host."""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

import pytest

from orchestrator.backends.docker.network import EGRESS_DNS_ENV, EGRESS_NETWORK_ENV
from orchestrator.testing.harbor import (
    HARBOR_IMAGE,
    OURS,
    HarborRunFailed,
    Trial,
    copy_tasks,
    remove_images,
    trials,
)
from orchestrator.testing.harbor import harbor_run as run_harbor
from orchestrator.testing.world import World
from tests.conftest import ROOT, build_test_image, cannot_run, labelled_ids
from tests.docker.test_egress import module_dir, world

pytestmark = pytest.mark.docker
__all__ = ["module_dir", "world"]  # (the fixtures this module shares)

TASKS = ROOT / "tests" / "data" / "harbor"


@pytest.fixture(scope="module")
def harbor_image() -> str:
    problem = build_test_image("harbor", HARBOR_IMAGE)
    if problem is not None:
        cannot_run(f"Harbor test skipped: {problem}")
    return HARBOR_IMAGE


def world_env(world: World) -> dict[str, str]:
    """What makes our environments in the Harbor container leave by the test world."""
    return {EGRESS_NETWORK_ENV: world.network, EGRESS_DNS_ENV: world.resolver_ip}


def harbor_run(
    work: Path,
    tasks: Path,
    environment: str,
    job: str,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Trial]:
    """Each trial of `harbor run` of `tasks` on `environment`, by task name."""
    try:
        folder = run_harbor(work, tasks, environment, job, env, extra=extra)
    except HarborRunFailed as exc:
        pytest.fail(str(exc))
    return {t.task: t for t in trials(folder)}


@pytest.mark.slow
def test_harbor_runs_its_tasks_on_orchestrator(
    harbor_image: str, world: World, tmp_path: Path
) -> None:
    """The oracle scores 1.0 on all four tasks, run four at a time: a Dockerfile, a Compose
    service reached by name, `no-network` holding against the test world (by name and by
    address), and an agent with no network before a verifier whose allowlist reaches one
    host of the world and not another. Nothing of ours is left after."""
    before = labelled_ids()
    names = ["compose-service", "hello-dockerfile", "no-network", "phases"]
    tasks = copy_tasks(TASKS, tmp_path, names)
    env = world_env(world)
    results = harbor_run(tmp_path, tasks, OURS, "ours", env)
    assert sorted(results) == names
    for name, trial in results.items():
        assert trial.raw["config"]["environment"]["import_path"] == OURS
        assert trial.exception is None, (name, trial.exception)
        assert trial.reward == 1.0, (name, trial.raw.get("verifier_result"))
    job = tmp_path / "jobs" / "ours"
    said = (next(job.glob("phases__*")) / "verifier" / "test-stdout.txt").read_text()
    assert "allowed=hello from allowed.test denied=refused agent=blocked" in said
    assert "reached" not in (next(job.glob("no-network__*")) / "agent" / "oracle.txt").read_text()
    assert labelled_ids() <= before


@pytest.mark.slow
def test_the_same_tasks_score_the_same_on_harbors_docker(harbor_image: str, tmp_path: Path) -> None:
    """Parity: the tasks that need no egress control score 1.0 on Harbor's own `docker`
    environment too (its egress control needs an image from a registry, which this machine
    does not reach: the network tasks run on ours only)."""
    token = secrets.token_hex(6)
    tasks = copy_tasks(TASKS, tmp_path, ["hello-dockerfile", "compose-service"], token)
    try:
        results = harbor_run(tmp_path, tasks, "docker", "theirs")
    finally:
        remove_images(token)
    assert sorted(results) == ["compose-service", "hello-dockerfile"]
    for name, trial in results.items():
        assert trial.exception is None, (name, trial.exception)
        assert trial.reward == 1.0, (name, trial.raw.get("verifier_result"))


HOSTILE_COMPOSE = """\
services:
  main:
    privileged: true
    volumes:
      - /:/host
"""

PLANT = """\
#!/bin/bash
# Links and a FIFO where Harbor downloads the logs from: each would lead a download out of
# the trial's folder, or hang it.
ln -s {target}/planted-agent /logs/agent/planted
ln -s / /logs/agent/root
mkfifo /logs/agent/fifo
echo 1 > /logs/verifier/reward.txt
"""

PLANT_TEST = """\
#!/bin/bash
ln -sf {target}/planted-verifier /logs/verifier/reward.txt
"""


@pytest.mark.slow
def test_hostile_tasks_reach_nothing_of_the_host(harbor_image: str, tmp_path: Path) -> None:
    """A dataset's task that asks for the host's root, privileged, is refused before any
    container starts, with the reason in the trial's result, and so are one whose Compose
    file is a link to a host file (never read), one whose environment/ is a link to a host
    folder (never built from), and one whose env reads a host variable the caller does not
    pass (ORCHESTRATOR_ALLOW_ENV); a trial whose agent and verifier leave links
    out of the logs folders and a FIFO in them fails, and nothing is written through them
    (the targets are in the work folder, which the host and the Harbor container share); an
    agent past its timeout is stopped there."""
    before = labelled_ids()
    tasks = copy_tasks(TASKS, tmp_path, ["hello-dockerfile"])
    escape = tasks / "escape"
    shutil.copytree(tasks / "hello-dockerfile", escape)
    (escape / "environment" / "docker-compose.yaml").write_text(HOSTILE_COMPOSE)
    plant = tasks / "plant"
    shutil.copytree(tasks / "hello-dockerfile", plant)
    (plant / "solution" / "solve.sh").write_text(PLANT.format(target=tmp_path))
    (plant / "tests" / "test.sh").write_text(PLANT_TEST.format(target=tmp_path))
    secret = tmp_path / "host-secret.yaml"
    secret.write_text("services: {main: {image: SECRET-VALUE-0451}}\n")
    linked = tasks / "linked"
    shutil.copytree(tasks / "hello-dockerfile", linked)
    (linked / "environment" / "docker-compose.yaml").symlink_to(secret)
    slow = tasks / "slow"
    shutil.copytree(tasks / "hello-dockerfile", slow)
    toml = (slow / "task.toml").read_text().replace("timeout_sec = 120.0", "timeout_sec = 3.0", 1)
    (slow / "task.toml").write_text(toml)
    (slow / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 300\n")
    outside = tmp_path / "outside"  # a host folder the task's environment/ links to
    outside.mkdir()
    (outside / "Dockerfile").write_text("FROM orchestrator-test/python:3.11\nCOPY . /leak\n")
    (outside / "secret.txt").write_text("SECRET-FOLDER-0451\n")
    envlink = tasks / "envlink"
    shutil.copytree(tasks / "hello-dockerfile", envlink)
    shutil.rmtree(envlink / "environment")
    (envlink / "environment").symlink_to(outside)
    envtpl = tasks / "envtpl"
    shutil.copytree(tasks / "hello-dockerfile", envtpl)
    toml = (envtpl / "task.toml").read_text()
    toml = toml.replace("[verifier]\n", '[verifier]\nenv = { VLEAK = "${HOSTILE_SECRET}" }\n')
    (envtpl / "task.toml").write_text(toml + 'env = { LEAK = "${HOSTILE_SECRET}" }\n')
    shutil.rmtree(tasks / "hello-dockerfile")
    results = harbor_run(
        tmp_path, tasks, OURS, "hostile", {"HOSTILE_SECRET": "SECRET-VARIABLE-0451"}
    )
    refused = results["envlink"].exception
    assert refused is not None and "not a link" in refused["exception_message"], refused
    refused = results["envtpl"].exception
    assert refused is not None, results["envtpl"].raw
    assert "ORCHESTRATOR_ALLOW_ENV=HOSTILE_SECRET" in refused["exception_message"], refused
    for found in (tmp_path / "jobs").rglob("*"):
        if found.is_file():
            text = found.read_text(errors="replace")
            assert "SECRET-FOLDER" not in text and "SECRET-VARIABLE" not in text, found
    refused = results["escape"].exception
    assert refused is not None and "privileged" in refused["exception_message"], refused
    refused = results["linked"].exception
    assert refused is not None and "task's file" in refused["exception_message"], refused
    assert "SECRET-VALUE" not in json.dumps(results["linked"].raw)
    timed_out = results["slow"].exception
    assert timed_out is not None and timed_out["exception_type"] == "AgentTimeoutError"
    assert results["slow"].seconds < 60  # not the 300 s it asked to sleep
    assert results["plant"].reward != 1.0
    job = tmp_path / "jobs" / "hostile"
    assert not list(tmp_path.glob("planted-*"))
    for found in job.rglob("*"):
        assert not found.is_symlink() and not found.is_fifo(), found
    assert labelled_ids() <= before


RELAY = """\
import socket, urllib.request
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 9000))
server.listen()
while True:
    client, _ = server.accept()
    url = client.recv(1000).decode().strip()
    try:
        body = urllib.request.urlopen(url, timeout=3).read()
    except Exception:
        body = b"failed"
    client.sendall(body)
    client.close()
"""
"""A sidecar that fetches what the sandbox asks it for: the agent's way around its policy,
were sidecars not held to it."""

RELAY_COMPOSE = """\
services:
  main:
    depends_on: [relay]
    ports: ["127.0.0.1::8000"]
  relay:
    image: orchestrator-test/python:3.11
    command: ["python3", "-c", {relay}]
"""

ASK_RELAY = """\
#!/bin/bash
# Asks the relay for each URL; "blocked" when it answered that it could fetch none.
ask() {{ python3 - "$1" <<'PY'
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection(("relay", 9000), timeout=5)
        break
    except OSError:
        time.sleep(0.2)
s.sendall(sys.argv[1].encode() + b"\\n")
print(s.recv(1000).decode().strip())
PY
}}
outcome=blocked
for url in {urls}; do
  case "$(ask "$url")" in
    hello*) outcome="reached $url" ;;
    failed) ;;  # the relay answered: it could not fetch it
    *) outcome="no answer from the relay for $url" ;;
  esac
done
echo "$outcome" > {out}
{reward}
"""


@pytest.mark.slow
def test_a_sidecar_is_no_way_around_the_network_policy(
    harbor_image: str, world: World, tmp_path: Path
) -> None:
    """A Compose task's sidecar that fetches for the sandbox reaches nothing the sandbox may
    not: under `no-network` the agent asks it for the test world and gets nothing; with an
    agent of no network and a verifier allowlisting allowed.test, neither phase gets
    denied.test through it, nor the agent allowed.test. A published port is dropped (the
    trial's log says so): nothing of the host reaches the sandbox through one."""
    tasks = copy_tasks(TASKS, tmp_path, ["no-network", "phases"])
    urls = {
        "no-network": "http://allowed.test/ http://203.0.113.10/",
        "phases": "http://allowed.test/ http://denied.test/",
    }
    for name, agent_urls in urls.items():
        folder = tasks / name
        compose = RELAY_COMPOSE.format(relay=json.dumps(RELAY))
        (folder / "environment" / "docker-compose.yaml").write_text(compose)
        agent = ASK_RELAY.format(urls=agent_urls, out="/app/agent.txt", reward="")
        (folder / "solution" / "solve.sh").write_text(agent)
        verifier = ASK_RELAY.format(
            urls="http://denied.test/" if name == "phases" else agent_urls,
            out="/app/verifier.txt",
            reward='[ "$(cat /app/agent.txt)" = blocked ] && [ "$(cat /app/verifier.txt)" = '
            "blocked ] && echo 1 > /logs/verifier/reward.txt || echo 0 > "
            "/logs/verifier/reward.txt; cat /app/agent.txt /app/verifier.txt",
        )
        (folder / "tests" / "test.sh").write_text(verifier)
    env = world_env(world)
    results = harbor_run(tmp_path, tasks, OURS, "relay", env)
    for name, trial in results.items():
        said = next((tmp_path / "jobs" / "relay").glob(f"{name}__*/verifier/test-stdout.txt"))
        assert trial.exception is None, (name, trial.exception)
        assert trial.reward == 1.0, (name, said.read_text())
        log = next((tmp_path / "jobs" / "relay").glob(f"{name}__*/trial.log")).read_text()
        assert "services.main.ports dropped" in log, log[-2000:]


NEVER_HEALTHY = """\
services:
  main:
    depends_on: {slow: {condition: service_healthy}}
  slow:
    image: orchestrator-test/python:3.11
    command: ["sleep", "3600"]
    healthcheck: {test: ["CMD", "false"], interval: 1s, retries: 1000}
"""


@pytest.mark.slow
def test_a_start_harbor_gives_up_on_leaves_nothing(harbor_image: str, tmp_path: Path) -> None:
    """A task whose start never ends (a service that never turns healthy) past its
    build_timeout_sec: Harbor cancels the start, the trial fails with its timeout, and
    nothing is left: the environment it was making is removed by the start itself when it
    comes up within `cancel_grace` of the cancel (2 s here, not the default 30: it never
    comes up), else by its guardian, or (Harbor being its container's first process here,
    which takes the guardians with it) by the cleanup after Harbor, which says whether it
    removed anything."""
    before = labelled_ids()
    tasks = copy_tasks(TASKS, tmp_path, ["hello-dockerfile"])
    folder = tasks / "hello-dockerfile"
    (folder / "environment" / "docker-compose.yaml").write_text(NEVER_HEALTHY)
    toml = (folder / "task.toml").read_text().replace("600.0", "8.0")
    (folder / "task.toml").write_text(toml)
    results = harbor_run(tmp_path, tasks, OURS, "stuck", extra=("--ek", "cancel_grace=2"))
    failed = results["hello-dockerfile"].exception
    assert failed is not None and "Timeout" in failed["exception_type"], failed
    assert (tmp_path / "cleanup-stuck.txt").read_text().strip().endswith("removed")
    assert labelled_ids() <= before


KERNEL_TEST = """\
#!/bin/bash
# 1.0 only under gVisor: its kernel log says so (runc's sandbox may not read the host's)
if dmesg 2>/dev/null | grep -q gVisor; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.slow
def test_the_isolation_option_runs_trials_under_gvisor(
    harbor_image: str, gvisor_engine: str, tmp_path: Path
) -> None:
    """`--ek isolation=gvisor` runs the trial's sandbox under gVisor; without it, the same
    task's check that it is under gVisor fails (the check can fail)."""
    tasks = copy_tasks(TASKS, tmp_path, ["hello-dockerfile"])
    (tasks / "hello-dockerfile" / "tests" / "test.sh").write_text(KERNEL_TEST)
    gvisor = harbor_run(tmp_path, tasks, OURS, "gvisor", extra=("--ek", "isolation=gvisor"))
    runc = harbor_run(tmp_path, tasks, OURS, "runc")
    assert gvisor["hello-dockerfile"].exception is None, gvisor["hello-dockerfile"].exception
    assert gvisor["hello-dockerfile"].reward == 1.0
    assert runc["hello-dockerfile"].reward == 0.0
