"""`python -m bench.bash_session` (part of `just bench`): Inspect's `bash_session` tool in a
real `inspect_ai.eval()`, three ways side by side in one run: our native tool
(`orchestrator.integrations.inspect.bash_session`) on our provider, Inspect's own tool (its
helper program injected into the sandbox) on our provider, and Inspect's own tool on
Inspect's own Docker sandbox. Each sample types 10 commands into one shell, each answered
with its output and the next prompt; the calls are timed in the solver (the first one apart:
it starts the shell, and for Inspect's tool injects its helper). Rounds alternate the three;
medians are reported. Writes bench/results/bash_session.md and prints it.

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

from bench.inspect_race import COMPOSE, ENV, IMAGE, OUT, _allow_old_engine
from bench.measure import INSPECT_TASK_HEAD, scratch

TASK = (
    INSPECT_TASK_HEAD
    + """\
import time

from inspect_ai.tool import bash_session as inspect_bash_session
from orchestrator.integrations.inspect import bash_session as native_bash_session


@solver
def work(native: bool):
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        shell = (native_bash_session if native else inspect_bash_session)()
        times = []
        for i in range({calls}):
            began = time.perf_counter()
            said = await shell(action="type_submit", input=f"echo step-{{i}}")
            times.append(time.perf_counter() - began)
            assert f"step-{{i}}\\n" in said and said.endswith("# "), said
        state.metadata["times"] = times
        return state
    return solve


@scorer(metrics=[accuracy()])
def done():
    async def score(state: TaskState, target: Target) -> Score:
        ok = len(state.metadata.get("times", [])) == {calls}
        return Score(value=CORRECT if ok else INCORRECT)
    return score


@task
def shells(config: str = "", provider: str = "", native: bool = True):
    return Task(
        dataset=[Sample(input=str(i), target="x") for i in range({samples})],
        solver=work(native),
        scorer=done(),
        sandbox=(provider, config),
    )
"""
)

WAYS = {
    "native tool, orchestrator": ("orchestrator", "env.yaml", True),
    "Inspect's tool, orchestrator": ("orchestrator", "env.yaml", False),
    "Inspect's tool, Inspect's docker": ("docker", "compose.yaml", False),
}


def run_one(folder: Path, way: str, at_once: int) -> dict[str, float]:
    from inspect_ai import eval as inspect_eval

    provider, config, native = WAYS[way]
    os.chdir(folder)  # Inspect takes the task file relative to the working folder
    started = time.perf_counter()
    [log] = inspect_eval(
        "task.py",
        model="mockllm/model",
        task_args={"provider": provider, "config": str(folder / config), "native": native},
        max_samples=at_once,
        max_sandboxes=at_once,
        log_dir=str(folder / "logs" / re.sub(r"\W+", "-", way)),
        display="none",
    )
    wall = time.perf_counter() - started
    assert log.status == "success" and log.results, (way, log.error)
    assert log.results.scores[0].metrics["accuracy"].value == 1.0, way
    times = [s.metadata["times"] for s in log.samples or []]
    return {
        "wall_s": wall,
        "first_ms": 1000 * statistics.median(t[0] for t in times),
        "call_ms": 1000 * statistics.median(x for t in times for x in t[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--at-once", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _allow_old_engine()
    folder = scratch("orch-shells-")
    (folder / "task.py").write_text(TASK.format(calls=args.calls, samples=args.samples))
    (folder / "compose.yaml").write_text(COMPOSE)
    (folder / "env.yaml").write_text(ENV)
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            runs[way].append(run_one(folder, way, args.at_once))
    med = {
        way: {k: statistics.median(r[k] for r in results) for k in results[0]}
        for way, results in runs.items()
    }
    walls = {way: " ".join(f"{r['wall_s']:.1f}" for r in runs[way]) for way in WAYS}
    rows = [{"way": way, **med[way], "walls": walls[way]} for way in WAYS]
    ours, theirs, docker = med.values()
    md = [
        "# Inspect's bash_session: native on our provider vs Inspect's injected tool",
        "",
        f"A real `inspect_ai.eval()`: {args.samples} samples, {args.at_once} at a time; each "
        f"types {args.calls} commands (`echo step-i`) into one shell with `bash_session`, "
        "each call timed in the solver. Image "
        f"`{IMAGE}`, model `mockllm/model`, {args.rounds} alternating rounds (medians), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores. "
        "Inspect's Docker sandbox asks for Docker Engine 24.0.6; this machine has 20.10, so "
        "its version check was bypassed.",
        "",
        "| tool, sandbox | first call ms | later calls ms (median) | eval wall s | walls |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {way} | {m['first_ms']:.0f} | {m['call_ms']:.1f} | {m['wall_s']:.1f} "
            f"| {walls[way]} |"
            for way, m in med.items()
        ),
        "",
        f"Inspect's tool / native, on our provider: **{theirs['call_ms'] / ours['call_ms']:.0f}×** "
        f"per call, **{theirs['first_ms'] / ours['first_ms']:.0f}×** the first call, "
        f"**{theirs['wall_s'] / ours['wall_s']:.1f}×** the eval's wall time; on Inspect's "
        f"Docker sandbox: **{docker['call_ms'] / ours['call_ms']:.0f}×** per call, "
        f"**{docker['wall_s'] / ours['wall_s']:.1f}×** the wall time.",
        "",
        "Inspect's tool waits until the shell has printed nothing for 0.5 s before it "
        "answers; the native one answers as soon as the shell is back at its prompt (the "
        "prompt's mark), and otherwise waits the same.",
        "",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bash_session.md").write_text("\n".join(md))
    (OUT / "bash_session.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(md))


if __name__ == "__main__":
    main()
