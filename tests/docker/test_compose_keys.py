"""Compose keys with no v1 field before issue 23, on a real engine: a service's `entrypoint`
(plain, and under the gate of a service with a `workdir`), `depends_on` conditions that order
the services' starts, and `service_completed_successfully` making a job."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from orchestrator import load_environment, spawn_runtime
from orchestrator.backends.container.identity import LABEL_PROJECT
from orchestrator.backends.docker.buildplan import build_tags
from tests.docker.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE

SERVE = (
    "sleep 2; mkdir -p /tmp/www && echo up > /tmp/www/index.html && "
    "exec httpd -f -p 8080 -h /tmp/www"
)
CHECK = "wget -q -O- http://db:8080/ > /tmp/seen || exit 1; exec sleep 86400"


def test_entrypoints_order_and_jobs(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(
        f"""\
services:
  default:
    image: {BUSYBOX_IMAGE}
    command: tail -f /dev/null
    working_dir: /w
  db:
    image: {BUSYBOX_IMAGE}
    entrypoint: [sh, -c]
    command: ["{SERVE}"]
    healthcheck: {{test: [CMD, wget, -q, -O-, "http://127.0.0.1:8080/"], interval: 1s}}
  web:
    image: {BUSYBOX_IMAGE}
    entrypoint: sh -c '{CHECK}'
    depends_on:
      db: {{condition: service_healthy}}
      seed: {{condition: service_completed_successfully}}
  gated:
    image: {PYTHON_IMAGE}
    working_dir: /home/g
    user: "1000:1000"
    entrypoint: [sh, -c, 'pwd > /tmp/where; id -u >> /tmp/where; exec sleep 86400']
  seed:
    image: {BUSYBOX_IMAGE}
    entrypoint: [sh, -c, 'echo seeded']
"""
    )
    env = load_environment(tmp_path / "compose.yaml")
    assert env.spec.services["seed"].job
    with spawn_runtime(env) as rt:
        # web's entrypoint fetched from db at its start: it started after db was healthy
        assert rt.service("web").execute("cat /tmp/seen").stdout == "up\n"
        assert rt.service("gated").execute("cat /tmp/where").stdout == "/home/g\n1000\n"
        assert rt.execute("pwd").stdout == "/w\n"


def test_a_named_volume_is_shared_and_removed_with_the_environment(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(
        f"""\
services:
  default:
    image: {BUSYBOX_IMAGE}
    volumes: ["shared:/data:ro"]
  writer:
    image: {BUSYBOX_IMAGE}
    command: [sh, -c, "echo from writer > /out/note; exec sleep 86400"]
    volumes: [{{type: volume, source: shared, target: /out}}]
volumes:
  shared: {{}}
"""
    )
    with spawn_runtime(load_environment(tmp_path / "compose.yaml")) as rt:
        deadline = time.monotonic() + 30
        while (seen := rt.execute("cat /data/note")).exit_code and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen.stdout == "from writer\n"
        assert rt.execute("touch /data/x").exit_code != 0  # read-only here
        ident = rt.info().id
        [name] = volumes_of(ident)  # ours: labelled with the environment
    assert volumes_of(ident) == [] and not _exists(name)


def volumes_of(project: str) -> list[str]:
    out = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label={LABEL_PROJECT}={project}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.split()


def _exists(name: str) -> bool:
    probe = ["docker", "volume", "inspect", name]
    return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0


def test_the_images_user_and_workdir_when_compose_names_none(tmp_path: Path) -> None:
    """As Compose runs it: a privilege-escalation task whose image says `USER app` must not
    hand its agent root, and commands start in the image's WORKDIR."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BUSYBOX_IMAGE}\nRUN echo 'app:x:1234:1234::/home/app:/bin/sh' >> /etc/passwd "
        "&& echo 'app:x:1234:' >> /etc/group && mkdir -p /home/app /root "
        "&& chown 1234:1234 /home/app "
        "&& echo flag > /root/flag && chmod 700 /root\nUSER app\nWORKDIR /home/app\n"
    )
    (tmp_path / "compose.yaml").write_text(
        "services:\n  default:\n    build: .\n    command: tail -f /dev/null\n"
    )
    env = load_environment(tmp_path / "compose.yaml")
    assert (env.spec.user, env.spec.workdir) == ("image", None)
    try:
        with spawn_runtime(env) as rt:
            assert rt.execute("id -u; pwd").stdout == "1234\n/home/app\n"
            assert rt.workdir == "/home/app"
            rt.write_file("note.txt", "here\n")  # relative paths start there too
            assert rt.execute("cat /home/app/note.txt").stdout == "here\n"
            assert rt.execute("cat /root/flag").exit_code != 0
            assert rt.execute("id -u", user="root").stdout == "0\n"  # the caller may ask
    finally:
        for tag in build_tags(env):  # this test's build, by its tag: one per run otherwise
            subprocess.run(["docker", "image", "rm", tag], capture_output=True, timeout=60)


def test_a_services_healthcheck_runs_as_its_user(tmp_path: Path) -> None:
    """The hostile review: a non-root service with a workdir runs its PID 1 (the gate) as
    root, and the engine ran its healthcheck as root too, so a script its user planted ran
    as root with the default capabilities. The check now drops to the user as the command
    does."""
    (tmp_path / "compose.yaml").write_text(
        f"""\
services:
  default:
    image: {BUSYBOX_IMAGE}
  side:
    image: {PYTHON_IMAGE}
    user: "1000:1000"
    working_dir: /home/side
    command: [sleep, "86400"]
    healthcheck:
      test: ["CMD-SHELL", "id -u > /tmp/check_ran_as"]
      interval: 1s
"""
    )
    with spawn_runtime(load_environment(tmp_path / "compose.yaml")) as rt:
        ran_as = rt.service("side").execute("cat /tmp/check_ran_as").stdout
        assert ran_as == "1000\n"
