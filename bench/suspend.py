"""`python -m bench.suspend`: suspend to disk and wake of an environment with a 100 MB
workspace (1,000 files) and a busybox sidecar holding a file-backed store, side by side
with the raw engine calls doing the same to the same kind of containers, in interleaved
rounds (each round runs both paths once, on fresh environments, so drift hits them alike).

- orchestrator: `rt.suspend()` (every container paused, committed side by side, unpaused;
  the main sandbox's processes killed; the workspace packed by the host's tar; the record
  written; the project removed), then `wake(name)` (a new project from the images, the
  workspace restored, `setup.resume_commands`, the services' readiness waited for).
- raw: `docker commit` of the main container and the sidecar + host `tar c` of the
  workspace + `docker rm -f` of both (suspend), then `docker run -d` of the two images + host
  `tar x` into a fresh folder (wake): no network, no labels, no readiness, no checks.

Also reported: the memory the suspended environment gives back (the containers' usage
just before, from `docker stats`). Writes bench/results/suspend.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.measure import report
from bench.transfer import make_tree
from orchestrator import Environment, Runtime, load_environment_text, spawn_runtime, wake
from orchestrator.backends.docker.runtime import ComposeRuntime

STORE = "mkdir -p /data && echo row >> /data/store && exec sleep 2147483647"
ENV = f"""version: 1
name: suspbench
image: orchestrator-test/python:3.11
setup: {{resume_commands: ['true']}}
services:
  db:
    image: orchestrator-test/busybox:1
    command: [sh, -c, {json.dumps(STORE)}]
"""


def _docker(*argv: str) -> str:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=True).stdout


def _memory(rt: ComposeRuntime) -> float:
    """MiB the environment's containers use now (docker stats, one sample)."""
    assert rt.project is not None
    names = [rt.project.container_of(s) for s in ("main", "db")]
    out = _docker("stats", "--no-stream", "--format", "{{.MemUsage}}", *names)
    total = 0.0
    for line in out.splitlines():
        used = line.split("/")[0].strip()
        for unit, scale in (("GiB", 1024.0), ("MiB", 1.0), ("KiB", 1 / 1024), ("B", 1 / 2**20)):
            if used.endswith(unit):
                total += float(used.removesuffix(unit)) * scale
                break
    return total


def _fresh(env: Environment, tree: Path) -> ComposeRuntime:
    rt = spawn_runtime(env, disable_setup=True)
    assert isinstance(rt, ComposeRuntime) and rt.project is not None
    rt.upload(tree, rt.workdir)
    return rt


def _raw(rt: ComposeRuntime, work: Path) -> tuple[float, float]:
    """The raw engine calls on this environment's containers: (suspend s, wake s)."""
    assert rt.project is not None
    main, db = rt.project.container_of("main"), rt.project.container_of("db")
    folder = rt.project.directory / "workspace"
    t = time.perf_counter()
    images = [_docker("commit", c).strip() for c in (main, db)]
    subprocess.run(["tar", "-c", "-f", str(work / "raw.tar"), "-C", str(folder), "."], check=True)
    _docker("rm", "-f", main, db)
    suspend = time.perf_counter() - t
    t = time.perf_counter()
    run = ["run", "-d", "--entrypoint", "/bin/sh", images[0], "-c", "exec sleep 2147483647"]
    started = [_docker(*run).strip(), _docker("run", "-d", images[1]).strip()]
    (work / "raw-ws").mkdir()
    subprocess.run(
        ["tar", "-x", "-f", str(work / "raw.tar"), "-C", str(work / "raw-ws")], check=True
    )
    woken = time.perf_counter() - t
    _docker("rm", "-f", *started)
    _docker("rmi", *images)
    shutil.rmtree(work / "raw-ws")
    return suspend, woken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (the result is a median)")
    work = Path(tempfile.mkdtemp(prefix="orch-suspbench-"))
    make_tree(work / "tree", args.megabytes, args.files)
    rows: dict[str, list[float]] = {}
    freed: list[float] = []
    size = 0
    env = load_environment_text(ENV)  # loaded from text: wake is given the file
    try:
        for _ in range(args.rounds):
            rt = _fresh(env, work / "tree")
            freed.append(_memory(rt))
            t = time.perf_counter()
            record = rt.suspend()
            rows.setdefault("suspend", []).append(time.perf_counter() - t)
            size = record.size
            t = time.perf_counter()
            woken: Runtime = wake(record.name, env=env)
            rows.setdefault("wake", []).append(time.perf_counter() - t)
            with woken:
                count = woken.execute("find . -type f | wc -l").stdout.strip()
                assert count == str(args.files), f"{count} files after wake"
                assert woken.service("db").execute("cat /data/store").stdout.startswith("row")
            raw = _fresh(env, work / "tree")
            with raw:
                s, w = _raw(raw, work)
            rows.setdefault("raw suspend", []).append(s)
            rows.setdefault("raw wake", []).append(w)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {name: statistics.median(times) for name, times in rows.items()}
    load = os.getloadavg()[1]
    lines = [
        "# Suspend to disk and wake",
        "",
        f"An environment (main python:3.11 + a busybox sidecar with a file-backed store) with "
        f"{args.files} files, {args.megabytes} MB ({size / 1e6:.0f} MB archive) in its "
        f"workspace; median (p50) of {args.rounds} interleaved rounds, fresh environments each, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| step | orchestrator p50 s | raw engine calls p50 s | × raw |",
        "|---|---:|---:|---:|",
        *(
            f"| {step} | {med[step]:.2f} | {med['raw ' + step]:.2f} | "
            f"{med[step] / med['raw ' + step]:.2f} |"
            for step in ("suspend", "wake")
        ),
        "",
        "Raw suspend: `docker commit` of both containers + host `tar c` of the workspace + "
        "`docker rm -f`; raw wake: `docker run -d` of both images + host `tar x`. "
        "Orchestrator's wake also creates the project's network, waits for the services, "
        "restores the workspace through the sandbox and runs `setup.resume_commands`.",
        "",
        "Per round (s): "
        + "; ".join(
            f"{a:.2f}/{b:.2f} vs {c:.2f}/{d:.2f}"
            for a, b, c, d in zip(
                rows["suspend"], rows["wake"], rows["raw suspend"], rows["raw wake"], strict=True
            )
        )
        + " (suspend/wake, ours vs raw).",
        "",
        f"Memory given back by a suspend (the two containers' usage just before, docker "
        f"stats): median {statistics.median(freed):.0f} MiB. Load average over the run: "
        f"{load:.1f} on {os.cpu_count()} CPUs.",
        "",
    ]
    report("suspend", lines)


if __name__ == "__main__":
    main()
