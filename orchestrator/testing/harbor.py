"""Run Harbor's own CLI (`harbor run`) against this machine's engine, from the image
`scripts/build-images harbor` makes (Debian 13, Python 3.13, Harbor and this package's
dependencies): for the Harbor test and `python -m bench.harbor`.

The container gets the engine's socket, the docker CLI and its Compose plugin, this checkout
(read-only, on PYTHONPATH) and a work folder, the last two at their own paths: our
environments bind-mount host folders by the paths this package and its state folder have
inside, which the engine reads as the host's. It has no network of its own: Harbor reaches
the engine and nothing else.

The `docker` CLI is used through subprocess, so that the module stands alone."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator import settings

HARBOR_IMAGE = settings.HARBOR_IMAGE.get()
"""The image `scripts/build-images harbor` makes."""
OURS = "orchestrator.integrations.harbor:OrchestratorEnvironment"
"""Our environment, as `harbor run -e` takes it."""
LABEL = "org.orchestrator.test=1"
"""Carried by the Harbor container."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The checkout the container imports this package from."""
DOCKER_TIMEOUT = 30.0
"""Seconds one docker CLI call that reads the engine's setup may take."""


class HarborRunFailed(RuntimeError):
    """`harbor run` exited non-zero or passed its deadline (the message has its output's end)."""


def _engine_mounts() -> list[str]:
    """`docker run` arguments that give the container this machine's engine: its socket,
    the docker CLI and its Compose plugin. RuntimeError when the engine is not on a socket."""
    host = os.environ.get("DOCKER_HOST") or subprocess.run(
        ["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"],
        capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=True,
    ).stdout.strip()  # fmt: skip
    if not host.startswith("unix://"):
        raise RuntimeError(f"the Harbor container mounts the engine's socket; it is at {host}")
    cli = shutil.which("docker")
    if cli is None:
        raise RuntimeError("no docker CLI on PATH")
    plugins = json.loads(
        subprocess.run(
            ["docker", "info", "--format", "{{json .ClientInfo.Plugins}}"],
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT,
            check=True,
        ).stdout
    )
    compose = next((p["Path"] for p in plugins or () if p.get("Name") == "compose"), None)
    if compose is None:
        raise RuntimeError("the docker CLI has no Compose plugin")
    return [
        "-v", f"{host.removeprefix('unix://')}:/var/run/docker.sock",
        "-v", f"{os.path.realpath(cli)}:/usr/local/bin/docker:ro",
        "-v", f"{os.path.realpath(compose)}:/usr/local/lib/docker/cli-plugins/docker-compose:ro",
    ]  # fmt: skip


def harbor_run(
    work: Path,
    tasks: Path,
    environment: str,
    job: str,
    env: dict[str, str] | None = None,
    *,
    concurrent: int = 4,
    attempts: int = 1,
    image: str = HARBOR_IMAGE,
    deadline: float = 600.0,
    extra: Sequence[str] = (),
) -> Path:
    """`harbor run` of every task in `tasks` on `environment` (`OURS`, or one of Harbor's:
    "docker"), `attempts` trials each, `concurrent` at a time, `extra` more arguments of
    `harbor run` (`--ek KEY=VALUE`); the job's folder. What `orchestrator cleanup` then
    removed (environments Harbor left) is in `work`/cleanup-`job`.txt. `work` holds
    the jobs, our state folder and Harbor's home. HarborRunFailed unless Harbor ends well
    within `deadline` seconds (its container is then removed)."""
    variables = {
        "PYTHONPATH": str(CHECKOUT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(work / "home"),
        settings.STATE_DIR.name: str(work / "state"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # Harbor's model library: no fetch at import
        "CLEANED": str(work / f"cleanup-{job}.txt"),
        **(env or {}),
    }
    name = f"orch-harbor-{secrets.token_hex(4)}"
    argv = [
        "docker", "run", "--rm", "--network", "none", "--label", LABEL, "--name", name,
        *_engine_mounts(),
        "-v", f"{CHECKOUT}:{CHECKOUT}:ro", "-v", f"{work}:{work}", "-w", str(work),
        *(a for k, v in variables.items() for a in ("-e", f"{k}={v}")),
        image,
        # Harbor is this container's first process: the guardians of environments it
        # abandoned (a start it cancelled) would die with it before they remove them, so
        # `orchestrator cleanup` does after it, as on any machine where the owner is gone
        "sh", "-c",
        'harbor "$@"; code=$?; python3 -m orchestrator cleanup > "$CLEANED"; exit $code', "sh",
        "run", "-p", str(tasks), "-e", environment, "-n", str(concurrent),
        "-k", str(attempts), "-o", str(work / "jobs"), "--job-name", job, "-y",
        *extra,
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=deadline)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        raise HarborRunFailed(f"harbor run did not end within {deadline:g} s") from None
    if done.returncode != 0:
        raise HarborRunFailed(f"harbor run exited {done.returncode}: {done.stderr[-3000:]}")
    return work / "jobs" / job


@dataclass(frozen=True)
class Trial:
    """One trial, as Harbor's result.json says it went."""

    task: str
    reward: float | None
    exception: dict[str, Any] | None
    seconds: float
    """From the trial's start to its end."""
    raw: dict[str, Any]


def trials(job: Path) -> list[Trial]:
    """Every trial of a job's folder, by task name."""
    out = []
    for found in sorted(job.glob("*/result.json")):
        result = json.loads(found.read_text())
        verified = result.get("verifier_result") or {}
        started, finished = (
            datetime.fromisoformat(result[k]) for k in ("started_at", "finished_at")
        )
        out.append(
            Trial(
                task=result["task_name"],
                reward=(verified.get("rewards") or {}).get("reward"),
                exception=result.get("exception_info"),
                seconds=(finished - started).total_seconds(),
                raw=result,
            )
        )
    return out


def copy_tasks(source: Path, into: Path, names: list[str], token: str = "") -> Path:
    """Tasks `names` of folder `source` copied into `into`/tasks; with `token`, each
    Dockerfile labels its image with it, so that what Harbor's own environment builds
    (without our labels) is found and removed by `remove_images(token)`."""
    folder = into / "tasks"
    for name in names:
        shutil.copytree(source / name, folder / name)
        if token:
            for dockerfile in (folder / name).glob("environment/Dockerfile"):
                text = dockerfile.read_text() + f"LABEL {TOKEN_LABEL}={token}\n"
                dockerfile.write_text(text)
    return folder


TOKEN_LABEL = "org.orchestrator.test.harbor"


def remove_images(token: str) -> None:
    """The images built from tasks `copy_tasks` marked with `token`, by id."""
    ids = subprocess.run(
        ["docker", "image", "ls", "-aq", "--filter", f"label={TOKEN_LABEL}={token}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    if ids:
        subprocess.run(["docker", "image", "rm", "-f", *set(ids)], capture_output=True, timeout=120)
