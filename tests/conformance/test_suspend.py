"""The conformance suite's suspend profile (`orchestrator.testing.suspend`) against every
built-in backend, the same targets as the main suite. The local backend saves the workspace
only (rule "suspend-filesystem"); Swarm cannot suspend (rule "suspend": a service's image
would be on the node that ran it)."""

from __future__ import annotations

from orchestrator.testing.suspend import *  # noqa: F403
from tests.conformance.test_conformance import conformance_target  # noqa: F401  (the targets)
