"""`python -m bench.admission`: the issue's admission test at full size (issue 26, item 3).

--envs environments (40), each declaring --memory (2g), are asked for at once from as many
threads, under ORCHESTRATOR_MAX_MEMORY=--budget (16g): each, once started, runs a command
for --hold seconds and is removed. Measured: the most alive at once (from each one's start
and end, and from the admission ledger sampled every 20 ms), how long each waited for room,
how many completed, how many were OOM-killed. Busybox uses little of its 2 GiB: the declared
memory is a number for admission (and the container's limit). Writes
bench/results/admission.md; exits 1 unless all completed, none OOM-killed and never more
than budget/memory alive.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from bench.measure import report, scratch
from orchestrator import load_environment_text, spawn_runtime
from orchestrator.services import admission
from orchestrator.spec.models import size_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", type=int, default=40)
    parser.add_argument("--memory", default="2g", help="each environment's resources.memory")
    parser.add_argument("--budget", default="16g", help="ORCHESTRATOR_MAX_MEMORY")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds each one runs")
    parser.add_argument("--image", default="orchestrator-test/busybox:1")
    parser.add_argument("--backend", default=None, help="instead of docker (e.g. local)")
    args = parser.parse_args()
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(scratch("orch-admission-"))
    os.environ["ORCHESTRATOR_MAX_MEMORY"] = args.budget
    os.environ.setdefault("ORCHESTRATOR_ADMISSION_TIMEOUT", "1800")
    os.environ.pop("ORCHESTRATOR_ADMISSION", None)
    limit = size_bytes(args.budget) // size_bytes(args.memory)
    env = load_environment_text(
        f"version: 1\nname: adm\nimage: {args.image}\nresources: {{memory: {args.memory}}}\n"
    )
    lock = threading.Lock()
    alive = peak = sampled_peak = done = oom = 0
    waits: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def sample() -> None:
        nonlocal sampled_peak
        while not stop.wait(0.02):
            sampled_peak = max(sampled_peak, len(admission.admitted()))

    def one() -> None:
        nonlocal alive, peak, done, oom
        asked = time.perf_counter()
        try:
            with spawn_runtime(env, backend=args.backend) as rt:
                with lock:
                    waits.append(time.perf_counter() - asked)
                    alive += 1
                    peak = max(peak, alive)
                r = rt.execute(f"sleep {args.hold}; echo ok", timeout=args.hold + 60)
                with lock:
                    alive -= 1
                    done += r.stdout == "ok\n"
                    oom += r.oom_killed
        except Exception as exc:  # counted, and the run goes on
            with lock:
                failures.append(f"{type(exc).__name__}: {exc}")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(args.envs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.perf_counter() - began
    stop.set()
    sampler.join()
    ok = not failures and done == args.envs and oom == 0 and max(peak, sampled_peak) <= limit
    lines = [
        f"# Admission: {args.envs} x {args.memory} under {args.budget}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; "
        f"backend {args.backend or 'docker'}, image {args.image}; each runs {args.hold:g} s.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| completed | {done} of {args.envs} |",
        f"| OOM-killed | {oom} |",
        f"| most alive at once (starts/ends; ledger sampled) | {peak}; {sampled_peak} "
        f"(budget allows {limit}) |",
        f"| wait for room + start (p50 / max) | {statistics.median(waits or [0]):.1f} s / "
        f"{max(waits or [0]):.1f} s |",
        f"| all done | {total:.1f} s |",
        f"| failures | {len(failures)} |",
        "",
        *(f"- {f}" for f in failures[:20]),
    ]
    report("admission", lines)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
