"""The conformance suite's pause profile (`orchestrator.testing.pause`) against every built-in
backend, the same targets as the main suite. The local backend stops its processes with
SIGSTOP rather than a freezer, and a command in flight there waits for the resume: both are
listed deviations."""

from __future__ import annotations

from orchestrator.testing.pause import *  # noqa: F403
from tests.conformance.test_conformance import conformance_target  # noqa: F401  (the targets)
