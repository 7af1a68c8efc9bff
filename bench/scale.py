"""`python -m bench.scale` (part of `just bench`): many environments up at the same time.

All N are started (at most --starts at a time), each runs a command once all are up (so they
really are all alive together), then all are taken down. Counted: failures of any step, and
everything of ours left afterwards (containers, networks, volumes, project folders) as
leaks. Writes bench/results/scale.md; exits 1 unless failures and leaks are both 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench.measure import report, scratch
from orchestrator import Runtime, load_environment_text, spawn_runtime
from orchestrator.paths import projects_dir

ENV = (
    "version: 1\nname: scale\nimage: orchestrator-test/python:3.11\n"
    "setup: {commands: ['echo up > .ready']}\n"
)


def ours() -> set[str]:
    """Ids of our containers, networks and volumes whose project folder is this run's."""
    root = str(projects_dir())
    found = set()
    for kind, ident in ((["ps", "-a"], "{{.ID}}"), (["network", "ls"], "{{.ID}}")):
        out = subprocess.run(
            [
                "docker",
                *kind,
                "--filter",
                "label=org.orchestrator.managed=1",
                "--format",
                ident + ' {{.Label "org.orchestrator.dir"}}',
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found |= {line.split()[0] for line in out.splitlines() if root in line}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", type=int, default=200)
    parser.add_argument("--starts", type=int, default=32, help="starts in flight at most")
    args = parser.parse_args()
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(scratch("orch-scale-"))
    os.environ["ORCHESTRATOR_ADMISSION"] = "0"  # all of them at once is the point here
    env = load_environment_text(ENV)
    failures: list[str] = []
    starts: list[float] = []

    def start(_: int) -> Runtime | None:
        t = time.perf_counter()
        try:
            rt = spawn_runtime(env)
        except Exception as exc:  # counted, and the run goes on
            failures.append(f"start: {type(exc).__name__}: {exc}")
            return None
        starts.append(time.perf_counter() - t)
        return rt

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.starts) as pool:
        runtimes = [rt for rt in pool.map(start, range(args.envs)) if rt is not None]
    all_up = time.perf_counter() - began
    alive = len({rt.info().id for rt in runtimes})

    def check(rt: Runtime) -> None:
        try:
            if rt.execute("cat .ready", timeout=60).stdout != "up\n":
                failures.append("command: wrong output")
        except Exception as exc:
            failures.append(f"command: {type(exc).__name__}: {exc}")

    def down(rt: Runtime) -> None:
        try:
            rt.cleanup()
        except Exception as exc:
            failures.append(f"down: {type(exc).__name__}: {exc}")

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.starts) as pool:
        list(pool.map(check, runtimes))
    commands = time.perf_counter() - t
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.starts) as pool:
        list(pool.map(down, runtimes))
    downs = time.perf_counter() - t
    leaked = ours()
    folders = [p.name for p in projects_dir().iterdir()] if projects_dir().exists() else []
    lines = [
        f"# {args.envs} environments at once",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; "
        f"at most {args.starts} starts in flight; each environment runs its setup.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| all {args.envs} up and set up | {all_up:.1f} s |",
        f"| environments ready per minute | {len(runtimes) / all_up * 60:.0f} |",
        f"| one start under this load (p50 / max) | {statistics.median(starts or [0]):.2f} s / "
        f"{max(starts or [0]):.2f} s |",
        f"| alive at the same time | {alive} |",
        f"| a command in every one | {commands:.2f} s |",
        f"| all taken down | {downs:.1f} s |",
        f"| failures | {len(failures)} |",
        f"| leaked Docker objects | {len(leaked)} |",
        f"| leaked project folders | {len(folders)} |",
        "",
        *(f"- {f}" for f in failures[:20]),
    ]
    report("scale", lines)
    sys.exit(1 if failures or leaked or folders or alive != args.envs else 0)


if __name__ == "__main__":
    main()
