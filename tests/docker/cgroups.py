"""A container's cgroup counters, read on this machine (the engine runs on its kernel):
CPU time used (cgroup v1 cpuacct.usage, v2 cpu.stat usage_usec) and memory (v1
memory.usage_in_bytes, v2 memory.current) and tasks (pids.current)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _paths(container: str) -> dict[str, str]:
    """Controller (v1: "cpuacct", "memory"; v2: "") -> the container's cgroup path."""
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", container],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    found = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


def cpu_ns(container: str) -> int:
    """Nanoseconds of CPU the container's processes used so far."""
    paths = _paths(container)
    if "cpuacct" in paths:
        for mount in ("cpuacct", "cpu,cpuacct"):
            usage = ROOT / mount / paths["cpuacct"].lstrip("/") / "cpuacct.usage"
            if usage.exists():
                return int(usage.read_text())
    stat = (ROOT / paths[""].lstrip("/") / "cpu.stat").read_text()
    fields = dict(line.split() for line in stat.splitlines())
    return int(fields["usage_usec"]) * 1000


def memory_bytes(container: str) -> int:
    """Bytes of memory the container's cgroup holds now."""
    paths = _paths(container)
    if "memory" in paths:
        return int(
            (ROOT / "memory" / paths["memory"].lstrip("/") / "memory.usage_in_bytes").read_text()
        )
    return int((ROOT / paths[""].lstrip("/") / "memory.current").read_text())


def pids(container: str) -> int:
    """Host tasks (processes and threads) in the container's cgroup now."""
    paths = _paths(container)
    if "pids" in paths:
        return int((ROOT / "pids" / paths["pids"].lstrip("/") / "pids.current").read_text())
    return int((ROOT / paths[""].lstrip("/") / "pids.current").read_text())
