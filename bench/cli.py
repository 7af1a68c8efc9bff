"""`python -m bench.cli` (part of `just bench`): the CLI as a harness that shells out meets it,
whole processes side by side with the docker CLI in alternating rounds: `orchestrator exec ID
-- true` against `docker exec CONTAINER true`, `orchestrator ps` against `docker compose ls`,
`orchestrator logs ID` against `docker compose logs`, a 10 MB output through each `exec`, and
`orchestrator --help`. Reports the median wall time and the median CPU time (user + system of
the process and its children) of each, and the ratio to its docker twin. Writes
bench/results/cli.{md,json}."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure import OUT, report

ROOT = Path(__file__).resolve().parent.parent
ENV = ROOT / "environments" / "python.yaml"
ORCH = [sys.executable, "-m", "orchestrator"]
BIG = "head -c 10000000 /dev/zero"
"""10 MB of output."""
BOUND = 120.0
"""Seconds one measured process may take (an engine that stopped answering)."""


@dataclass
class Way:
    """One way of doing a thing, its docker twin's name, and what each run cost."""

    name: str
    argv: list[str]
    twin: str | None = None
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def run(self) -> None:
        """One whole process, its output thrown away as it comes; its wall and CPU time."""
        before = os.times()
        started = time.perf_counter()
        # waited for without a timeout (a blocking wait sees the exit at once: `run` with
        # one polls, at up to 50 ms between looks, which rounded every time up), killed by
        # a timer should it hang
        proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        timer = threading.Timer(BOUND, proc.kill)
        timer.start()
        try:
            code = proc.wait()
        finally:
            timer.cancel()
        wall = time.perf_counter() - started
        after = os.times()
        if code != 0:
            raise RuntimeError(f"{self.name}: exit {code} ({' '.join(self.argv)})")
        self.wall.append(wall)
        self.cpu.append(
            (after.children_user - before.children_user)
            + (after.children_system - before.children_system)
        )


def _up() -> tuple[str, str]:
    """An environment left running by `orchestrator up`: its id and main container."""
    out = subprocess.run(
        [*ORCH, "up", str(ENV), "--json"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=True,
    )
    record = json.loads(out.stdout.splitlines()[0])
    return str(record["id"]), str(record["container"])


def ways_to_compare(ident: str, container: str) -> list[Way]:
    return [
        Way("orchestrator exec ID -- true", [*ORCH, "exec", ident, "--", "true"], "docker exec"),
        Way("docker exec", ["docker", "exec", container, "true"]),
        Way("orchestrator ps", [*ORCH, "ps"], "docker compose ls"),
        Way("docker compose ls", ["docker", "compose", "ls"]),
        Way("orchestrator logs ID", [*ORCH, "logs", ident], "docker compose logs"),
        Way("docker compose logs", ["docker", "compose", "-p", ident, "logs"]),
        Way(
            "orchestrator exec, 10 MB out",
            [*ORCH, "exec", ident, "--", "sh", "-c", BIG],
            "docker exec, 10 MB out",
        ),
        Way("docker exec, 10 MB out", ["docker", "exec", container, "sh", "-c", BIG]),
        Way("orchestrator --help", [*ORCH, "--help"]),
    ]


def measure(rounds: int) -> list[Way]:
    """Every way, `rounds` times each in alternating rounds (after one warm-up run each), on
    an environment brought up for it and taken down after."""
    ident, container = _up()
    try:
        ways = ways_to_compare(ident, container)
        for way in ways:  # warm the page cache and the engine once
            way.run()
            way.wall.clear()
            way.cpu.clear()
        for _ in range(rounds):
            for way in ways:
                way.run()
    finally:
        subprocess.run([*ORCH, "down", ident], capture_output=True, timeout=BOUND, check=False)
    return ways


def table(ways: list[Way], rounds: int) -> list[str]:
    """The report: each way's medians, and its ratios to its docker twin."""
    med = {w.name: (statistics.median(w.wall), statistics.median(w.cpu)) for w in ways}
    lines = [
        "# The CLI, whole processes",
        "",
        f"Median of {rounds} alternating rounds, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs; CPU is "
        "user + system of the process and its children.",
        "",
        "| command | wall ms | CPU ms | × its docker twin (wall) | × (CPU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for way in ways:
        wall, cpu = med[way.name]
        if way.twin:
            twin_wall, twin_cpu = med[way.twin]
            ratios = f"{wall / twin_wall:.2f} | {cpu / max(twin_cpu, 1e-3):.2f}"
        else:
            ratios = "- | -"
        lines.append(f"| {way.name} | {wall * 1000:.0f} | {cpu * 1000:.0f} | {ratios} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    ways = measure(args.rounds)
    report("cli", table(ways, args.rounds))
    rows = {
        w.name: {"wall_s": statistics.median(w.wall), "cpu_s": statistics.median(w.cpu)}
        for w in ways
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cli.json").write_text(json.dumps({"rounds": args.rounds, "paths": rows}, indent=1))


if __name__ == "__main__":
    main()
