"""`orchestrator doctor`: one [pass] / [warn] / [fail] line per check."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import typer

from orchestrator import settings
from orchestrator.errors import OrchestratorError
from orchestrator.spec.policy import PULL_ENV

Check = tuple[str, str]  # (status, message)


def _engine() -> str:
    """The engine's address: `--host` (or `podman`), else ORCHESTRATOR_ENGINE's."""
    return settings.chosen_engine()


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A docker CLI call, to the engine this run is told to use (`--host`), bounded."""
    if argv[:1] == ["docker"] and _engine():
        argv = ["docker", "--host", _engine(), *argv[1:]]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", "no answer within 20 s")


def _cli() -> Check:
    path = shutil.which("docker")
    if not path:
        return (
            "fail",
            "docker CLI not found: install Docker (on our machines: scripts/bootstrap-docker)",
        )
    out = _run(["docker", "version", "--format", "{{.Client.Version}}"])
    return "pass", f"docker CLI {out.stdout.strip() or '?'} at {path}"


def _daemon() -> Check:
    fmt = "{{.Server.Version}}{{range .Server.Components}} {{.Name}}{{end}}"
    out = _run(["docker", "version", "--format", fmt])
    where = f" at {_engine()}" if _engine() else ""
    if out.returncode != 0:
        return "fail", (
            f"Docker engine{where} not reachable: start it (Docker Desktop or dockerd; "
            "on our machines scripts/bootstrap-docker; Podman: `podman system service`), "
            "or check the --host address"
        )
    version, _, names = out.stdout.strip().partition(" ")
    if "podman" in names.lower():
        return "pass", (
            f"Podman engine {version}{where}: sandboxes without network only (docs/isolation.md)"
        )
    return "pass", f"Docker engine {version}{where}"


def _compose() -> Check:
    out = _run(["docker", "compose", "version", "--short"])
    if out.returncode != 0:
        return "fail", "Compose v2 plugin missing: `docker compose version` fails"
    return "pass", f"Compose plugin {out.stdout.strip()}"


def _dirs() -> Check:
    from orchestrator.paths import state_dir, state_folder

    try:
        state_folder()  # private and ours, in folders only root and we may change
    except OrchestratorError as exc:
        return "fail", str(exc)
    for d in (Path(tempfile.gettempdir()), state_dir()):
        try:
            with tempfile.NamedTemporaryFile(dir=d):
                pass
        except OSError as exc:
            return "fail", f"{d} is not writable: {exc.strerror}"
    return "pass", f"temp dir and state dir ({state_dir()}) writable"


def _headroom() -> Check:
    from orchestrator.backends.container.identity import POOL_ENV, subnet_pool

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
    out = _run(["docker", "network", "ls", "-q", "--filter", "label=org.orchestrator.managed=1"])
    used = len(out.stdout.split())
    return "pass", (
        f"network headroom: {total - used} of {total} /{prefix} subnets free in "
        f"{pool} (Docker's default pools alone hold ~30 networks)"
    )


TEST_IMAGES = "orchestrator-test/"
"""Images of this repository's tests: no registry has them, `just images` builds them."""


def _registry(image: str) -> str:
    """The registry an image reference names (Docker's rule: a first part with a `.` or a
    `:`, or `localhost`), else Docker Hub."""
    first, slash, _ = image.partition("/")
    named = slash and ("." in first or ":" in first or first == "localhost")
    return first if named else "docker.io"


def _missing_image(image: str) -> Check:
    """What `up` does about an image the engine lacks, and the fix (no registry is asked:
    whether a pull would work is not tried from here)."""
    where = f" at {_engine()}" if _engine() else ""
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


def _file_checks(file: Path) -> list[Check]:
    from orchestrator import Policy, backend_class, runtime_names
    from orchestrator.errors import SpecError
    from orchestrator.spec.loader import load_environment

    try:
        env = load_environment(file, backends=runtime_names)
        with tempfile.TemporaryDirectory() as ws:
            backend_class(env).check(env, Policy.from_env(), workspace=Path(ws))
    except SpecError as exc:
        return [("fail", f"{file}: {exc}")]
    checks: list[Check] = [("pass", f"{file}: valid, policy satisfied")]
    images = [env.spec.image] + [s.image for s in env.spec.services.values()]
    present = set()
    for image in dict.fromkeys(filter(None, images)):
        if _run(["docker", "image", "inspect", image]).returncode != 0:
            checks.append(_missing_image(image))
            continue
        present.add(image)
        checks.append(("pass", f"image {image} present"))
    if env.spec.image in present:  # the executor runs in the main image only
        probe = _run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "--entrypoint",
                "python3",
                env.spec.image,
                "-c",
                "import sys; print(sys.version_info[:2])",
            ]
        )
        if probe.returncode == 0:
            checks.append(("pass", f"fast executor can run in {env.spec.image} (python3 present)"))
        else:
            checks.append(
                (
                    "warn",
                    f"no python3 in {env.spec.image}: commands use plain "
                    "`docker exec` (about 20x slower per command)",
                )
            )
    return checks


def doctor(
    file: Path = typer.Argument(None, help="Also check this environment file."),
    host: str = typer.Option(
        None, "--host", "-H", help="Check the Docker engine at this address instead."
    ),
) -> None:
    """Check that this machine can run environments (on its engine, or the one at --host)."""
    if host:
        settings.use_flag(settings.DOCKER_HOST, host, "doctor --host")
    checks: list[Callable[[], Check]] = [_cli, _daemon, _compose, _dirs, _headroom]
    results: list[Check] = []
    for check in checks:
        status, message = check()
        results.append((status, message))
        if status == "fail" and check in (_cli, _daemon):
            break
    if not any(s == "fail" for s, _ in results):  # the backend's own (its gateway image)
        from orchestrator import get_runtime_class

        results += get_runtime_class("docker").doctor()
    if file is not None and not any(s == "fail" for s, _ in results):
        results += _file_checks(file)
    for status, message in results:
        typer.echo(f"[{status}] {message}")
    if any(s == "fail" for s, _ in results):
        raise typer.Exit(1)
