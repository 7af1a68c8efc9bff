"""Deprecated: the protocol moved to `orchestrator.sandbox`, the backends to
`orchestrator.backends`. Import the public names from `orchestrator` itself."""

import warnings

from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.options import SpawnOptions
from orchestrator.sandbox.registry import (
    get_runtime_class,
    register_runtime,
    runtime_names,
    spawn_runtime,
)
from orchestrator.sandbox.results import RuntimeResult, StreamEvent

warnings.warn(
    "orchestrator.runtime is deprecated: import these names from orchestrator",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "Runtime",
    "RuntimeResult",
    "SpawnOptions",
    "StreamEvent",
    "get_runtime_class",
    "register_runtime",
    "runtime_names",
    "spawn_runtime",
]
