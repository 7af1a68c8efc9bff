"""`python -m bench.swarm` (part of `just bench`): environments placed on a Swarm and ready
(set up, first command done) per minute, on a Swarm of 1 node and one of 3, side by side.

Each size gets a cluster of its own (`scripts/cluster` under the name orchbench, removed
after), N environments started at most K at a time, each running a command, then all taken
down. On one machine the nodes share its cores, so this measures the scheduling and the
reach into other nodes' engines, not more hardware. Writes bench/results/swarm.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.measure import ROOT, report, scratch
from orchestrator import Runtime, load_environment_text, spawn_runtime
from orchestrator.backends.swarm.runtime import SwarmRuntime

SCRIPT = str(ROOT / "scripts" / "cluster")
ENV = (
    "version: 1\nname: swbench\nbackend: swarm\nimage: orchestrator-test/python:3.11\n"
    "setup: {commands: ['echo up > .ready']}\n"
)


@dataclass
class Size:
    per_minute: float
    wall: float
    p50: float
    nodes_used: int
    failures: list[str]


def one_size(nodes: int, envs: int, starts: int) -> Size:
    cluster = {**os.environ, "ORCHESTRATOR_CLUSTER": "orchbench"}
    subprocess.run([SCRIPT, "up", str(nodes)], env=cluster, check=True, capture_output=True)
    try:
        line = subprocess.run(
            [SCRIPT, "env"], env=cluster, check=True, capture_output=True, text=True
        ).stdout
        os.environ["ORCHESTRATOR_SWARM_HOST"] = line.strip().partition("=")[2]
        os.environ["ORCHESTRATOR_SWARM_NODE_HOST"] = "tcp://{addr}:2375"
        env = load_environment_text(ENV)
        failures: list[str] = []
        times: list[float] = []
        placed = Counter[str]()

        def run(_: int) -> Runtime | None:
            t = time.perf_counter()
            try:
                rt = spawn_runtime(env)
                if rt.execute("cat .ready").stdout != "up\n":
                    failures.append("wrong output")
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                return None
            times.append(time.perf_counter() - t)
            return rt

        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=starts) as pool:
            runtimes = [rt for rt in pool.map(run, range(envs)) if rt is not None]
        wall = time.perf_counter() - began
        for rt in runtimes:
            assert isinstance(rt, SwarmRuntime)
            placed[rt._tasks["main"].node] += 1  # the bench may look inside
        with ThreadPoolExecutor(max_workers=starts) as pool:
            list(pool.map(lambda rt: rt.cleanup(), runtimes))
        return Size(
            per_minute=len(runtimes) / wall * 60,
            wall=wall,
            p50=statistics.median(times) if times else float("nan"),
            nodes_used=len(placed),
            failures=failures,
        )
    finally:
        subprocess.run([SCRIPT, "down"], env=cluster, check=False, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", type=int, default=40)
    parser.add_argument("--starts", type=int, default=8)
    args = parser.parse_args()
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(scratch("orch-swbench-"))
    rows = {n: one_size(n, args.envs, args.starts) for n in (1, 3)}
    lines = [
        "# Swarm: environments placed and ready per minute",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores shared "
        f"by every node; {args.envs} environments, at most {args.starts} starts at once, each "
        "set up and running one command.",
        "",
        "| nodes | ready per minute | wall s | p50 start s | nodes used | failures |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {n} | {r.per_minute:.0f} | {r.wall:.1f} | {r.p50:.2f} | {r.nodes_used} "
            f"| {len(r.failures)} |"
            for n, r in rows.items()
        ),
        "",
        *(f"- {n} node(s): {why}" for n, r in rows.items() for why in r.failures),
    ]
    report("swarm", lines)


if __name__ == "__main__":
    main()
