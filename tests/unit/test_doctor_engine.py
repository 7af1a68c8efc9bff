"""`doctor`'s line for the engine: a warning for a Docker engine whose network controller can
deadlock when two endpoints of one network go at once (before 20.10.27), a pass after."""

from __future__ import annotations

import pytest

from orchestrator.backends.container.doctor import deadlock_check


@pytest.mark.parametrize("version", ["20.10.24+dfsg1", "20.10.26", "19.03.15", "18.09.1-ce"])
def test_an_engine_with_the_deadlock_is_warned_of(version: str) -> None:
    status, said = deadlock_check(version, " at unix:///x.sock")
    assert status == "warn"
    assert said.startswith(f"Docker engine {version} at unix:///x.sock can deadlock")
    assert "20.10.27" in said and "docs/network.md" in said


@pytest.mark.parametrize("version", ["20.10.27", "23.0.1", "24.0.7", "28.2.2", "", "dev"])
def test_a_fixed_or_unknown_engine_passes(version: str) -> None:
    assert deadlock_check(version) == ("pass", f"Docker engine {version}")
