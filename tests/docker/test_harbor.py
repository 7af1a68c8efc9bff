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
import os
import secrets
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.testing.world import World
from tests.conftest import ROOT, build_test_image, in_ci, labelled_ids
from tests.docker.test_egress import module_dir, world

pytestmark = pytest.mark.docker
__all__ = ["module_dir", "world"]  # (the fixtures this module shares)

HARBOR_IMAGE = os.environ.get("ORCHESTRATOR_HARBOR_IMAGE", "orchestrator-test/harbor:0.26.0")
TASKS = ROOT / "tests" / "data" / "harbor"
OURS = "orchestrator.integrations.harbor:OrchestratorEnvironment"
RUN_DEADLINE = 600.0
"""Seconds one `harbor run` may take (a handful of trials; a build on a busy machine)."""
LABEL = "org.orchestrator.test=1"


def _docker_parts() -> list[str]:
    """`docker run` arguments that give the container this machine's engine: its socket,
    the docker CLI and its Compose plugin, each at a path of its own."""
    host = subprocess.run(
        ["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    host = os.environ.get("DOCKER_HOST") or host
    if not host.startswith("unix://"):
        pytest.skip(f"Harbor's test mounts the engine's socket; the engine is at {host}")
    cli = shutil.which("docker")
    assert cli is not None
    plugins = json.loads(
        subprocess.run(
            ["docker", "info", "--format", "{{json .ClientInfo.Plugins}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    )
    compose = next(p["Path"] for p in plugins if p["Name"] == "compose")
    return [
        "-v", f"{host.removeprefix('unix://')}:/var/run/docker.sock",
        "-v", f"{os.path.realpath(cli)}:/usr/local/bin/docker:ro",
        "-v", f"{os.path.realpath(compose)}:/usr/local/lib/docker/cli-plugins/docker-compose:ro",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def harbor_image() -> str:
    problem = build_test_image("harbor", HARBOR_IMAGE)
    if problem is not None:
        why = f"Harbor test skipped: {problem}"
        if in_ci():
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return HARBOR_IMAGE


def harbor_run(
    image: str,
    work: Path,
    tasks: Path,
    environment: str,
    job: str,
    env: dict[str, str] | None = None,
    *,
    concurrent: int = 4,
) -> Path:
    """`harbor run` of every task in `tasks` on `environment`, in the Harbor image; the
    job's folder. Fails the test unless Harbor itself ends well."""
    variables = {
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(work / "home"),
        "ORCHESTRATOR_STATE_DIR": str(work / "state"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # Harbor's model library: no fetch at import
        **(env or {}),
    }
    argv = [
        "docker", "run", "--rm", "--network", "none", "--label", LABEL,
        "--name", f"orch-harbor-{secrets.token_hex(4)}",
        *_docker_parts(),
        "-v", f"{ROOT}:{ROOT}:ro", "-v", f"{work}:{work}", "-w", str(work),
        *(a for k, v in variables.items() for a in ("-e", f"{k}={v}")),
        image,
        "harbor", "run", "-p", str(tasks), "-e", environment, "-n", str(concurrent),
        "-o", str(work / "jobs"), "--job-name", job, "-y",
    ]  # fmt: skip
    name = argv[argv.index("--name") + 1]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_DEADLINE)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        pytest.fail(f"harbor run did not end within {RUN_DEADLINE:g} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work / "jobs" / job


def trials(job: Path) -> dict[str, dict[str, Any]]:
    """Each trial's result.json, by task name."""
    out = {}
    for found in sorted(job.glob("*/result.json")):
        result = json.loads(found.read_text())
        out[result["task_name"]] = result
    return out


def reward(result: dict[str, Any]) -> float | None:
    verified = result.get("verifier_result") or {}
    return (verified.get("rewards") or {}).get("reward")


def copy_tasks(work: Path, names: list[str], token: str = "") -> Path:
    """The shipped tasks `names` in a folder of `work`; with `token`, each Dockerfile labels
    its image with it (Harbor's own environment builds images without our labels: the test
    finds and removes them by it)."""
    folder = work / "tasks"
    for name in names:
        shutil.copytree(TASKS / name, folder / name)
        if token:
            for dockerfile in (folder / name).glob("environment/Dockerfile"):
                text = dockerfile.read_text() + f"LABEL org.orchestrator.test.harbor={token}\n"
                dockerfile.write_text(text)
    return folder


def remove_images(token: str) -> None:
    """The images Harbor's own environment built for this test, by id."""
    ids = subprocess.run(
        ["docker", "image", "ls", "-aq", "--filter", f"label=org.orchestrator.test.harbor={token}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    if ids:
        subprocess.run(["docker", "image", "rm", "-f", *set(ids)], capture_output=True, timeout=120)


@pytest.mark.slow
def test_harbor_runs_its_tasks_on_orchestrator(
    harbor_image: str, world: World, tmp_path: Path
) -> None:
    """The oracle scores 1.0 on all four tasks, run four at a time: a Dockerfile, a Compose
    service reached by name, `no-network` holding against the test world (by name and by
    address), and an agent with no network before a verifier whose allowlist reaches one
    host of the world and not another. Nothing of ours is left after."""
    before = labelled_ids()
    tasks = copy_tasks(tmp_path, ["hello-dockerfile", "compose-service", "no-network", "phases"])
    env = {
        "ORCHESTRATOR_EGRESS_NETWORK": os.environ["ORCHESTRATOR_EGRESS_NETWORK"],
        "ORCHESTRATOR_EGRESS_DNS": os.environ["ORCHESTRATOR_EGRESS_DNS"],
    }
    job = harbor_run(harbor_image, tmp_path, tasks, OURS, "ours", env)
    results = trials(job)
    assert sorted(results) == ["compose-service", "hello-dockerfile", "no-network", "phases"]
    for name, result in results.items():
        assert result["config"]["environment"]["import_path"] == OURS
        assert result.get("exception_info") is None, (name, result["exception_info"])
        assert reward(result) == 1.0, (name, result.get("verifier_result"))
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
    tasks = copy_tasks(tmp_path, ["hello-dockerfile", "compose-service"], token)
    try:
        job = harbor_run(harbor_image, tmp_path, tasks, "docker", "theirs")
    finally:
        remove_images(token)
    results = trials(job)
    assert sorted(results) == ["compose-service", "hello-dockerfile"]
    for name, result in results.items():
        assert result.get("exception_info") is None, (name, result["exception_info"])
        assert reward(result) == 1.0, (name, result.get("verifier_result"))


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
    container starts, with the reason in the trial's result, and so is one whose Compose
    file is a link to a host file (never read); a trial whose agent and verifier leave links
    out of the logs folders and a FIFO in them fails, and nothing is written through them
    (the targets are in the work folder, which the host and the Harbor container share); an
    agent past its timeout is stopped there."""
    before = labelled_ids()
    tasks = copy_tasks(tmp_path, ["hello-dockerfile"])
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
    shutil.rmtree(tasks / "hello-dockerfile")
    job = harbor_run(harbor_image, tmp_path, tasks, OURS, "hostile")
    results = trials(job)
    refused = results["escape"]["exception_info"]
    assert refused is not None and "privileged" in refused["exception_message"], refused
    refused = results["linked"]["exception_info"]
    assert refused is not None and "task's file" in refused["exception_message"], refused
    assert "SECRET-VALUE" not in json.dumps(results["linked"])
    timed_out = results["slow"]["exception_info"]
    assert timed_out is not None and timed_out["exception_type"] == "AgentTimeoutError"
    took = [datetime.fromisoformat(results["slow"][k]) for k in ("started_at", "finished_at")]
    assert (took[1] - took[0]).total_seconds() < 60  # not the 300 s it asked to sleep
    assert reward(results["plant"]) != 1.0
    assert not list(tmp_path.glob("planted-*"))
    for found in job.rglob("*"):
        assert not found.is_symlink() and not found.is_fifo(), found
    assert labelled_ids() <= before
