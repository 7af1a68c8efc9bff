"""`python -m bench.fork`: copies of a running gVisor sandbox with no network whose process
holds 64 MiB of memory, side by side in interleaved rounds (each round runs every path once):

- `checkpoint(memory=True)`: the sandbox saved with its memory, and started again;
- `fork(rt, 1)` and `fork(rt, 4)` with memory: copies whose process runs on;
- `fork(rt, 1, memory=False)`: a copy of the files, its process started anew by
  `setup.resume_commands` (which waits until it holds its memory again);
- a fresh spawn whose setup starts the same process;
- raw: `docker checkpoint create` of a plain runsc-sealed container holding the same memory,
  then `docker start --checkpoint` of it (the engine's own restore, in place: no copy,
  no record, no checks).

Writes bench/results/fork.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.measure import report, scratch
from orchestrator import Runtime, fork, spawn_runtime

IMAGE = "orchestrator-test/python:3.11"
HOLD = (
    'python3 -c \'import time; b = bytearray(64 << 20); b[::4096] = b"x" * len(b[::4096]); '
    'open("/tmp/held", "w").write("1"); time.sleep(1e9)\' >/dev/null 2>&1 &'
)
WAIT = "while [ ! -s /tmp/held ]; do sleep 0.05; done"
ENV = f"""version: 1
name: forkbench
image: {IMAGE}
isolation: gvisor
network: {{egress: none}}
resources: {{memory: 512m}}
setup:
  commands: [{json.dumps(HOLD)}, {json.dumps(WAIT)}]
  resume_commands: [{json.dumps(HOLD)}, {json.dumps(WAIT)}]
"""


def _docker(*argv: str) -> str:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _clock(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.perf_counter()
    got = fn()
    return time.perf_counter() - t, got


def _start_from(name: str) -> None:
    """`docker start --checkpoint c1`, tried again while containerd still holds the same
    bytes from an earlier upload ("already exists"), as the orchestrator does."""
    deadline = time.monotonic() + 30
    while True:
        try:
            _docker("start", "--checkpoint", "c1", name)
            return
        except RuntimeError as exc:
            if "already exists" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _raw(name: str) -> tuple[float, float]:
    """A plain runsc-sealed container holding the memory: checkpoint, then restore, timed."""
    _docker("run", "-d", "--name", name, "--runtime", "runsc-sealed", "--network", "none", IMAGE,
            "sh", "-c", f"{HOLD.removesuffix(' &')}")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while _docker("exec", name, "sh", "-c", "cat /tmp/held 2>/dev/null; true").strip() != "1":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        save, _ = _clock(lambda: _docker("checkpoint", "create", name, "c1"))
        while _docker("inspect", "-f", "{{.State.Running}}", name).strip() != "false":
            time.sleep(0.01)  # (the engine records the exit a moment later)
        back, _ = _clock(lambda: _start_from(name))
        return save, back
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def _round(env: Path, add: Callable[[str, float], None]) -> None:
    """Each memory step on a fresh sandbox: this engine checkpoints a sandbox with memory
    once (docs/fork.md)."""
    for label, count, memory in (
        ("checkpoint(memory=True)", 0, True),
        ("fork(1), memory", 1, True),
        ("fork(4), memory", 4, True),
        ("fork(1), files only", 1, False),
    ):
        spawn, rt = _clock(lambda: spawn_runtime(env))
        assert isinstance(rt, Runtime)
        add("fresh spawn + setup", spawn)
        try:
            t = time.perf_counter()
            if not count:
                saved = rt.checkpoint(memory=True)
                add(label, time.perf_counter() - t)
                saved.remove()
                continue
            made = fork(rt, count, memory=memory)
            add(label, time.perf_counter() - t)
            for copy in made:
                copy.cleanup()
        finally:
            rt.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = scratch("forkbench-") / "env.yaml"
    env.write_text(ENV)
    rows: dict[str, list[float]] = {}

    def add(key: str, seconds: float) -> None:
        rows.setdefault(key, []).append(seconds)

    for n in range(args.rounds):
        _round(env, add)
        save, back = _raw(f"forkbench-raw-{os.getpid()}-{n}")
        add("raw docker checkpoint create", save)
        add("raw docker start --checkpoint", back)

    med = {k: statistics.median(v) for k, v in rows.items()}
    load = os.getloadavg()[0]
    lines = [
        "# Forks with memory (gVisor, no network, 64 MiB held)",
        "",
        f"`python -m bench.fork --rounds {args.rounds}`: medians over interleaved rounds.",
        "",
        "| step | median s | per copy s |",
        "|---|---:|---:|",
        *(f"| {k} | {med[k]:.2f} | {med[k] / (4 if '(4)' in k else 1):.2f} |" for k in rows),
        "",
        "A copy with memory: the original checkpointed and started again from it, its "
        "filesystem committed and its workspace packed while it stands still; then for each "
        "copy a new sandbox made from that image, its workspace put in by the engine, and "
        "started from the memory image (checked against its digests). The raw rows "
        "restore in place (no copy, no record, no checks).",
        "",
        f"Load average over the run: {load:.1f} on {os.cpu_count()} CPUs.",
        "",
    ]
    report("fork", lines)


if __name__ == "__main__":
    main()
