"""Deprecated: the Inspect AI provider moved to `orchestrator.integrations.inspect` (Inspect
finds it through the `inspect_ai` entry point either way)."""

import warnings

from orchestrator.integrations.inspect import *  # noqa: F403
from orchestrator.integrations.inspect import OrchestratorSandbox, metadata_env

warnings.warn(
    "orchestrator.inspect is deprecated: import from orchestrator.integrations.inspect",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["OrchestratorSandbox", "metadata_env"]
