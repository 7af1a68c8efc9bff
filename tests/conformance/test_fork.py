"""The conformance suite's fork profile (`orchestrator.testing.fork`) against every built-in
backend, the same targets as the main suite. Only a gVisor sandbox with no network keeps
its memory (`docker-gvisor`); the others list "fork-memory", and Swarm cannot fork (rule
"suspend")."""

from __future__ import annotations

from orchestrator.testing.fork import *  # noqa: F403
from tests.conformance.test_conformance import conformance_target  # noqa: F401  (the targets)
