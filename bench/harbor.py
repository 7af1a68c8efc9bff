"""`python -m bench.harbor` (part of `just bench`): Harbor's own CLI runs the same tasks on our
environment and on Harbor's `docker` environment, side by side in one run, alternating: each
round is `harbor run -k TRIALS -n CONCURRENT` of the shipped tasks (tests/data/harbor) that
Harbor's docker can run here (a Dockerfile task and a Compose task with a service: its egress
control needs an image from a registry), on each environment in turn. Reports the wall time
of each whole `harbor run`, and from Harbor's own results the median and p90 of a trial and
of each of its phases (environment start, agent, verifier), with the ratio of theirs to
ours; every trial must score 1.0. Writes bench/results/harbor.{md,json}.

Needs the image `scripts/build-images harbor` makes."""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import time
from datetime import datetime
from typing import Any

from bench.measure import OUT, ROOT, report, scratch
from orchestrator.testing.harbor import (
    HARBOR_IMAGE,
    OURS,
    Trial,
    copy_tasks,
    harbor_run,
    remove_images,
    trials,
)

TASKS = ROOT / "tests" / "data" / "harbor"
BOTH = ["hello-dockerfile", "compose-service"]
"""The tasks both environments run here."""
PHASES = ("environment_setup", "agent_execution", "verifier")
WAYS = {"orchestrator": OURS, "harbor docker": "docker"}


def _seconds(span: dict[str, Any] | None) -> float | None:
    if not span or not span.get("started_at") or not span.get("finished_at"):
        return None
    started, finished = (datetime.fromisoformat(span[k]) for k in ("started_at", "finished_at"))
    return (finished - started).total_seconds()


def _pct(values: list[float], q: float) -> float:
    data = sorted(values)
    return data[min(len(data) - 1, int(q * len(data)))] if data else float("nan")


def one_round(way: str, attempts: int, concurrent: int) -> tuple[float, list[Trial]]:
    """One `harbor run` of BOTH tasks on `way`: its wall time and its trials."""
    work = scratch("orch-bench-harbor-")
    token = secrets.token_hex(6)
    tasks = copy_tasks(TASKS, work, BOTH, token)
    started = time.perf_counter()
    try:
        job = harbor_run(
            work, tasks, WAYS[way], "bench", concurrent=concurrent, attempts=attempts, deadline=1800
        )
    finally:
        wall = time.perf_counter() - started
        remove_images(token)
    got = trials(job)
    bad = [t for t in got if t.reward != 1.0 or t.exception is not None]
    if bad or len(got) != attempts * len(BOTH):
        raise RuntimeError(f"{way}: {len(got)} trials, {len(bad)} without reward 1.0: {bad[:1]}")
    return wall, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="trials of each task a round")
    parser.add_argument("--concurrent", type=int, default=4, help="trials at a time")
    parser.add_argument("--rounds", type=int, default=2, help="rounds on each environment")
    args = parser.parse_args()
    found = subprocess.run(["docker", "image", "inspect", HARBOR_IMAGE], capture_output=True)
    if found.returncode != 0:
        raise SystemExit(f"{HARBOR_IMAGE} is missing: run scripts/build-images harbor")
    walls: dict[str, list[float]] = {w: [] for w in WAYS}
    runs: dict[str, list[Trial]] = {w: [] for w in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            wall, got = one_round(way, args.trials, args.concurrent)
            walls[way].append(wall)
            runs[way] += got
    rows: dict[str, dict[str, float]] = {}
    for way, got in runs.items():
        row = {"run wall (median)": statistics.median(walls[way])}
        whole = [t.seconds for t in got]
        row["trial p50"], row["trial p90"] = _pct(whole, 0.5), _pct(whole, 0.9)
        for phase in PHASES:
            spans = [s for s in (_seconds(t.raw.get(phase)) for t in got) if s is not None]
            row[f"{phase} p50"] = _pct(spans, 0.5)
        rows[way] = row
    ours, theirs = rows["orchestrator"], rows["harbor docker"]
    n = args.trials * len(BOTH)
    lines = [
        "# Harbor: our environment against Harbor's docker",
        "",
        f"`python -m bench.harbor --trials {args.trials} --concurrent {args.concurrent} "
        f"--rounds {args.rounds}`: each round, `harbor run` of {', '.join(BOTH)} ({n} trials, "
        f"{args.concurrent} at a time, Harbor's oracle agent) on each environment in turn, "
        "from Harbor's image (Python 3.13, Harbor 0.26.0) against this machine's engine. "
        "Every trial scored 1.0. Seconds; the ratio is Harbor docker's over ours.",
        "",
        "| Measure | orchestrator | Harbor docker | Ratio |",
        "|---|---|---|---|",
    ]
    for key in ours:
        ratio = theirs[key] / ours[key] if ours[key] else float("nan")
        lines.append(f"| {key} | {ours[key]:.2f} | {theirs[key]:.2f} | {ratio:.1f}x |")
    report("harbor", lines)
    (OUT / "harbor.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
