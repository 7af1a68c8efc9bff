"""`python -m bench.isolation` (part of `just bench`): what `isolation: gvisor` and root
Podman (`--engine podman`, runc under Podman's API) cost against runc on Docker, for the same
file (the python test image, user 1000:1000) on each, in interleaved rounds (each round runs
every side, the order rotating from round to round, so drift on a shared machine hits them
alike):

- exec: p50 and p99 of `execute(["true"])` through the in-container executor, and the ratio
  gvisor / runc (goal, issue 25: at most TARGET x); beside it, the raw reference: `docker
  exec CONTAINER true` on the same container, and the floor under both: `true` started
  inside the sandbox by Python's subprocess, timed there (what a process start costs under
  each kernel, no exec path at all);
- start-up: `spawn_runtime` until the first `execute(["true"])` has answered (a fresh
  environment each time, removed after);
- output: 1 MiB through `execute` (`head -c 1048576 /dev/zero`);
- folder transfer: `rt.upload` of a folder of many small files and one large one into the
  workspace, then `rt.download` of it back.

Writes bench/results/isolation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench.measure import report
from orchestrator import Runtime, load_environment_text, spawn_runtime
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.docker.render import gvisor_runtime
from orchestrator.settings import podman_socket

TARGET = 3.0
"""Goal: `execute(["true"])` under gvisor takes at most this many times runc's (p50)."""
SIDES = ("runc", "gvisor", "podman")
"""runc and gvisor on the process's Docker engine; podman: runc on root Podman's API."""
ISOLATIONS = SIDES  # (the name the bench's test and older notes use)
OUTPUT = 1024 * 1024

EXEC, RAW, FLOOR, READY, BIG, UPLOAD, DOWNLOAD = (
    "orchestrator: execute(['true'])",
    "raw: docker exec CONTAINER true",
    "floor: `true` started inside the sandbox, timed there",
    "start-up: spawn_runtime to first execute answered",
    "1 MiB of output through execute",
    "folder upload (rt.upload)",
    "folder download (rt.download)",
)
SPAWN_TRUE = (
    "import json, subprocess, sys, time\n"
    "times = []\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    start = time.perf_counter()\n"
    "    subprocess.run(['true'], check=True)\n"
    "    times.append(time.perf_counter() - start)\n"
    "print(json.dumps(times))\n"
)
"""Run in the sandbox: `python3 -c SPAWN_TRUE COUNT`; prints the seconds of each `true` it
started (fork, exec, wait): what a process start costs under each kernel, no exec path."""
Got = dict[tuple[str, str], list[list[float]]]
"""(measurement, isolation) -> per round, the seconds of each call."""


def env_text(side: str) -> str:
    """The file every side runs: only `isolation` differs (Podman's is runc)."""
    isolation = "gvisor" if side == "gvisor" else "runc"
    return (
        "version: 1\nname: isobench\nimage: orchestrator-test/python:3.11\n"
        f"user: '1000:1000'\nisolation: {isolation}\n"
    )


def host_of(side: str) -> str | None:
    """The engine a side runs on: Podman's for podman, else the process's."""
    return "podman" if side == "podman" else None


def spawn(side: str) -> Runtime:
    return spawn_runtime(load_environment_text(env_text(side)), host=host_of(side))


@dataclass(frozen=True)
class Sizes:
    """How much each round does, per isolation."""

    execs: int = 200
    raw: int = 8
    floor: int = 50
    outputs: int = 5
    files: int = 200
    big: int = 5 * 1024 * 1024


def make_tree(root: Path, sizes: Sizes) -> int:
    """`sizes.files` small files (1 KiB each, in 10 folders) and one file of `sizes.big`
    bytes under `root`; returns the number of entries a download of it gives back."""
    for i in range(sizes.files):
        path = root / f"d{i % 10}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1024))
    (root / "big.bin").write_bytes(os.urandom(sizes.big))
    return len(list(root.rglob("*")))


@contextmanager
def pair() -> Iterator[dict[str, Runtime]]:
    """One environment of the file on each side, up; removed after."""
    with ExitStack() as stack:
        yield {side: stack.enter_context(spawn(side)) for side in SIDES}


