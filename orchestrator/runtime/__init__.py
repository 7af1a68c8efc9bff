"""Deprecated: the protocol moved to `orchestrator.sandbox`, the backends to
`orchestrator.backends`. Import the public names from `orchestrator` itself."""

import warnings

from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.options import SpawnOptions
from orchestrator.sandbox.registry import get_runtime_class, register_runtime, runtime_names
from orchestrator.sandbox.results import RuntimeResult, StreamEvent
from orchestrator.services.spawn import spawn_runtime

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
