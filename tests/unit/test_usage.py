"""sandbox/usage.py's arithmetic and sampler, backends/container/usage.py's reading of a
cgroup's files (v1 and v2 layouts, on folders made here), and the local backend's usage
(commands only: it reads no accounting)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Egress, spawn_runtime
from orchestrator.backends.container.usage import Cgroup
from orchestrator.sandbox.usage import Meter, Reading, Tally

MB = 1024 * 1024


def _feed(readings: list[dict[str, Reading]], times: list[float]) -> Meter:
    """A meter whose readings come from `readings`, taken at `times` (monotonic seconds)."""
    clock = iter([*times, times[-1]])
    meter = Meter(read=lambda: readings.pop(0), clock=lambda: next(clock), started=0.0)
    for _ in range(len(times)):
        meter.sample()
    return meter


def test_memory_is_integrated_between_readings_and_peaks_kept() -> None:
    one = [
        {"main": Reading(cpu_ns=0, memory=0, memory_peak=None, pids=1)},
        {"main": Reading(cpu_ns=10**9, memory=1000 * MB, memory_peak=None, pids=40)},
        {"main": Reading(cpu_ns=3 * 10**9, memory=1000 * MB, memory_peak=1500 * MB, pids=2)},
    ]
    meter = _feed(one, [0.0, 2.0, 4.0])
    whole = meter.usage({"main": Tally()})
    assert whole.seconds == 4.0  # (the clock's last reading: the span watched)
    got = whole.services["main"]
    # 0 -> 1000 MB over 2 s (a trapezoid: 1000 MB-s), then 1000 MB for 2 s (2000 MB-s)
    assert got.memory_gb_seconds == pytest.approx(3000 * MB / 1e9)
    assert got.cpu_seconds == 3.0 and got.memory_bytes == 1000 * MB
    assert got.memory_peak_bytes == 1500 * MB  # the kernel's mark, above any reading
    assert got.pids == 2 and got.pids_peak == 40  # the highest reading (no kernel mark)


def test_totals_sum_services_and_commands_count_everywhere() -> None:
    readings = [
        {
            "main": Reading(cpu_ns=10**9, memory=10, memory_peak=20, pids=3, pids_peak=7),
            "db": Reading(cpu_ns=2 * 10**9, memory=5, memory_peak=9, pids=1),
        }
    ]
    meter = _feed(readings, [1.0])
    main, db, gone = Tally(), Tally(), Tally()
    main.add(0.5)
    main.add(1.5)
    gone.add(2.0)  # a service with commands and no reading is still listed
    got = meter.usage({"main": main, "db": db, "web": gone})
    assert list(got.services) == ["main", "db", "web"]
    assert got.total.cpu_seconds == 3.0 and got.total.memory_bytes == 15
    assert got.total.memory_peak_bytes == 29 and got.total.pids_peak == 8
    assert got.total.commands == 3 and got.total.command_seconds == 4.0
    assert got.services["web"].cpu_seconds == 0 and got.measured


def test_after_the_last_reading_nothing_changes() -> None:
    now = {"main": Reading(cpu_ns=1, memory=1, memory_peak=1, pids=1)}
    meter = Meter(read=lambda: now)
    meter.sample()
    meter.finish()
    first = meter.usage({})
    now["main"] = Reading(cpu_ns=99, memory=99, memory_peak=99, pids=99)
    meter.sample()
    meter.finish()
    assert meter.usage({}) == first and first.final


def test_the_last_count_is_short_while_the_gateway_holds_requests_open() -> None:
    """What the gateway holds open as the environment goes is never logged: the last count
    says so. Asked only then, and only of a count someone reads (a cleanup nobody reads
    the usage of stays as cheap)."""
    for held in (False, True):
        asked: list[int] = []
        meter = Meter(
            read=dict,
            count=lambda: Egress(1, 0, 2, 3),
            held=lambda held=held, asked=asked: asked.append(1) or held,  # type: ignore[misc]
        )
        assert meter.usage({}).egress is None  # (asked: the last reading counts)
        meter.counted()
        assert meter.usage({}).egress == Egress(1, 0, 2, 3) and not asked  # (not the last)
        meter.finish()
        assert meter.usage({}).egress == Egress(1, 0, 2, 3, complete=not held)
        assert asked == [1]
    unread = Meter(read=dict, count=lambda: Egress(), held=lambda: 1 / 0 > 0)
    unread.finish()  # nobody asked: neither counted nor asked what is open
    assert unread.usage({}).egress is None
    # counted again at removal (recount asks what is held then): not asked twice
    again = Meter(read=dict, count=lambda: Egress(1, 0, 2, 3), held=lambda: 1 / 0 > 0)
    again.usage({})
    again.finish(recounted=True)
    # short until the recount comes (a removal that fails first never brings it)
    assert again.usage({}).egress == Egress(1, 0, 2, 3, complete=False)
    again.recount(held=False)
    assert again.usage({}).egress == Egress(1, 0, 2, 3)
    again.recount(held=True)
    assert again.usage({}).egress == Egress(1, 0, 2, 3, complete=False)


def test_a_recount_after_the_last_reading_replaces_its_egress() -> None:
    """The docker backend reads the egress again once the sandbox is gone and before its
    gateway goes (a request begun after the last reading was never in it)."""
    counts = [Egress(1, 0, 2, 3), Egress(5, 1, 9, 9)]
    meter = Meter(read=dict, count=lambda: counts.pop(0))
    assert not meter.asked
    meter.usage({})
    assert meter.asked
    meter.finish()
    assert meter.usage({}).egress == Egress(1, 0, 2, 3)
    meter.recount(held=True)  # the gateway still held something: short
    got = meter.usage({})
    assert got.final and got.egress == Egress(5, 1, 9, 9, complete=False)


def test_a_failing_last_reading_keeps_what_was_read() -> None:
    calls = []

    def read() -> dict[str, Reading]:
        calls.append(1)
        if len(calls) > 1:
            raise OSError("gone")
        return {"main": Reading(cpu_ns=5, memory=1, memory_peak=None, pids=1)}

    meter = Meter(read=read)
    meter.sample()
    meter.finish()
    got = meter.usage({})
    assert got.final and got.total.cpu_seconds == 5e-9


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_cgroup_v1_and_v2_files_are_read(tmp_path: Path) -> None:
    cpu, mem, pids = tmp_path / "cpuacct", tmp_path / "memory", tmp_path / "pids"
    _write(cpu, {"cpuacct.usage": "2500000000\n"})
    _write(mem, {"memory.usage_in_bytes": "1048576\n", "memory.max_usage_in_bytes": "4194304\n"})
    _write(pids, {"pids.current": "7\n"})
    got = Cgroup(cpu, mem, pids, unified=False).read()
    assert got == Reading(cpu_ns=2_500_000_000, memory=MB, memory_peak=4 * MB, pids=7)
    v2 = tmp_path / "v2"
    _write(
        v2,
        {
            "cpu.stat": "usage_usec 1500000\nuser_usec 1000000\n",
            "memory.current": "2097152\n",
            "memory.peak": "3145728\n",
            "pids.current": "3\n",
            "pids.peak": "12\n",
        },
    )
    got = Cgroup(v2, v2, v2, unified=True).read()
    assert got == Reading(
        cpu_ns=1_500_000_000, memory=2 * MB, memory_peak=3 * MB, pids=3, pids_peak=12
    )
    (v2 / "memory.current").unlink()  # the container was removed meanwhile
    assert Cgroup(v2, v2, v2, unified=True).read() is None


def test_a_fifo_or_a_link_in_place_of_a_file_is_not_read(tmp_path: Path) -> None:
    import os

    folder = tmp_path / "memory"
    folder.mkdir()
    os.mkfifo(folder / "memory.usage_in_bytes")  # a read would wait forever
    (tmp_path / "elsewhere").write_text("1\n")
    (folder / "memory.max_usage_in_bytes").symlink_to(tmp_path / "elsewhere")
    _write(tmp_path / "cpu", {"cpuacct.usage": "1\n"})
    assert Cgroup(tmp_path / "cpu", folder, None, unified=False).read() is None


def test_the_sampler_thread_ends_once_no_environment_is_watched() -> None:
    code = """
