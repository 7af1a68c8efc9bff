"""`python -m bench.eval_scale`: Inspect AI at scale on our provider, its sandbox calls awaited
natively (orchestrator.aio) against the same provider made to run each call in anyio's
worker threads (its limiter: 40 tokens), as it did before. 64 samples, all at once
(max_sandboxes=64), each running 50 short commands; every command's latency is measured in
the solver. Rounds alternate the two; medians of the rounds are reported. Writes
bench/results/eval_scale.md and prints the table.

The environments start in a warm pool (`prewarm` = 64), so the rounds compare the calls,
not the starts."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.measure import INSPECT_TASK_HEAD, scratch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
IMAGE = "orchestrator-test/python:3.11"

TASK = (
    INSPECT_TASK_HEAD
    + """\
import time

COMMANDS = {commands}


@solver
def work():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box, took = sandbox(), []
        for i in range(COMMANDS):
            started = time.perf_counter()
            r = await box.exec(["echo", str(i)], timeout=120)
            took.append(time.perf_counter() - started)
            assert r.stdout == f"{{i}}\\n", r
        state.metadata["took"] = took
        return state
    return solve


@scorer(metrics=[accuracy()])
def done():
    async def score(state: TaskState, target: Target) -> Score:
        ran = len(state.metadata.get("took", []))
        return Score(value=CORRECT if ran == COMMANDS else INCORRECT)
    return score


@task
def scale(config: str = "", prewarm: int = 0):
    return Task(
        dataset=[Sample(input=str(i), target="x") for i in range({samples})],
        solver=work(),
        scorer=done(),
        sandbox=("orchestrator", OrchestratorSandboxConfig(file=config, prewarm=prewarm)),
    )
"""
)
ENV = f"version: 1\nname: scale\nimage: {IMAGE}\nuser: '1000:1000'\n"


def run_one(folder: Path, way: str, samples: int, native: Callable[[], bool]) -> dict[str, float]:
    """One eval. The provider picks its path by `_on_asyncio` (False: anyio's threads, the
    path it keeps for trio); the threads way sets it so, the native way puts it back."""
    from inspect_ai import eval as inspect_eval

    from orchestrator.integrations import inspect as provider

    threads = way == "blocking API in threads"
    provider._on_asyncio = (lambda: False) if threads else native
    os.chdir(folder)
    started = time.perf_counter()
    [log] = inspect_eval(
        "task.py",
        model="mockllm/model",
        task_args={"config": str(folder / "env.yaml"), "prewarm": samples},
        max_samples=samples,
        max_sandboxes=samples,
        log_dir=str(folder / "logs" / ("threads" if threads else "async")),
        display="none",
    )
    wall = time.perf_counter() - started
    took = sorted(t for s in log.samples or [] for t in s.metadata.get("took", []))
    accuracy = log.results.scores[0].metrics["accuracy"].value if log.results else 0.0
    return {
        "wall_s": wall,
        "p50_ms": 1000 * took[len(took) // 2] if took else float("nan"),
        "p99_ms": 1000 * took[int(len(took) * 0.99)] if took else float("nan"),
        "commands": float(len(took)),
        "accuracy": float(accuracy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--commands", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from orchestrator.integrations import inspect as provider

    native = provider._on_asyncio
    folder = scratch("orch-scale-")
    (folder / "task.py").write_text(TASK.format(commands=args.commands, samples=args.samples))
    (folder / "env.yaml").write_text(ENV)
    ways = ["orchestrator.aio (native)", "blocking API in threads"]
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way in ways:
            runs[way].append(run_one(folder, way, args.samples, native))
    rows = []
    for way, results in runs.items():
        row: dict[str, float | str] = {"way": way}
        for key in ("wall_s", "p50_ms", "p99_ms", "commands", "accuracy"):
            row[key] = statistics.median(r[key] for r in results)
        row["walls"] = " ".join(f"{r['wall_s']:.1f}" for r in results)
        rows.append(row)
    md = [
        "# Inspect at scale: native async calls vs the blocking API in worker threads",
        "",
        f"{args.samples} samples, all at once (max_sandboxes={args.samples}, prewarmed); each "
        f"runs {args.commands} short commands (`echo i`), each timed in the solver. Image "
        f"`{IMAGE}`, model `mockllm/model`, {args.rounds} alternating rounds (medians), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores.",
        "",
        "| way | wall s | runs | exec p50 ms | exec p99 ms | commands | accuracy |",
        "|---|---:|---|---:|---:|---:|---:|",
        *(
            f"| {r['way']} | {float(r['wall_s']):.1f} | {r['walls']} | {float(r['p50_ms']):.1f} "
            f"| {float(r['p99_ms']):.1f} | {float(r['commands']):.0f} "
            f"| {float(r['accuracy']):.2f} |"
            for r in rows
        ),
        "",
        f"threads / native: wall **{float(rows[1]['wall_s']) / float(rows[0]['wall_s']):.2f}×**, "
        f"exec p99 **{float(rows[1]['p99_ms']) / float(rows[0]['p99_ms']):.2f}×**.",
        "",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "eval_scale.md").write_text("\n".join(md))
    (OUT / "eval_scale.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
