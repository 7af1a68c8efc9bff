"""The conformance suite, for any backend: what every runtime must keep (exit codes, separate
streams, timeouts that kill the whole tree, files, setup, lifecycle, hostile input).

A third-party backend runs it from one test module (pytest needed)::

    import pytest
    from orchestrator.testing import Target
    from orchestrator.testing.conformance import *  # noqa: F403  (the checks and fixtures)

    @pytest.fixture(scope="module", params=[Target("mybackend", env_lines=("image: x",))])
    def conformance_target(request: pytest.FixtureRequest) -> Target:
        return request.param

A backend lists the rules it deliberately does not keep in its `deviations` mapping (rule id
-> reason); the checks of those rules are skipped with that reason.
"""

from __future__ import annotations

from orchestrator.testing.target import Target

__all__ = ["Target"]