import threading, time
from orchestrator.sandbox import usage
from orchestrator.sandbox.usage import Meter, Reading
seen = []
meter = Meter(read=lambda: seen.append(1) or {"main": Reading(1, 1, None, 1)})
def sampling():
    return any(t.name == "orchestrator-usage" for t in threading.enumerate())
usage.watch(meter)
# three samples, however late a busy machine runs the sampler
deadline = time.monotonic() + 30
while len(seen) < 3:
    assert time.monotonic() < deadline, f"{len(seen)} samples in 30 s"
    time.sleep(0.02)
assert sampling()
meter.finish()
deadline = time.monotonic() + 30
while sampling():
    assert time.monotonic() < deadline, "still sampling 30 s after the last meter finished"
    time.sleep(0.02)
assert len(seen) >= 3, seen
"""
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "ORCHESTRATOR_USAGE_EVERY": "0.1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr


def test_the_local_backend_counts_commands_and_says_it_read_nothing(tmp_path: Path) -> None:
    env = tmp_path / "local.yaml"
    env.write_text("version: 1\nname: lusage\nbackend: local\n")
    with spawn_runtime(env, backend="local") as rt:
        rt.execute(["true"])
        rt.write_file("a.txt", "12345")
        got = rt.usage()
    assert not got.measured and got.total.commands == 1 and got.total.cpu_seconds == 0
    assert got.workspace_bytes == 5
    assert rt.usage().final


class _Log:
    """An engine whose one container logged `lines` ((timestamp, text)); `since` keeps those
    at or after it, as the engine's does."""

    def __init__(self, lines: list[tuple[str, str]], chunk: int = 7, first: int = 0) -> None:
        self.lines, self.chunk, self.reads, self.first = lines, chunk, 0, first

    def logs(
        self,
        container: str,
        *,
        tail: None,
        follow: bool,
        since: str | None,
        timestamps: bool,
        stdout_only: bool,
        within: float,
    ) -> Iterator[bytes]:
        assert stdout_only and within <= 10  # never Squid's own log; never long
        self.reads += 1
        numbered, serial = [], self.first
        for ts, text in self.lines:
            if text.startswith("ORCH "):
                text, serial = text.replace("{serial}", str(serial)), serial + 1
            numbered.append((ts, text))
        data = b"".join(
            f"{ts} {text}\n".encode() for ts, text in numbered if since is None or ts >= since
        )
        for i in range(0, len(data), self.chunk):
            yield data[i : i + self.chunk]


