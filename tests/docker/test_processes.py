"""Started processes where commands go by plain `docker exec` (no executor): a terminal is
refused with the reason, before any command runs; without one, a process works as on the
executor (the conformance suite's docker-plain target checks that)."""

from __future__ import annotations

import pytest

from orchestrator import UsageError
from tests.docker.conftest import MakeEnv, spawn_in_mode


def test_plain_exec_refuses_a_terminal_with_the_reason(make_env: MakeEnv) -> None:
    with spawn_in_mode("plain", make_env("", name="plaintty")) as rt:
        proc = rt.start("echo never > ran", tty=True)
        with pytest.raises(UsageError, match="needs the in-container executor"):
            proc.wait(60)
        assert rt.execute("cat ran 2>/dev/null || echo absent").stdout == "absent\n"
        with rt.start("cat", tty=False) as fine:  # without a terminal: as on the executor
            fine.write("still works\n")
            fine.close_stdin()
            assert fine.wait(60).stdout == "still works\n"
