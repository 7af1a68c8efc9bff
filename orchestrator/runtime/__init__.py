"""Run commands and move files in a live environment, with one protocol for every backend."""

from orchestrator.runtime.base import Runtime
from orchestrator.runtime.options import SpawnOptions
from orchestrator.runtime.registry import (
    get_runtime_class,
    register_runtime,
    runtime_names,
    spawn_runtime,
)
from orchestrator.runtime.results import RuntimeResult, StreamEvent

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
