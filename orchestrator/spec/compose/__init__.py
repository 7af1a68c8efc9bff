"""A Compose file (or a bare Dockerfile) read as an environment.

Most agent benchmarks describe their sandboxes as Compose files. `from_compose` maps one onto
the v1 model: the service marked `x-default: true`, else the one named `default`, else the
first, becomes the main sandbox; the others become services. Every key meets one fate, kept in
`ComposeMapping.fates`:
- mapped onto a v1 field (and from there checked by the schema and the caller's policy, which
  refuses privileged mode, host namespaces, devices, capabilities and host paths it does not
  allow, at the Compose key's own line);
- refused here, with the reason and the fix, when it would weaken the sandbox and has no v1
  field for the policy to judge (`security_opt: seccomp=unconfined`, `userns_mode: host` ...);
- or ignored, with the reason, as a notice the loader hands on. Nothing is dropped unseen.

Values are interpolated as Compose does (`${VAR}`, `${VAR:-default}`, `$$` ...), from the
variables the caller gives (an Inspect sample's SAMPLE_METADATA_*), then the `.env` file
beside the Compose file, then those host variables the caller's policy passes
(ORCHESTRATOR_ALLOW_ENV): a file alone reads no host variable.

The parts: `variables` (interpolation, env files), `model` (the mapping's record and bounds),
`values` (readers of the keys' values), `target` (where one service's keys are written),
`service` (one service's keys), `storage` (those that bring files in), `mapping` (the whole
file).
"""

from __future__ import annotations

from orchestrator.spec.compose.mapping import compose_issue, from_compose, keys_of, main_service
from orchestrator.spec.compose.model import (
    COMPOSE_NAMES,
    MAX_ENV_BYTES,
    MAX_ENV_FILES,
    MAX_PORT_RANGE,
    MAX_PORTS,
    MAX_SERVICES,
    ComposeMapping,
    ComposeWhere,
    Fate,
    dockerfile_compose,
    is_dockerfile,
    looks_compose,
)
from orchestrator.spec.compose.variables import (
    MAX_ENV_FILE,
    MAX_NESTING,
    InterpolationError,
    interpolate,
    read_env_file,
)

__all__ = [
    "COMPOSE_NAMES",
    "MAX_ENV_BYTES",
    "MAX_ENV_FILE",
    "MAX_ENV_FILES",
    "MAX_NESTING",
    "MAX_PORTS",
    "MAX_PORT_RANGE",
    "MAX_SERVICES",
    "ComposeMapping",
    "ComposeWhere",
    "Fate",
    "InterpolationError",
    "compose_issue",
    "dockerfile_compose",
    "from_compose",
    "interpolate",
    "is_dockerfile",
    "keys_of",
    "looks_compose",
    "main_service",
    "read_env_file",
]
