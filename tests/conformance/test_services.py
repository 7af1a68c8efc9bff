"""The conformance suite's multi-service profile (`orchestrator.testing.services`) against
every built-in backend, the same targets as the main suite: a sidecar whose command reads the
static assets as it starts, a non-root sidecar in its own workdir, and commands, files and
timeouts on a sidecar. The local backend has no services: it lists the deviation and skips."""

from __future__ import annotations

from orchestrator.testing.services import *  # noqa: F403
from tests.conformance.test_conformance import conformance_target  # noqa: F401  (the targets)