def _line(client: str, code: str, hier: str, up: int, down: int) -> str:
    """An access-log line; its serial ({serial}) is its place among the log's lines."""
    return f"ORCH {{serial}} 1795930462.266 {client} {code} {hier} {up} {down}"


def test_the_gateway_log_is_counted_once_whatever_the_timestamps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.backends.container import egress_log

    out = _line("10.0.0.2", "TCP_TUNNEL/200", "HIER_DIRECT/1.2.3.4", 100, 2000)
    refused = _line("10.0.0.2", "TCP_DENIED/403", "HIER_NONE/-", 80, 600)
    probe = _line("127.0.0.1", "NONE_NONE/000", "HIER_NONE/-", 0, 0)  # the gateway's own
    log = _Log(
        [
            ("2026-01-01T00:00:01.000000001Z", "2026/01/01 00:00:01| Starting Squid"),
            ("2026-01-01T00:00:01.000000001Z", probe),
            ("2026-01-01T00:00:02.000000001Z", out),
            ("2026-01-01T00:00:02.000000001Z", refused),  # two at the same instant
        ]
    )
    count = egress_log.EgressCount()
    assert count.read(log, "gw") == Egress(1, 1, 100, 2000)
    assert count.read(log, "gw") == Egress(1, 1, 100, 2000)  # nothing new: nothing more
    log.lines += [("2026-01-01T00:00:02.000000001Z", out), ("2026-01-01T00:00:03Z", "x" * 9000)]
    assert count.read(log, "gw") == Egress(2, 1, 200, 4000)  # a third at that instant
    # a flood: each read takes at most READ_LIMIT bytes, the next goes on from there
    monkeypatch.setattr(egress_log, "READ_LIMIT", 200)
    log.lines += [(f"2026-01-01T00:00:04.{i:09d}Z", out) for i in range(50)]
    reads = 0
    while count.read(log, "gw").allowed < 52:
        reads += 1
        assert reads < 50, count.read(log, "gw")
        assert not count.read(log, "gw").complete or count.read(log, "gw").allowed == 52
    assert reads > 3 and count.read(log, "gw") == Egress(52, 1, 5200, 104000)
    # the log lost what was not read yet (the engine keeps 16 MB): the count says it is short
    log.lines, log.first = [("2026-01-01T00:00:09Z", out)], 60
    got = count.read(log, "gw")
    assert got.allowed == 53 and not got.complete


def test_a_first_read_of_a_log_that_lost_its_start_says_it_is_short() -> None:
    """Another process's first read (`ps --usage`, `top`) after a flood rotated the log: the
    first serial it sees is not 0 (Squid counts from 0), so its count says it is short."""
    from orchestrator.backends.container import egress_log

    out = _line("10.0.0.2", "TCP_DENIED/403", "HIER_NONE/-", 1, 1)
    whole = _Log([("2026-01-01T00:00:01Z", out), ("2026-01-01T00:00:02Z", out)])
    assert egress_log.EgressCount().read(whole, "gw") == Egress(0, 2, 0, 0)
    rotated = _Log([("2026-01-01T00:00:09Z", out)], first=74_000)
    got = egress_log.EgressCount().read(rotated, "gw")
    assert got.denied == 1 and not got.complete


