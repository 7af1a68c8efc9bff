"""`python -m bench.pause`: pause and resume of a Docker environment with a sidecar, side by
side with raw `docker pause` / `docker unpause` of the same two containers, in interleaved
rounds (each round runs both, in turn, so drift on a shared machine hits them alike).

- orchestrator: `rt.pause()` then `rt.resume()` (one engine call each for both containers,
  then the first `execute` after the resume, the executor answering again);
- raw: `docker pause MAIN SIDE` then `docker unpause MAIN SIDE` (one CLI call each).

Also: the memory each paused environment holds (its cgroups' memory use, main + sidecar,
which a pause keeps), and optionally (`--hold N`) how many paused environments of that file
this machine held at once, started one after another and paused. Writes
bench/results/pause.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from bench.measure import report
from orchestrator import Environment, Runtime, load_environment_text, spawn_runtime

ENV = (
    "version: 1\nname: pausebench\nimage: orchestrator-test/python:3.11\n"
    "services:\n  side:\n    image: orchestrator-test/busybox:1\n"
    "    command: [sleep, '86400']\n"
)
CGROUP = Path("/sys/fs/cgroup")


def memory_bytes(container: str) -> int:
    """The container's cgroup memory use (v1 memory.usage_in_bytes, v2 memory.current)."""
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return int((CGROUP / "memory" / path.lstrip("/") / "memory.usage_in_bytes").read_text())
        if controllers == "":
            current = CGROUP / path.lstrip("/") / "memory.current"
            if current.exists():
                return int(current.read_text())
    return 0


def containers(rt: Runtime) -> list[str]:
    return [rt.info().container or "", rt.service("side").connection().container or ""]


def pct(times: list[float], q: float) -> float:
    data = sorted(times)
    return data[min(len(data) - 1, int(q * len(data)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--hold", type=int, default=0, help="paused environments to hold")
    args = parser.parse_args()
    env = load_environment_text(ENV)
    rows: dict[str, list[float]] = {}
    with spawn_runtime(env) as rt:
        pair = containers(rt)
        rt.execute(["true"])
        for _ in range(args.rounds):
            t = time.perf_counter()
            rt.pause()
            rows.setdefault("orchestrator: rt.pause()", []).append(time.perf_counter() - t)
            t = time.perf_counter()
            rt.resume()
            rows.setdefault("orchestrator: rt.resume()", []).append(time.perf_counter() - t)
            rt.execute(["true"])
            rows.setdefault("orchestrator: resume + first execute", []).append(
                time.perf_counter() - t
            )
            t = time.perf_counter()
            subprocess.run(["docker", "pause", *pair], check=True, capture_output=True)
            rows.setdefault("raw: docker pause (both)", []).append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(["docker", "unpause", *pair], check=True, capture_output=True)
            rows.setdefault("raw: docker unpause (both)", []).append(time.perf_counter() - t)
        rt.pause()
        held = [memory_bytes(c) for c in pair]
        rt.resume()
    lines = [
        "# Pause and resume",
        "",
        f"An environment with a sidecar (python main + busybox sidecar), {args.rounds} "
        f"interleaved rounds, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load "
        f"average {os.getloadavg()[1]:.1f} on {os.cpu_count()} CPUs.",
        "",
        "| path | p50 ms | p99 ms |",
        "|---|---:|---:|",
        *(
            f"| {name} | {statistics.median(t) * 1000:.0f} | {pct(t, 0.99) * 1000:.0f} |"
            for name, t in rows.items()
        ),
        "",
        f"Memory a paused environment holds (cgroup memory use): main {held[0] / 2**20:.1f} MiB "
        f"+ sidecar {held[1] / 2**20:.1f} MiB = {sum(held) / 2**20:.1f} MiB.",
        "",
    ]
    if args.hold:
        lines += hold(env, args.hold)
    report("pause", lines)


def hold(env: Environment, count: int) -> list[str]:
    """Start and pause `count` environments one after another; what it cost."""
    runtimes: list[Runtime] = []
    names: list[str] = []
    started = time.perf_counter()
    try:
        for _ in range(count):
            rt = spawn_runtime(env)
            runtimes.append(rt)
            names += containers(rt)
            rt.pause()
        memory = sum(memory_bytes(c) for c in names)
    finally:
        for rt in runtimes:
            rt.cleanup()
    return [
        f"Held {len(runtimes)} paused environments at once ({time.perf_counter() - started:.0f} s "
        f"to start, pause and remove them), {memory / 2**20 / max(1, len(runtimes)):.1f} MiB "
        "each.",
        "",
    ]


if __name__ == "__main__":
    main()
