"""`python -m bench.processes` (part of `just bench`): a process you talk to, side by side with
the raw alternative. One Python REPL in the sandbox, driven a line at a time (a line written,
its answer read before the next), through `rt.start` (blocking and `orchestrator.aio`) and
through `docker exec -i` of the same REPL with pipes; and the cost of starting one process and
waiting for it, `rt.start(...).wait()` against `rt.execute(...)` and `docker exec`. Reports
p50 and p90 of each, and the ratio of each p50 to its raw twin's. Writes
bench/results/processes.{md,json}."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.measure import OUT, Sample, report, timed
from orchestrator import Process, Runtime, aio, spawn_runtime

ROOT = Path(__file__).resolve().parent.parent
ENV = ROOT / "environments" / "python.yaml"
REPL = ["python3", "-i", "-u", "-q"]
BOUND = 60.0
"""Seconds one line's answer may take (an engine that stopped answering)."""


def _answered(read: Callable[[], bytes], token: bytes) -> None:
    seen = b""
    deadline = time.monotonic() + BOUND
    while token not in seen:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer {token!r} within {BOUND}s")
        seen += read()


def ours(rt: Runtime, n: int) -> Sample:
    proc: Process = rt.start(REPL, timeout=3600)
    count = iter(range(10**9))

    def line() -> None:
        i = next(count)
        proc.write(f"print({i} * 2 + 1)\n")

        def read() -> bytes:
            event = proc.read(BOUND)
            return b"" if event is None or event.kind != "stdout" else event.data

        _answered(read, f"{i * 2 + 1}\n".encode())

    try:
        return timed("rt.start: a line and its answer", line, n)
    finally:
        proc.kill()
        proc.wait(BOUND)


def ours_async(rt: Runtime, n: int) -> Sample:
    async def main() -> Sample:
        art = aio.AsyncRuntime(rt)
        proc = await art.start(REPL, timeout=3600)
        times = []
        try:
            for i in range(n + 3):
                started = time.perf_counter()
                await proc.write(f"print({i} * 2 + 1)\n")
                seen, token = b"", f"{i * 2 + 1}\n".encode()
                while token not in seen:
                    event = await proc.read(BOUND)
                    if event is None:
                        raise TimeoutError(f"no answer within {BOUND}s")
                    seen += event.data if event.kind == "stdout" else b""
                if i >= 3:  # (three warm-up lines)
                    times.append(time.perf_counter() - started)
        finally:
            await proc.kill()
            await proc.wait(BOUND)
        return Sample("aio start: a line and its answer", times)

    return asyncio.run(main())


def raw(container: str, n: int) -> Sample:
    proc = subprocess.Popen(
        ["docker", "exec", "-i", container, *REPL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        bufsize=0,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    count = iter(range(10**9))

    def line() -> None:
        i = next(count)
        stdin.write(f"print({i} * 2 + 1)\n".encode())
        _answered(lambda: os.read(stdout.fileno(), 65536), f"{i * 2 + 1}\n".encode())

    try:
        return timed("docker exec -i: a line and its answer", line, n)
    finally:
        stdin.close()
        proc.wait(BOUND)
        stdout.close()


def measure(n: int) -> tuple[list[Sample], dict[str, str]]:
    """Every way, `n` times each, on one environment; and each way's raw twin."""
    with spawn_runtime(ENV) as rt:
        container = rt.info().container
        assert container is not None
        samples = [
            ours(rt, n),
            ours_async(rt, n),
            raw(container, n),
            timed("rt.start(true).wait()", lambda: rt.start(["true"], stdin=False).wait(), n),
            timed("rt.execute(true)", lambda: rt.execute(["true"]), n),
            timed(
                "docker exec true",
                lambda: subprocess.run(["docker", "exec", container, "true"], check=True),
                max(3, n // 10),
            ),
        ]
    twins = {
        "rt.start: a line and its answer": "docker exec -i: a line and its answer",
        "aio start: a line and its answer": "docker exec -i: a line and its answer",
        "rt.start(true).wait()": "docker exec true",
        "rt.execute(true)": "docker exec true",
    }
    return samples, twins


def table(samples: list[Sample], twins: dict[str, str], n: int) -> list[str]:
    by_name = {s.name: s for s in samples}
    lines = [
        "# A process you talk to",
        "",
        f"{n} runs each (docker exec true: fewer), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs.",
        "",
        "| way | p50 ms | p90 ms | × its raw twin (p50) |",
        "|---|---:|---:|---:|",
    ]
    for s in samples:
        twin = by_name.get(twins.get(s.name, ""))
        ratio = f"{s.p50 / twin.p50:.2f}" if twin is not None else "-"
        lines.append(f"| {s.name} | {s.p50 * 1000:.2f} | {s.p90 * 1000:.2f} | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200)
    args = parser.parse_args()
    samples, twins = measure(args.n)
    report("processes", table(samples, twins, args.n))
    OUT.mkdir(parents=True, exist_ok=True)
    rows = {s.name: {"p50_s": s.p50, "p90_s": s.p90} for s in samples}
    (OUT / "processes.json").write_text(json.dumps({"n": args.n, "paths": rows}, indent=1))


if __name__ == "__main__":
    main()