def timed(fn: Callable[[], object], count: int) -> list[float]:
    """Seconds of each of `count` calls of `fn`."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def true_once(rt: Runtime) -> None:
    done = rt.execute(["true"])
    if done.exit_code != 0:
        raise RuntimeError(f"`true` failed ({done.exit_code}): {done.stderr.strip()}")


def output_once(rt: Runtime) -> None:
    done = rt.execute(["head", "-c", str(OUTPUT), "/dev/zero"])
    if done.exit_code != 0 or len(done.stdout) != OUTPUT:
        raise RuntimeError(f"1 MiB of output: {done.exit_code}, {len(done.stdout)} characters")


def floor(rt: Runtime, count: int) -> list[float]:
    done = rt.execute(["python3", "-c", SPAWN_TRUE, str(count)], timeout=600)
    if done.exit_code != 0:
        raise RuntimeError(f"starting `true` in the sandbox failed: {done.stderr.strip()}")
    times: list[float] = json.loads(done.stdout)
    return times


def raw_once(container: str, side: str = "runc") -> None:
    host = ["--host", podman_socket()] if host_of(side) else []
    subprocess.run(["docker", *host, "exec", container, "true"], check=True, capture_output=True)


def spawn_to_ready(side: str) -> float:
    """Seconds from `spawn_runtime` to the first `execute(["true"])` answered, in a fresh
    environment (removed after, not timed)."""
    start = time.perf_counter()
    rt = spawn(side)
    try:
        true_once(rt)
        return time.perf_counter() - start
    finally:
        rt.cleanup()


def transfer(rt: Runtime, tree: Path, into: Path, n: int, entries: int) -> tuple[float, float]:
    """Upload `tree` into the workspace folder up-N, download it back into `into`/N; the
    seconds of each."""
    start = time.perf_counter()
    rt.upload(tree, f"up-{n}")
    up = time.perf_counter() - start
    start = time.perf_counter()
    rt.download(f"up-{n}", into / str(n), limit=64 * 1024 * 1024)
    down = time.perf_counter() - start
    got = len(list((into / str(n)).rglob("*")))
    if got != entries:
        raise RuntimeError(f"download gave back {got} entries, not {entries}")
    return up, down


def measure(rounds: int, sizes: Sizes) -> Got:
    """Every measurement on every side, `rounds` interleaved rounds."""
    out: Got = {}
    with tempfile.TemporaryDirectory(prefix="orch-isobench-") as work:
        tree, back = Path(work) / "tree", Path(work) / "back"
        tree.mkdir()
        entries = make_tree(tree, sizes)
        with pair() as sides:
            for iso, rt in sides.items():  # warm up: executor, page cache, the CLI
                (back / f"warm-{iso}").mkdir(parents=True)
                timed(partial(true_once, rt), 5)
                output_once(rt)
                transfer(rt, tree, back / f"warm-{iso}", 0, entries)
                raw_once(rt.info().container or "", iso)
                floor(rt, 3)
            for n in range(rounds):
                order = SIDES[n % len(SIDES) :] + SIDES[: n % len(SIDES)]
                for iso in order:
                    rt = sides[iso]
                    container = rt.info().container or ""

                    def add(what: str, times: list[float], iso: str = iso) -> None:
                        out.setdefault((what, iso), []).append(times)

                    add(EXEC, timed(partial(true_once, rt), sizes.execs))
                    add(RAW, timed(partial(raw_once, container, iso), sizes.raw))
                    add(FLOOR, floor(rt, sizes.floor))
                    add(BIG, timed(partial(output_once, rt), sizes.outputs))
                    into = back / f"{iso}-{n}"
                    into.mkdir(parents=True)
                    up, down = transfer(rt, tree, into, n + 1, entries)
                    add(UPLOAD, [up])
                    add(DOWNLOAD, [down])
                    add(READY, [spawn_to_ready(iso)])
    return out


def pct(times: list[float], q: float) -> float:
    data = sorted(times)
    return data[min(len(data) - 1, int(q * len(data)))]


def flat(got: Got, what: str, iso: str) -> list[float]:
    return [t for one in got[(what, iso)] for t in one]


def exec_ratio(got: Got) -> tuple[float, float]:
    """gvisor / runc for `execute(["true"])`: the median of the per-round ratios of the p50s,
    and the ratio of the p50s over the whole run."""
    per_round = [
        statistics.median(g) / statistics.median(r)
        for g, r in zip(got[(EXEC, "gvisor")], got[(EXEC, "runc")], strict=True)
    ]
    whole = statistics.median(flat(got, EXEC, "gvisor")) / statistics.median(
        flat(got, EXEC, "runc")
    )
    return statistics.median(per_round), whole


def table_lines(got: Got, sizes: Sizes) -> list[str]:
    """The report's two tables and the verdict on the exec goal."""
    ms = 1000.0
    heads = " | ".join(f"{side} p50 ms | {side} p99 ms" for side in SIDES)
    ratios = [side for side in SIDES if side != "runc"]
    lines = [
        f"## Exec: `true`, {sizes.execs} through the executor, {sizes.raw} raw and "
        f"{sizes.floor} started inside per side and round",
        "",
        f"| path | n | {heads} | {' | '.join(f'{s} / runc (p50)' for s in ratios)} |",
        "|---|---:|" + "---:|" * (2 * len(SIDES) + len(ratios)),
    ]
    for what in (EXEC, RAW, FLOOR):
        each = {side: flat(got, what, side) for side in SIDES}
        cells = " | ".join(
            f"{statistics.median(t) * ms:.1f} | {pct(t, 0.99) * ms:.1f}" for t in each.values()
        )
        base = statistics.median(each["runc"])
        over = " | ".join(f"{statistics.median(each[s]) / base:.2f}x" for s in ratios)
        lines.append(f"| {what} | {len(each['runc'])} | {cells} | {over} |")
    per_round, whole = exec_ratio(got)
    verdict = "met" if max(per_round, whole) <= TARGET else "not met"
    lines += [
        "",
        f"Goal: `execute(['true'])` under gvisor at most {TARGET:.0f}x runc's p50: "
        f"**{verdict}** ({per_round:.2f}x, the median of the per-round ratios; "
        f"{whole:.2f}x, the ratio of the p50s over the run; met only when both are).",
        "",
        f"## The rest: medians ({OUTPUT / 2**20:.0f} MiB output: {sizes.outputs} per side "
        f"and round; folder: {sizes.files} files of 1 KiB + one of "
        f"{sizes.big / 2**20:.0f} MiB, into the workspace and back, once per round)",
        "",
        f"| measurement | n | {' | '.join(f'{s} median s' for s in SIDES)} "
        f"| {' | '.join(f'{s} / runc' for s in ratios)} |",
        "|---|---:|" + "---:|" * (len(SIDES) + len(ratios)),
    ]
    for what in (READY, BIG, UPLOAD, DOWNLOAD):
        mid = {side: statistics.median(flat(got, what, side)) for side in SIDES}
        cells = " | ".join(f"{v:.3f}" for v in mid.values())
        over = " | ".join(f"{mid[s] / mid['runc']:.2f}x" for s in ratios)
        lines.append(f"| {what} | {len(flat(got, what, 'runc'))} | {cells} | {over} |")
    return [*lines, ""]


