"""`rt.usage()` (sandbox/usage.py, backends/container/usage.py): what an environment cost,
read from the cgroup its engine made for each container, on runc and gVisor, per service and
in total, and still there once it is removed."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator import Usage, aio, spawn_runtime
from tests.conftest import BUSYBOX_IMAGE
from tests.docker.conftest import MakeEnv

pytestmark = pytest.mark.docker

BUSY = "import time\nwhile time.process_time() < 2: pass"
"""Two seconds of CPU, however busy the machine (the loop's own time, not the clock's)."""
HOLD = "b = bytearray(200 * 1024 * 1024)\nimport time; time.sleep(2.5)"
MB = 1024 * 1024


def test_a_busy_loop_and_an_allocation_show_in_cpu_memory_and_gb_seconds(
    make_env: MakeEnv,
) -> None:
    with spawn_runtime(make_env("resources: {memory: 512m}\n", name="usage")) as rt:
        before = rt.usage()
        assert before.measured and set(before.services) == {"main"}
        began = time.monotonic()
        rt.execute(["python3", "-c", BUSY], check=True)
        busy = rt.usage()
        spent = busy.total.cpu_seconds - before.total.cpu_seconds
        assert 1.7 <= spent <= 2.3, spent  # 2 s of a busy loop (and the interpreter's start)
        assert busy.total.memory_peak_bytes < 200 * MB
        rt.execute(["python3", "-c", HOLD], check=True)
        held = rt.usage()
        wall = time.monotonic() - began  # (what both commands took, however busy the machine)
        assert held.total.memory_peak_bytes >= 200 * MB
        assert held.total.memory_bytes < 200 * MB  # (freed: it is the peak that stays)
        # 200 MB for 2.5 s, sampled every second: at least 0.3 GB-s more
        assert held.total.memory_gb_seconds - busy.total.memory_gb_seconds >= 0.3
        assert held.workspace_bytes == 0
        rt.write_file("data.bin", b"x" * 300_000)  # the workspace is a folder of this machine
        assert rt.usage().workspace_bytes == 300_000
        main = held.services["main"]
        assert main.commands == 2 + before.services["main"].commands  # (a write is no command)
        assert 4.3 <= main.command_seconds - before.services["main"].command_seconds <= wall
        assert held.seconds >= 4.5 and not held.final
    last = rt.usage()  # removed: the last reading, taken as it went
    assert last.final and last.measured
    assert last.total.cpu_seconds >= held.total.cpu_seconds
    assert last.total.memory_peak_bytes >= 200 * MB
    assert rt.usage() == last  # and it stays so


def test_each_service_is_read_apart_and_a_fork_bomb_shows_in_its_peak(make_env: MakeEnv) -> None:
    body = f"""\
user: '0:0'
resources: {{pids: 256}}
services:
  side:
    image: {BUSYBOX_IMAGE}
    command: [sleep, '600']
"""
    with spawn_runtime(make_env(body, name="usage2")) as rt:
        # a root sandbox starts 50 sleepers, then kills them: the peak remembers them
        rt.execute(
            'p=""; for i in $(seq 50); do sleep 30 & p="$p $!"; done; sleep 1.5; kill $p; wait',
            check=True,
        )
        rt.service("side").execute(["true"])
        got = rt.usage()
        assert set(got.services) == {"main", "side"}
        assert got.services["main"].pids_peak >= 50
        assert got.services["main"].pids < 50
        assert got.services["side"].commands == 1 and got.services["side"].cpu_seconds > 0
        assert got.total.commands == got.services["main"].commands + 1
        assert got.total.memory_bytes == sum(s.memory_bytes for s in got.services.values())


def test_gvisor_environments_are_measured_too(make_env: MakeEnv, gvisor_engine: str) -> None:
    """The engine's count of a gVisor sandbox's CPU, where the loop in it ran two seconds by
    gVisor's own clock: under ptrace, on a loaded machine, that clock runs ahead of the CPU
    the sandbox got (one second of it was measured as 0.87 s in a full run), so the bound
    is half of it, far above what starting the sandbox's executor costs."""
    with spawn_runtime(make_env("isolation: gvisor\n", name="usagegv")) as rt:
        rt.execute(["python3", "-c", BUSY], check=True)
        got = rt.usage()
    assert got.measured and got.total.cpu_seconds >= 1.0 and got.total.memory_peak_bytes > 0


def test_the_awaited_door_reads_the_same(make_env: MakeEnv) -> None:
    async def main() -> Usage:
        async with await aio.spawn(make_env("", name="ausage")) as rt:
            await rt.execute(["true"])
            return await rt.usage()

    got = asyncio.run(main())
    assert got.measured and got.services["main"].commands == 1


def test_readings_cost_nothing_after_the_environment_goes(make_env: MakeEnv) -> None:
    """The sampler drops a removed environment: its reads stop (the meter is final)."""
    rt = spawn_runtime(make_env("", name="usage3"))
    rt.cleanup()
    last = rt.usage()
    time.sleep(1.5)  # (a sampler still reading would move nothing, but must not fail)
    assert rt.usage() == last and last.final
