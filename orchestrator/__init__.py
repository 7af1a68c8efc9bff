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
    from orchestrator.backends.container.engine import context_address
    from orchestrator.errors import (
        AdmissionTimeout,
        BackendUnavailable,
        CommandFailed,
        CommandTimeout,
        DockerError,
        ExecutorLost,
        HealthcheckFailed,
        OrchestratorError,
        OutputLimitExceeded,
        PolicyError,
        PoolExhausted,
        ProjectNotFound,
        RuntimeClosed,
        SandboxFileNotFound,
        SandboxFileTimeout,
        SandboxIsADirectory,
        SandboxNotADirectory,
        SandboxPaused,
        SandboxPermissionError,
        SandboxUnavailable,
        SandboxUnsafeArchive,
        SetupFailed,
        SpecError,
        SpecIssue,
        StartupError,
        UsageError,
    )
    from orchestrator.sandbox.admission import check_admission
    from orchestrator.sandbox.attach import attach, attachable
    from orchestrator.sandbox.base import Runtime
    from orchestrator.sandbox.calls import Sandbox
    from orchestrator.sandbox.inventory import environments, reap, remove_environment
    from orchestrator.sandbox.options import BuildChoice, SpawnOptions
    from orchestrator.sandbox.pool import Pool
    from orchestrator.sandbox.registry import (
        backend_class,
        get_runtime_class,
        prepare,
        register_runtime,
        runtime_names,
        spawn_runtime,
    )
    from orchestrator.sandbox.results import (
        Connection,
        EnvironmentStatus,
        ExecMode,
        RuntimeInfo,
        RuntimeResult,
        StreamEvent,
        StreamKind,
    )
    from orchestrator.sandbox.snapshot import Snapshot, list_snapshots
    from orchestrator.sandbox.suspend import wake
    from orchestrator.spec.loader import Environment, load_environment, load_environment_text
    from orchestrator.spec.models import PublishedPort
    from orchestrator.spec.policy import Policy

__all__ = [
    "AdmissionTimeout",
    "BackendUnavailable",
    "BuildChoice",
    "CommandFailed",
    "CommandTimeout",
    "Connection",
    "DockerError",
    "Environment",
    "EnvironmentStatus",
    "ExecMode",
    "ExecutorLost",
    "HealthcheckFailed",
    "OrchestratorError",
    "OutputLimitExceeded",
    "Policy",
    "PolicyError",
    "Pool",
    "PoolExhausted",
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
    "SandboxPaused",
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
    "attach",
    "attachable",
    "backend_class",
    "check_admission",
    "context_address",
    "environments",
    "get_runtime_class",
    "list_snapshots",
    "load_environment",
    "load_environment_text",
    "prepare",
    "reap",
    "register_runtime",
    "remove_environment",
    "runtime_names",
    "spawn_runtime",
    "wake",
]

_HOME = {
    "orchestrator.backends.container.engine": "context_address",
    "orchestrator.errors": (
        "AdmissionTimeout BackendUnavailable CommandFailed CommandTimeout DockerError ExecutorLost "
        "HealthcheckFailed OrchestratorError OutputLimitExceeded PolicyError PoolExhausted "
        "ProjectNotFound "
        "RuntimeClosed SandboxFileNotFound SandboxFileTimeout SandboxIsADirectory "
        "SandboxNotADirectory SandboxPaused SandboxPermissionError SandboxUnavailable "
        "SandboxUnsafeArchive SetupFailed SpecError SpecIssue StartupError UsageError"
    ),
    "orchestrator.sandbox.admission": "check_admission",
    "orchestrator.sandbox.attach": "attach attachable",
    "orchestrator.sandbox.base": "Runtime",
    "orchestrator.sandbox.calls": "Sandbox",
    "orchestrator.sandbox.inventory": "environments reap remove_environment",
    "orchestrator.sandbox.options": "BuildChoice SpawnOptions",
    "orchestrator.sandbox.pool": "Pool",
    "orchestrator.sandbox.registry": (
        "backend_class get_runtime_class prepare register_runtime runtime_names spawn_runtime"
    ),
    "orchestrator.sandbox.results": (
        "Connection EnvironmentStatus ExecMode RuntimeInfo RuntimeResult StreamEvent StreamKind"
    ),
    "orchestrator.sandbox.snapshot": "Snapshot list_snapshots",
    "orchestrator.sandbox.suspend": "wake",
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
