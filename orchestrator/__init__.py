"""orchestrator: versioned environment files compiled to Docker Compose sandboxes, with one
runtime protocol for every backend.

The public names load lazily, so `import orchestrator` stays fast and pulls in no Docker
library until a Docker environment is spawned. They are listed once, as the imports below,
which type checkers read as they stand; at run time the first name asked for reads the same
imports out of this file (the home module of each name) and loads only that name's module.
"""

from __future__ import annotations

import functools
import importlib

from orchestrator._version import __version__ as __version__

TYPE_CHECKING = False  # (as typing's: `typing` is not loaded here, for `orchestrator exec`)

if TYPE_CHECKING:  # the public names, each from its home module: the one list of them
    from orchestrator.backends.container.engine import context_address as context_address
    from orchestrator.errors import (
        AdmissionTimeout as AdmissionTimeout,
        BackendUnavailable as BackendUnavailable,
        CommandFailed as CommandFailed,
        CommandTimeout as CommandTimeout,
        DockerError as DockerError,
        ExecutorLost as ExecutorLost,
        HealthcheckFailed as HealthcheckFailed,
        OrchestratorError as OrchestratorError,
        OutputLimitExceeded as OutputLimitExceeded,
        PolicyError as PolicyError,
        PoolExhausted as PoolExhausted,
        ProcessEnded as ProcessEnded,
        ProcessNotFound as ProcessNotFound,
        ProjectNotFound as ProjectNotFound,
        RuntimeClosed as RuntimeClosed,
        SandboxFileNotFound as SandboxFileNotFound,
        SandboxFileTimeout as SandboxFileTimeout,
        SandboxIsADirectory as SandboxIsADirectory,
        SandboxNotADirectory as SandboxNotADirectory,
        SandboxPaused as SandboxPaused,
        SandboxPermissionError as SandboxPermissionError,
        SandboxUnavailable as SandboxUnavailable,
        SandboxUnsafeArchive as SandboxUnsafeArchive,
        SetupFailed as SetupFailed,
        SpecError as SpecError,
        SpecIssue as SpecIssue,
        StartupError as StartupError,
        UsageError as UsageError,
    )
    from orchestrator.sandbox.base import (
        Runtime as Runtime,
    )
    from orchestrator.sandbox.calls import (
        Sandbox as Sandbox,
    )
    from orchestrator.sandbox.options import (
        BuildChoice as BuildChoice,
        SpawnOptions as SpawnOptions,
    )
    from orchestrator.sandbox.process import (
        Process as Process,
    )
    from orchestrator.sandbox.registry import (
        get_runtime_class as get_runtime_class,
        register_runtime as register_runtime,
        runtime_names as runtime_names,
    )
    from orchestrator.sandbox.results import (
        Connection as Connection,
        EnvironmentStatus as EnvironmentStatus,
        ExecMode as ExecMode,
        RuntimeInfo as RuntimeInfo,
        RuntimeResult as RuntimeResult,
        StreamEvent as StreamEvent,
        StreamKind as StreamKind,
    )
    from orchestrator.sandbox.snapshot import (
        Snapshot as Snapshot,
        list_snapshots as list_snapshots,
    )
    from orchestrator.sandbox.usage import (
        Egress as Egress,
        ServiceUsage as ServiceUsage,
        Usage as Usage,
    )
    from orchestrator.services.admission import (
        check_admission as check_admission,
    )
    from orchestrator.services.attach import (
        attach as attach,
        attachable as attachable,
    )
    from orchestrator.services.inventory import (
        environments as environments,
        reap as reap,
        remove_environment as remove_environment,
        running_logs as running_logs,
    )
    from orchestrator.services.lock import (
        LockResult as LockResult,
        lock_environment as lock_environment,
    )
    from orchestrator.services.pool import (
        Pool as Pool,
        claim_ready as claim_ready,
    )
    from orchestrator.services.spawn import (
        backend_class as backend_class,
        prepare as prepare,
        spawn_runtime as spawn_runtime,
    )
    from orchestrator.services.suspend import (
        fork as fork,
        wake as wake,
    )
    from orchestrator.spec.loader import (
        Environment as Environment,
        load_environment as load_environment,
        load_environment_text as load_environment_text,
    )
    from orchestrator.spec.models import (
        PublishedPort as PublishedPort,
    )
    from orchestrator.spec.policy import (
        Policy as Policy,
    )


if TYPE_CHECKING:  # (not a public name: only the block above lists those)
    from typing import Any


@functools.cache
def _homes() -> dict[str, str]:
    """Each public name's home module, as the `if TYPE_CHECKING:` imports above say."""
    import ast  # (only when a name is first asked for: `import orchestrator` loads nothing)

    source = __loader__.get_source(__name__)  # type: ignore[name-defined]
    if source is None:  # (an installation of compiled files only)
        raise ImportError("orchestrator's public names are read from its __init__.py: missing")
    block = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    return {
        alias.name: str(node.module)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return sorted(["__version__", *_homes()])
    module = _homes().get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(["__version__", *_homes()])
