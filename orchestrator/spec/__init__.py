"""What an environment file may say: models, loader, legacy migration and policy.

The names below are loaded on first use: importing one submodule (the models, the policy)
does not load the loader and the Compose mapping behind it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.spec.loader import Environment, load_environment, load_environment_text
    from orchestrator.spec.models import EnvironmentV1

_MODULE_OF = {
    "Environment": "orchestrator.spec.loader",
    "load_environment": "orchestrator.spec.loader",
    "load_environment_text": "orchestrator.spec.loader",
    "EnvironmentV1": "orchestrator.spec.models",
}
__all__ = ["Environment", "EnvironmentV1", "load_environment", "load_environment_text"]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
