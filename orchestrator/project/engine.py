"""python-on-whales clients and errors converted at the boundary."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from python_on_whales import Container, DockerClient
from python_on_whales.exceptions import DockerException

from orchestrator.errors import BackendUnavailable, DockerError, OrchestratorError

DAEMON_DOWN = (
    "cannot connect to the docker daemon",
    "failed to connect to the docker api",
    "is the docker daemon running",
)


def docker_client(**kwargs: Any) -> DockerClient:
    return DockerClient(**kwargs)


def wrap(action: str, exc: DockerException) -> OrchestratorError:
    """A python-on-whales error as ours, keeping exit code and stderr."""
    stderr = (exc.stderr or "") if isinstance(exc.stderr, str) else ""
    text = stderr + (exc.stdout or "" if isinstance(exc.stdout, str) else "")
    lowered = text.lower()
    if any(sign in lowered for sign in DAEMON_DOWN):
        return BackendUnavailable(
            "the Docker engine is not reachable: start it (Docker Desktop, "
            "or `dockerd`; on our machines run scripts/bootstrap-docker)"
        )
    return DockerError(
        f"{action} failed (exit {exc.return_code})",
        command=[str(c) for c in exc.docker_command],
        returncode=exc.return_code,
        stderr=stderr,
    )


@contextmanager
def docker_errors(action: str) -> Iterator[None]:
    try:
        yield
    except DockerException as exc:
        raise wrap(action, exc) from exc
    except FileNotFoundError as exc:
        raise BackendUnavailable(
            "the docker CLI is not installed (see `orchestrator doctor`)"
        ) from exc


def service_of(labels: Mapping[str, str] | None, default: str = "") -> str:
    """The Compose service a container belongs to, from its labels."""
    return (labels or {}).get("com.docker.compose.service", default)


def published_ports(containers: Iterable[Container]) -> list[dict[str, Any]]:
    """Published ports of containers as [{service, container, protocol, host_ip, host}],
    with ephemeral host ports resolved."""
    out = []
    for c in containers:
        service = service_of(c.config.labels, c.name)
        for key, binds in sorted((c.network_settings.ports or {}).items()):
            port, _, proto = key.partition("/")
            out += [
                {
                    "service": service,
                    "container": int(port),
                    "protocol": proto,
                    "host_ip": b.get("HostIp", ""),
                    "host": int(b["HostPort"]),
                }
                for b in binds or []
            ]
    return out
