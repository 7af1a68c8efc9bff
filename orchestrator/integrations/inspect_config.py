"""What a sample's environment is made of, as Inspect hands it to the provider
(`orchestrator.integrations.inspect`): the config (a file's path, or
OrchestratorSandboxConfig with a warm pool), the file loaded with the sample's metadata as
variables, the ports a sandbox publishes as Inspect lists them, and how long a file call
may take within the sample's limits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from inspect_ai.util import SandboxEnvironmentConfigType, sample_limits
from inspect_ai.util._sandbox.environment import HostMapping, PortMapping
from pydantic import BaseModel, ConfigDict, Field

from orchestrator import Environment, PublishedPort, load_environment
from orchestrator.errors import UsageError
from orchestrator.settings import FILE_TIMEOUT


class OrchestratorSandboxConfig(BaseModel):
    """The provider's config, beside a plain path: `sandbox=("orchestrator",
    OrchestratorSandboxConfig(file="env.yaml", prewarm=8))`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str
    """The environment file."""
    prewarm: int = Field(default=0, ge=0, le=256)
    """Environments started in task_init and kept ready for the samples (set it to the
    eval's max_sandboxes); 0: each sample starts its own. A sample's metadata then reaches
    its commands as variables, but not the file's setup commands, which ran before the
    sample was known."""
    samples: int | None = Field(default=None, ge=1)
    """With prewarm: how many samples this config serves in the eval (samples x epochs),
    when known. The warm pool then starts no more environments than that: none is started
    for nothing at the end (on a busy machine those cost the others CPU). A sample past it
    (a retry) starts its own."""


def environment(
    config: SandboxEnvironmentConfigType | None, variables: dict[str, str] | None = None
) -> Environment:
    """The config's environment; a Compose file's values interpolated from `variables` (a
    sample's SAMPLE_METADATA_*), as Inspect's docker sandbox does."""
    path = config.file if isinstance(config, OrchestratorSandboxConfig) else config
    if not isinstance(path, str):
        raise UsageError(
            'the orchestrator sandbox takes an environment file: sandbox=("orchestrator", '
            f'"env.yaml"), a Compose file or a Dockerfile, or OrchestratorSandboxConfig(file=...), '
            f"got {config!r}"
        )
    env = load_environment(Path(path), variables=variables)
    if env.compose_main is None and "default" in env.spec.services:
        raise UsageError(
            f"{path}: a service named 'default' would hide the main sandbox, which Inspect "
            "calls 'default'; rename the service"
        )
    return env


def prewarm(config: SandboxEnvironmentConfigType | None) -> tuple[int, int | None]:
    """The warm pool's size and total starts (0: none)."""
    if not isinstance(config, OrchestratorSandboxConfig):
        return 0, None
    return config.prewarm, config.samples


def metadata_env(metadata: dict[str, Any]) -> dict[str, str]:
    """Sample metadata as Inspect's SAMPLE_METADATA_<KEY> variables (scalars only)."""
    out = {}
    for key, value in metadata.items():
        if isinstance(value, str | int | float | bool):
            name = re.sub(r"[^A-Za-z0-9]", "_", str(key)).upper()
            out[f"SAMPLE_METADATA_{name}"] = str(value)
    return out


def ports(ports: tuple[PublishedPort, ...], service: str) -> list[PortMapping]:
    """The ports `service` publishes (TCP and UDP), as Inspect lists a sandbox's."""
    mine = [p for p in ports if p.service == service and p.protocol in ("tcp", "udp")]
    return [
        PortMapping(
            container_port=p.container,
            protocol="tcp" if p.protocol == "tcp" else "udp",
            mappings=[HostMapping(host_ip=p.host_ip, host_port=p.host)],
        )
        for p in mine
    ]


MIN_FILE_DEADLINE = 5.0
"""Seconds a file call gets even when the sample's time is (nearly) up: Inspect ends the
sample itself; the call only must not outlive it by long."""


def file_deadline() -> float:
    """A file call's deadline: Inspect's API gives none, and our worker thread cannot be
    cancelled, so the call ends by the sample's own time (or working) limit at the latest,
    and by ORCHESTRATOR_FILE_TIMEOUT in any case."""
    deadline = FILE_TIMEOUT.get()
    try:
        limits = sample_limits()
        left = [limits.time.remaining, limits.working.remaining]
    except (RuntimeError, LookupError):  # no running sample (a direct call)
        left = []
    for remaining in left:
        if remaining is not None:
            deadline = min(deadline, max(MIN_FILE_DEADLINE, remaining))
    return deadline
