"""`python -m bench.inspect_race` (part of `just bench`): the same eval-shaped workload through
Inspect AI three ways, side by side in one run: on our provider with a warm pool (`prewarm`
= the samples at once, told how many samples the eval has), on our provider cold (each
sample starts its own environment), and on Inspect's own Docker sandbox, same image. Each
sample runs 20 commands and a file round trip; 32 samples, 8 at a time, in rounds that
alternate the three (medians reported: one run on a shared machine says little). Writes
bench/results/inspect_race.md and prints the table.

This engine (20.10) is older than the 24.0.6 Inspect's Docker sandbox asks for; its version
check is bypassed here (and said so in the results), nothing else about it is changed."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

from bench.measure import INSPECT_TASK_HEAD, scratch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
IMAGE = "orchestrator-test/python:3.11"

TASK = (
    INSPECT_TASK_HEAD
    + """\

COMMANDS = {commands}


@solver
def work():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box = sandbox()
        for i in range(COMMANDS):
            r = await box.exec(["sh", "-c", f"echo step {{i}}; echo err >&2"], timeout=60)
            assert r.success and r.stdout == f"step {{i}}\\n", r
        await box.write_file("data.txt", "x" * 65536)
        state.metadata["size"] = len(await box.read_file("data.txt"))
        return state
    return solve


@scorer(metrics=[accuracy()])
def done():
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=CORRECT if state.metadata.get("size") == 65536 else INCORRECT)
    return score


@task
def race(config: str = "", provider: str = "", prewarm: int = 0):
    if prewarm:
        config = OrchestratorSandboxConfig(file=config, prewarm=prewarm, samples={samples})
    return Task(
        dataset=[Sample(input=str(i), target="x") for i in range({samples})],
        solver=work(),
        scorer=done(),
        sandbox=(provider, config),
    )
"""
)

COMPOSE = f"""\
services:
  default:
    image: {IMAGE}
    command: ["tail", "-f", "/dev/null"]
    init: true
    network_mode: none
    x-local: true
"""
ENV = f"version: 1\nname: race\nimage: {IMAGE}\nuser: root\n"


def _allow_old_engine() -> None:
    from inspect_ai.util._sandbox.docker import prereqs

    async def accept(*args: object, **kwargs: object) -> None:
        return None

    prereqs.validate_docker_engine = accept


WAYS = {
    "orchestrator, prewarmed": ("orchestrator", "env.yaml", True),
    "orchestrator, cold": ("orchestrator", "env.yaml", False),
    "docker (Inspect's own)": ("docker", "compose.yaml", False),
}


def run_one(folder: Path, way: str, at_once: int) -> tuple[float, float, str]:
    from inspect_ai import eval as inspect_eval

    provider, config, warm = WAYS[way]
    os.chdir(folder)  # Inspect takes the task file relative to the working folder
    started = time.perf_counter()
    [log] = inspect_eval(
        "task.py",
        model="mockllm/model",
        task_args={
            "provider": provider,
            "config": str(folder / config),
            "prewarm": at_once if warm else 0,
        },
        max_samples=at_once,
        max_sandboxes=at_once,
        log_dir=str(folder / "logs" / re.sub(r"\W+", "-", way)),
        display="none",
    )
    wall = time.perf_counter() - started
    accuracy = log.results.scores[0].metrics["accuracy"].value if log.results else 0.0
    return wall, accuracy, log.status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--at-once", type=int, default=8)
    parser.add_argument("--commands", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _allow_old_engine()
    folder = scratch("orch-race-")
    (folder / "task.py").write_text(TASK.format(commands=args.commands, samples=args.samples))
    (folder / "compose.yaml").write_text(COMPOSE)
    (folder / "env.yaml").write_text(ENV)
    runs: dict[str, list[tuple[float, float, str]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            runs[way].append(run_one(folder, way, args.at_once))
    rows: list[dict[str, float | str]] = []
    for way, results in runs.items():
        walls = [w for w, _, _ in results]
        rows.append(
            {
                "provider": way,
                "wall_s": statistics.median(walls),
                "runs": " ".join(f"{w:.1f}" for w in walls),
                "accuracy": min(a for _, a, _ in results),
                "status": ",".join(sorted({s for _, _, s in results})),
            }
        )
    warm, cold, theirs = (float(r["wall_s"]) for r in rows)
    md = [
        "# Eval race: Inspect AI on our provider vs Inspect's own Docker sandbox",
        "",
        f"{args.samples} samples, {args.at_once} at a time; each: {args.commands} commands "
        f"and a 64 KiB file round trip. Image `{IMAGE}`, model `mockllm/model`, "
        f"{args.rounds} alternating rounds, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Inspect's Docker sandbox asks "
        "for Docker Engine 24.0.6; this machine has 20.10, so its version check was bypassed.",
        "",
        "| sandbox | median wall s | runs | accuracy | status |",
        "|---|---:|---|---:|---|",
        *(
            f"| {r['provider']} | {float(r['wall_s']):.1f} | {r['runs']} "
            f"| {float(r['accuracy']):.2f} | {r['status']} |"
            for r in rows
        ),
        "",
        f"Inspect's Docker sandbox / orchestrator (medians): **{theirs / warm:.1f}×** "
        f"prewarmed, **{theirs / cold:.1f}×** cold.",
        "",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "inspect_race.md").write_text("\n".join(md))
    (OUT / "inspect_race.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
