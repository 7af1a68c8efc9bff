"""Timing helpers and the raw exec paths the orchestrator is compared against."""

from __future__ import annotations

import atexit
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.docker.lifecycle import Project

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"


def scratch(prefix: str) -> Path:
    """A new temporary folder, removed when the bench ends."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def report(name: str, lines: list[str]) -> None:
    """Write bench/results/<name>.md and print it."""
    text = "\n".join(lines).rstrip("\n") + "\n"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.md").write_text(text)
    print(text, end="")


@dataclass
class Sample:
    name: str
    times: list[float]
    failures: int = 0

    def pct(self, q: float) -> float:
        data = sorted(self.times)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(q * len(data)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def p90(self) -> float:
        return self.pct(0.9)


def timed(name: str, fn: Callable[[], object], n: int, warmup: int = 3) -> Sample:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return Sample(name, times)


class ShellPipe:
    """A shell already running inside the container, fed over a pipe: the floor."""

    def __init__(self, container: str) -> None:
        self.proc = subprocess.Popen(
            ["docker", "exec", "-i", container, "/bin/sh"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )

    def run(self, command: str) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{command}; echo __done__\n".encode())
        line = b""
        while not line.endswith(b"__done__\n"):
            line += self.proc.stdout.read(1)

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait()


def compose_argv(project: Project) -> list[str]:
    """`docker compose` aimed at one of our projects, as a user would type it."""
    return ["docker", "compose", "-p", project.name, "-f", str(project.directory / "compose.yaml")]


INSPECT_TASK_HEAD = """\
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox
from orchestrator.integrations.inspect import OrchestratorSandboxConfig
"""
"""The imports of the Inspect task files the eval benchmarks write."""
