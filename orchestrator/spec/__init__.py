"""What an environment file may say: models, loader, legacy migration and policy."""

from orchestrator.spec.loader import Environment, load_environment, load_environment_text
from orchestrator.spec.models import EnvironmentV1

__all__ = ["Environment", "EnvironmentV1", "load_environment", "load_environment_text"]
