"""Behaviour every backend keeps. `from orchestrator.testing.conformance import *` in a test
module that defines a `conformance_target` fixture (a `Target`) runs every check against it;
a backend's deliberate deviations are listed once, in its `deviations` mapping, and the
checks of those rules skip with the reason given there.

The checks live by what they look at (`commands`, `processes`, `files`, `lifecycle`,
`hostile`); this
module gathers them, and the fixtures they use (`kit`), for that one import."""

from __future__ import annotations

from orchestrator.testing.conformance.commands import *  # noqa: F403
from orchestrator.testing.conformance.files import *  # noqa: F403
from orchestrator.testing.conformance.hostile import *  # noqa: F403
from orchestrator.testing.conformance.kit import *  # noqa: F403
from orchestrator.testing.conformance.lifecycle import *  # noqa: F403
from orchestrator.testing.conformance.processes import *  # noqa: F403
