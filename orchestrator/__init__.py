"""orchestrator: versioned environment files compiled to Docker Compose sandboxes, with one
runtime protocol for every backend.

The public names load lazily, so `import orchestrator` stays fast and pulls in no Docker
library until a Docker environment is spawned.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orchestrator._version import __version__

if TYPE_CHECKING:
    from orchestrator.errors import (
        BackendUnavailable,
        CommandFailed,
        CommandTimeout,
        DockerError,
        ExecutorLost,
        HealthcheckFailed,
        OrchestratorError,
        OutputLimitExceeded,
        PolicyError,
        RuntimeClosed,
        SandboxUnavailable,
        SetupFailed,
        SpecError,
        StartupError,
        UsageError,
    )
    from orchestrator.runtime.base import Runtime
    from orchestrator.runtime.options import SpawnOptions
    from orchestrator.runtime.registry import register_runtime, runtime_names, spawn_runtime
    from orchestrator.runtime.results import RuntimeResult, StreamEvent
    from orchestrator.spec.loader import Environment, load_environment, load_environment_text
    from orchestrator.spec.policy import Policy

_EXPORTS = {
    "load_environment": "orchestrator.spec.loader",
    "load_environment_text": "orchestrator.spec.loader",
    "Environment": "orchestrator.spec.loader",
    "Policy": "orchestrator.spec.policy",
    "spawn_runtime": "orchestrator.runtime.registry",
    "register_runtime": "orchestrator.runtime.registry",
    "runtime_names": "orchestrator.runtime.registry",
    "Runtime": "orchestrator.runtime.base",
    "SpawnOptions": "orchestrator.runtime.options",
    "RuntimeResult": "orchestrator.runtime.results",
    "StreamEvent": "orchestrator.runtime.results",
    **{
        name: "orchestrator.errors"
        for name in (
            "OrchestratorError",
            "SpecError",
            "PolicyError",
            "UsageError",
            "BackendUnavailable",
            "DockerError",
            "StartupError",
            "SetupFailed",
            "HealthcheckFailed",
            "RuntimeClosed",
            "CommandFailed",
            "CommandTimeout",
            "ExecutorLost",
            "SandboxUnavailable",
            "OutputLimitExceeded",
        )
    },
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
