"""The conformance suite's multi-service profile (`orchestrator.testing.services`) against
every built-in backend, the same targets as the main suite: a sidecar whose command reads the
static assets as it starts, a non-root sidecar in its own workdir, and commands, files and
timeouts on a sidecar. The local backend has no services: it lists the deviation and skips."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.testing import Target
from orchestrator.testing.services import *  # noqa: F403
from tests.conformance.test_conformance import TARGETS


@pytest.fixture(scope="module", params=TARGETS, ids=[t.id for t in TARGETS])
def conformance_target(request: pytest.FixtureRequest) -> Target:
    target: Target = request.param
    if target.backend == "swarm":
        request.getfixturevalue("swarm_cluster")  # before the module's runtime starts
    if target.id == "docker-remote":  # the Docker backend on another machine's engine
        engine = request.getfixturevalue("remote_engine")
        target = dataclasses.replace(target, process_env={"ORCHESTRATOR_DOCKER_HOST": engine})
    return target