def gvisor_setup() -> str:
    """How the engine runs gVisor here: runtime name, its arguments, runsc's version."""
    name = gvisor_runtime()
    args = Engine.at().runtimes().get(name)
    version = subprocess.run(
        ["runsc", "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    where = f"`{name}` registered with `{' '.join(args)}`" if args else f"`{name}` not found"
    return f"{where}; {version[0] if version else 'runsc version unknown'}"


def podman_version() -> str:
    got = subprocess.run(
        ["docker", "--host", podman_socket(), "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"Podman {got.stdout.strip() or '?'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--execs", type=int, default=Sizes.execs, help="per isolation, round")
    parser.add_argument("--raw", type=int, default=Sizes.raw, help="docker execs per round")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (the results are medians)")
    sizes = Sizes(execs=args.execs, raw=args.raw)
    started = time.perf_counter()
    got = measure(args.rounds, sizes)
    lines = [
        "# Isolation: what gVisor and Podman cost against runc on Docker",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs, load "
        f"average {os.getloadavg()[1]:.1f} over the run; {args.rounds} interleaved rounds; "
        f"the whole run took {time.perf_counter() - started:.0f} s. gVisor: {gvisor_setup()}. "
        "The same file on each (orchestrator-test/python:3.11, user 1000:1000), only "
        "`isolation` differing; podman: runc under root Podman's API (`--engine podman`, "
        f"{podman_version()}).",
        "",
        *table_lines(got, sizes),
    ]
    report("isolation", lines)


if __name__ == "__main__":
    main()
