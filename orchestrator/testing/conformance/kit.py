"""What every check of the conformance suite stands on: the runtimes it checks (`rt`, one per
target shared by the read-mostly checks; `fresh`, one a check of its own), a target's
deviations turned into skips, and the probes for processes left behind."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Runtime
from orchestrator.testing.target import Target

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def rt(conformance_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """One runtime per target, shared by the module's read-mostly checks."""
    with conformance_target.spawn(tmp_path_factory.mktemp(f"env-{conformance_target.id}")) as r:
        yield r


@pytest.fixture
def fresh(conformance_target: Target, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime of its own, for checks that kill or close it."""
    runtime = conformance_target.spawn(tmp_path)
    try:
        yield runtime
    finally:
        runtime.cleanup()


def skip_if(target: Target, rule: str, when: bool = True) -> None:
    """Skip the calling check when `target` deviates from `rule` (and `when` holds), with the
    reason its `deviations` give."""
    reason = target.deviation(rule)
    if reason and when:
        pytest.skip(f"{target.id} deviates from {rule!r}: {reason}")


def survivors(rt: Runtime, marker: str) -> str:
    """Processes whose command line holds `marker` (the pattern never matches itself)."""
    pattern = marker[:-1] + "[" + marker[-1] + "]"
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null "
        f"| grep -q '{pattern}' && echo $f; done; true"
    )
    return rt.execute(script, user="root" if os.geteuid() == 0 else None).stdout.strip()


def survivors_within(rt: Runtime, marker: str, seconds: float) -> str:
    """`survivors`, looked at again until none are left or `seconds` have passed: for a kill
    that is made after the call returns (a closed stream's), on a machine that may be slow."""
    deadline = time.monotonic() + seconds
    while (left := survivors(rt, marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def unique_sleep() -> str:
    """A `sleep` duration (years) that no other process of this host names: a local
    backend's check sees the whole host, where five digits were found in other command
    lines (a port, `sleep 2147483647`), and a survivor was reported where none was."""
    return str(100_000_000 + uuid.uuid4().int % 899_999_999)
