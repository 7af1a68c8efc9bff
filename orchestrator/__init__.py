"""orchestrator: versioned environment files compiled to Docker Compose sandboxes, with one
runtime protocol for every backend.

The public names load lazily, so `import orchestrator` stays fast and pulls in no Docker
library until a Docker environment is spawned. Type checkers see them through the imports
below and the literal `__all__`.
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
        ProjectNotFound,
        RuntimeClosed,
        SandboxFileNotFound,
        SandboxFileTimeout,
        SandboxIsADirectory,
        SandboxNotADirectory,
        SandboxPermissionError,
        SandboxUnavailable,
        SandboxUnsafeArchive,
        SetupFailed,
        SpecError,
        SpecIssue,
        StartupError,
        UsageError,
    )
    from orchestrator.runtime.base import Runtime, Sandbox
    from orchestrator.runtime.options import SpawnOptions
    from orchestrator.runtime.pool import Pool
    from orchestrator.runtime.registry import register_runtime, runtime_names, spawn_runtime
    from orchestrator.runtime.results import (
        Connection,
        ExecMode,
        RuntimeInfo,
        RuntimeResult,
        StreamEvent,
        StreamKind,
    )
    from orchestrator.runtime.snapshot import Snapshot, list_snapshots
    from orchestrator.spec.loader import Environment, load_environment, load_environment_text
    from orchestrator.spec.models import PublishedPort
    from orchestrator.spec.policy import Policy

__all__ = [
    "BackendUnavailable",
    "CommandFailed",
    "CommandTimeout",
    "Connection",
    "DockerError",
    "Environment",
    "ExecMode",
    "ExecutorLost",
    "HealthcheckFailed",
    "OrchestratorError",
    "OutputLimitExceeded",
    "Policy",
    "PolicyError",
    "Pool",
    "ProjectNotFound",
    "PublishedPort",
    "Runtime",
    "RuntimeClosed",
    "RuntimeInfo",
    "RuntimeResult",
    "Sandbox",
    "SandboxFileNotFound",
    "SandboxFileTimeout",
    "SandboxIsADirectory",
    "SandboxNotADirectory",
    "SandboxPermissionError",
    "SandboxUnavailable",
    "SandboxUnsafeArchive",
    "SetupFailed",
    "Snapshot",
    "SpawnOptions",
    "SpecError",
    "SpecIssue",
    "StartupError",
    "StreamEvent",
    "StreamKind",
    "UsageError",
    "__version__",
    "list_snapshots",
    "load_environment",
    "load_environment_text",
    "register_runtime",
    "runtime_names",
    "spawn_runtime",
]

_HOME = {
    "orchestrator.errors": (
        "BackendUnavailable CommandFailed CommandTimeout DockerError ExecutorLost "
        "HealthcheckFailed OrchestratorError OutputLimitExceeded PolicyError ProjectNotFound "
        "RuntimeClosed SandboxFileNotFound SandboxFileTimeout SandboxIsADirectory "
        "SandboxNotADirectory SandboxPermissionError SandboxUnavailable SandboxUnsafeArchive "
        "SetupFailed SpecError SpecIssue StartupError UsageError"
    ),
    "orchestrator.runtime.base": "Runtime Sandbox",
    "orchestrator.runtime.options": "SpawnOptions",
    "orchestrator.runtime.pool": "Pool",
    "orchestrator.runtime.registry": "register_runtime runtime_names spawn_runtime",
    "orchestrator.runtime.results": (
        "Connection ExecMode RuntimeInfo RuntimeResult StreamEvent StreamKind"
    ),
    "orchestrator.runtime.snapshot": "Snapshot list_snapshots",
    "orchestrator.spec.loader": "Environment load_environment load_environment_text",
    "orchestrator.spec.models": "PublishedPort",
    "orchestrator.spec.policy": "Policy",
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