def test_a_workspace_too_large_to_add_up_quickly_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.sandbox import usage

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_text("abc")
    (tmp_path / "link").symlink_to("/etc/passwd")  # a link counts for nothing: not followed
    os.mkfifo(tmp_path / "fifo")  # nor a FIFO: nothing is opened
    assert usage.folder_bytes(tmp_path) == 3
    monkeypatch.setattr(usage, "WORKSPACE_ENTRIES", 2)
    assert usage.folder_bytes(tmp_path) is None
    assert usage.folder_bytes(tmp_path / "gone") is None


def test_a_read_the_engine_cuts_short_keeps_what_it_counted() -> None:
    """Past READ_WITHIN the engine's read is ended (a DockerError): what was read counts,
    the count says it is short, and the next read goes on from there."""
    from orchestrator.backends.container import egress_log
    from orchestrator.errors import DockerError

    out = _line("10.0.0.2", "TCP_MISS/200", "HIER_DIRECT/1.2.3.4", 1, 10)
    lines = [(f"2026-01-01T00:00:01.{i:09d}Z", out) for i in range(10)]

    class Cut(_Log):
        cut = True

        def logs(self, *args: object, **kwargs: object) -> Iterator[bytes]:
            chunks = super().logs(*args, **kwargs)  # type: ignore[arg-type]
            if self.cut:
                self.cut = False
                yield next(chunks) + next(chunks) + next(chunks) + next(chunks) + next(chunks)
                raise DockerError("docker logs failed (exit 137)")
            yield from chunks

    count = egress_log.EgressCount()
    engine = Cut(lines, chunk=60)
    first = count.read(engine, "gw")
    assert 0 < first.allowed < 10 and not first.complete, first
    assert count.read(engine, "gw") == Egress(10, 0, 10, 100)  # and nothing twice


def test_the_fronts_lines_count_beside_squids_each_with_its_own_serial() -> None:
    """The plain-HTTP front (templates/gateway/front.py) writes `ORCF` lines into the same
    log, numbered from 0 on their own: interleaved with Squid's, no line is taken for lost;
    a gap in either numbering is."""
    from orchestrator.backends.container import egress_log

    squid = _line("10.0.0.2", "TCP_DENIED/403", "HIER_NONE/-", 80, 600)
    lines = [
        ("2026-01-01T00:00:01Z", squid),
        (
            "2026-01-01T00:00:02Z",
            "ORCF 0 1795930462.266 10.0.0.2 TCP_MISS/200 HIER_DIRECT 100 5000",
        ),
        ("2026-01-01T00:00:03Z", squid),
        ("2026-01-01T00:00:04Z", "ORCF 1 1795930462.266 10.0.0.2 TCP_MISS/200 HIER_DIRECT 50 7"),
        ("2026-01-01T00:00:05Z", "ORCF 0 1795930462.266 127.0.0.1 TCP_MISS/200 HIER_DIRECT 1 1"),
    ]
    count = egress_log.EgressCount()
    got = count.read(_Log(lines), "gw")
    assert got == Egress(2, 2, 150, 5007), got  # (the front began again: a restart, no loss)
    gap = [("2026-01-01T00:00:06Z", "ORCF 5 1795930462.266 10.0.0.2 TCP_MISS/200 HIER_DIRECT 1 1")]
    got = count.read(_Log(lines + gap), "gw")
    assert got.allowed == 3 and not got.complete, got
    forged = [
        ("2026-01-01T00:00:07Z", "ORCX 6 1795930462.266 10.0.0.2 TCP_MISS/200 HIER_DIRECT 9 9")
    ]
    assert count.read(_Log(lines + gap + forged), "gw").allowed == 3


def test_a_restart_of_squid_or_the_front_makes_the_count_short() -> None:
    """(Found by a hostile review) Squid logs a tunnel only once it ends; killed (for
    memory), or the gateway restarted by a narrowing, what it had open is never logged and
    its serials begin again at 0, which reads as a plain reload. The start script prints
    ORCS at each start but the first: from then on the count says it is short."""
    from orchestrator.backends.container import egress_log

    out = _line("10.0.0.2", "TCP_TUNNEL/200", "HIER_DIRECT/1.2.3.4", 10, 20)
    lines = [("2026-01-01T00:00:01Z", out)]
    count = egress_log.EgressCount()
    assert count.read(_Log(lines), "gw").complete
    lines += [("2026-01-01T00:00:02Z", "ORCS restarted"), ("2026-01-01T00:00:03Z", out)]
    got = count.read(_Log(lines), "gw")
    assert got.allowed == 2 and not got.complete, got
