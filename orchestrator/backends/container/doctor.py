"""What `orchestrator doctor` says of a container engine (its CLI, the engine, Compose, the
subnet pool's headroom) and of the images a file runs, asked of the Engine: the CLI runs
no engine command of its own (the backend class's `doctor()` answers)."""

from __future__ import annotations

import ipaddress
import re
import shutil
from pathlib import Path

from orchestrator import settings
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.identity import LABEL_MANAGED, POOL_ENV, subnet_pool
from orchestrator.errors import OrchestratorError
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import PULL_ENV

Check = tuple[str, str]
"""(pass | warn | fail, message)"""
DOCTOR_TIMEOUT = 20.0
"""Seconds each of doctor's engine calls may take."""
TEST_IMAGES = "orchestrator-test/"
"""Images of this repository's tests: no registry has them, `just images` builds them."""


def engine_checks(engine: Engine) -> list[Check]:
    """The docker CLI, the engine (stops there when either fails), Compose, and the subnet
    pool's headroom on this host."""
    engine = engine.within(min(engine.bound, DOCTOR_TIMEOUT))
    path = shutil.which("docker")
    if not path:
        return [
            (
                "fail",
                "docker CLI not found: install Docker (on our machines: scripts/bootstrap-docker)",
            )
        ]
    where = f" at {engine.address}" if engine.address else ""
    try:
        client, server = engine.versions()
    except OrchestratorError:
        return [
            ("pass", f"docker CLI at {path}"),
            (
                "fail",
                f"Docker engine{where} not reachable: start it (Docker Desktop or dockerd; "
                "on our machines scripts/bootstrap-docker; Podman: `podman system service`), "
                "or check the --host address",
            ),
        ]
    checks: list[Check] = [("pass", f"docker CLI {client or '?'} at {path}")]
    try:
        podman = engine.kind == "podman"
    except OrchestratorError:
        podman = False
    if podman:
        checks.append(
            (
                "pass",
                f"Podman engine {server}{where}: sandboxes without network only "
                "(docs/isolation.md)",
            )
        )
    else:
        checks.append(deadlock_check(server, where))
    return [*checks, _compose(engine), _headroom(engine)]


_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
FIXED = (20, 10, 27)
"""The first Docker engine whose network controller cannot deadlock when two endpoints of
one network go at once (moby/moby#46693 in 20.10.27; 23.0 and later have it from 2021)."""


def deadlock_check(server: str, where: str = "") -> Check:
    """The engine's own line: a warning for a Docker engine older than FIXED, with what it
    means here (removal.leave_networks narrows it; a file's services that end together on
    purpose can still wedge the engine for everyone on it)."""
    found = _VERSION.match(server or "")
    version = tuple(int(n) for n in found.groups()) if found else None
    if version is None or version >= FIXED:
        return "pass", f"Docker engine {server}{where}"
    return (
        "warn",
        f"Docker engine {server}{where} can deadlock when two endpoints of one network go at "
        "once (fixed in 20.10.27 and 23.0): every network call then hangs until the engine "
        "is restarted. Environments leave their networks one at a time (docs/network.md), "
        "but a file's services that end together can still set it off: upgrade the engine",
    )


def _compose(engine: Engine) -> Check:
    try:
        version = engine.compose_version()
    except OrchestratorError:
        return "fail", "Compose v2 plugin missing: `docker compose version` fails"
    return "pass", f"Compose plugin {version.strip()}"


def _headroom(engine: Engine) -> Check:
    pool, prefix = subnet_pool()
    total = 2 ** (prefix - pool.prefixlen)
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        routes = []
    for line in routes:
        fields = line.split()
        dest = ipaddress.ip_address(bytes.fromhex(fields[1])[::-1])
        mask = ipaddress.ip_address(bytes.fromhex(fields[7])[::-1])
        if int(mask) == 0:
            continue
        net = ipaddress.ip_network(f"{dest}/{mask}", strict=False)
        if net.overlaps(pool) and not fields[0].startswith(("br-", "docker")):
            return "warn", (
                f"subnet pool {pool} overlaps host route {net} on {fields[0]}: set "
                f"{POOL_ENV} to a free private range"
            )
    try:
        used = len(engine.ids("network", label=f"{LABEL_MANAGED}=1", action="listing networks"))
    except OrchestratorError:
        used = 0
    return "pass", (
        f"network headroom: {total - used} of {total} /{prefix} subnets free in "
        f"{pool} (Docker's default pools alone hold ~30 networks)"
    )


def image_checks(engine: Engine, env: Environment) -> list[Check]:
    """Each image the file runs is on the engine (what `up` does about one that is not,
    and the fix), and whether the fast executor runs in the main one (python3)."""
    engine = engine.within(min(engine.bound, DOCTOR_TIMEOUT))
    checks: list[Check] = []
    images = [env.spec.image] + [s.image for s in env.spec.services.values()]
    present = set()
    for image in dict.fromkeys(filter(None, images)):
        try:
            there = engine.has_image(image)
        except OrchestratorError:
            there = False
        if not there:
            checks.append(_missing_image(image, engine.address))
            continue
        present.add(image)
        checks.append(("pass", f"image {image} present"))
    main = env.spec.image
    if main in present:  # the executor runs in the main image only
        if engine.runs_python(main):
            checks.append(("pass", f"fast executor can run in {main} (python3 present)"))
        else:
            checks.append(
                (
                    "warn",
                    f"no python3 in {main}: commands use plain `docker exec` (about 20x "
                    "slower per command)",
                )
            )
    return checks


def _registry(image: str) -> str:
    """The registry an image reference names (Docker's rule: a first part with a `.` or a
    `:`, or `localhost`), else Docker Hub."""
    first, slash, _ = image.partition("/")
    named = slash and ("." in first or ":" in first or first == "localhost")
    return first if named else "docker.io"


def _missing_image(image: str, address: str) -> Check:
    """What `up` does about an image the engine lacks, and the fix (no registry is asked:
    whether a pull would work is not tried from here)."""
    where = f" at {address}" if address else ""
    if image.startswith(TEST_IMAGES):
        return "fail", (
            f"image {image} not present on the engine{where}: it is one of this "
            "repository's test images, which no registry has: build them with `just images` "
            "(scripts/build-images)"
        )
    if settings.ALLOW_PULL.get():
        return "warn", (
            f"image {image} not present on the engine{where}: `up` will pull it from "
            f"{_registry(image)} ({PULL_ENV} allows it); where the engine cannot reach that "
            "registry, `docker pull` it elsewhere and `docker load` it here"
        )
    return "fail", (
        f"image {image} not present on the engine{where}: `up` refuses it, as images are "
        f"never pulled unless the caller allows it: `docker pull` or `docker load` it, build "
        f"it under that name, or let the engine pull it from {_registry(image)} "
        f"({PULL_ENV}=1)"
    )
