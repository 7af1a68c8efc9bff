"""`python -m bench` (or `just bench`): one run, every path side by side on this machine.
Writes bench/results/latest.{md,json} and latency.png."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.measure import Sample, ShellPipe, compose_argv, timed
from orchestrator import Pool, Runtime, load_environment, spawn_runtime
from orchestrator.backends.docker.render import CompileOptions, compile_project
from orchestrator.backends.docker.runtime import ComposeRuntime

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
PY_ENV = ROOT / "environments" / "python.yaml"


@contextlib.contextmanager
def usage_sampling(every: str) -> Iterator[None]:
    """ORCHESTRATOR_USAGE_EVERY for the block (the sampler reads it at each spawn)."""
    before = os.environ.get("ORCHESTRATOR_USAGE_EVERY")
    os.environ["ORCHESTRATOR_USAGE_EVERY"] = every
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ORCHESTRATOR_USAGE_EVERY", None)
        else:
            os.environ["ORCHESTRATOR_USAGE_EVERY"] = before


def exec_paths(n: int) -> list[Sample]:
    env = load_environment(PY_ENV)
    out: list[Sample] = []
    out.append(timed("plain subprocess on the host", lambda: subprocess.run(["true"]), n))
    with spawn_runtime(ROOT / "environments" / "local.yaml", backend="local") as local:
        out.append(timed("orchestrator local execute", lambda: local.execute(["true"]), n))
    with spawn_runtime(env, disable_setup=True) as rt:
        # the raw paths need the engine's own handles: a benchmark may look inside
        assert isinstance(rt, ComposeRuntime) and rt.project is not None
        container, project = rt.project.main_container, rt.project
        out.append(timed("orchestrator docker execute", lambda: rt.execute(["true"]), n))
        out.append(timed("rt.usage() (a reading of the sandbox)", rt.usage, n))
        with usage_sampling("3600"), spawn_runtime(env, disable_setup=True) as quiet:
            out.append(
                timed(
                    "orchestrator docker execute, usage not sampled",
                    lambda: quiet.execute(["true"]),
                    n,
                )
            )
        try:
            import docker

            api = docker.from_env().containers.get(container)
            out.append(
                timed(
                    "Docker Engine API exec (docker-py)",
                    lambda: api.exec_run(["true"]),
                    max(10, n // 4),
                )
            )
        except ImportError:
            print("docker-py not installed: skipping that path (pip install '.[bench]')")
        pow_client = project.client
        out.append(
            timed(
                "python-on-whales container.execute",
                lambda: pow_client.container.execute(container, ["true"]),
                max(10, n // 4),
            )
        )
        out.append(
            timed(
                "docker exec CLI",
                lambda: subprocess.run(["docker", "exec", container, "true"], check=True),
                max(10, n // 4),
            )
        )
        compose = compose_argv(project)
        out.append(
            timed(
                "docker compose exec",
                lambda: subprocess.run(
                    [*compose, "exec", "-T", "main", "true"], check=True, capture_output=True
                ),
                max(10, n // 4),
            )
        )
        pipe = ShellPipe(container)
        out.append(timed("shell in the container over a pipe (floor)", lambda: pipe.run("true"), n))
        pipe.close()
    return out


def output_and_stream(n: int) -> list[Sample]:
    out = []
    for label, path in (("local", ROOT / "environments" / "local.yaml"), ("docker", PY_ENV)):
        backend = "local" if label == "local" else None  # the caller's choice, not the file's
        with spawn_runtime(path, disable_setup=True, backend=backend) as rt:
            out.append(
                timed(
                    f"{label}: execute with 1 MB output",
                    functools.partial(rt.execute, "head -c 1048576 /dev/zero"),
                    n,
                )
            )

            out.append(first_byte(f"{label}: time to first streamed byte", rt, n))
    return out


def first_byte(name: str, rt: Runtime, n: int) -> Sample:
    """From calling stream() to the first output event (the rest is drained untimed)."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        events = iter(rt.stream("echo x; sleep 0.05"))
        next(events)
        times.append(time.perf_counter() - t)
        for _ in events:
            pass
    return Sample(name, times)


def up_down(n: int) -> list[Sample]:
    env = load_environment(PY_ENV)
    up_s, ready_s, down_s, raw_up, raw_down = [], [], [], [], []
    for _ in range(n):
        t = time.perf_counter()
        rt = spawn_runtime(env, disable_setup=True)
        up_s.append(time.perf_counter() - t)  # containers up, executor starting
        rt.execute("true")
        ready_s.append(time.perf_counter() - t)  # first command done, executor included
        t = time.perf_counter()
        rt.cleanup()
        down_s.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        ws = Path(d) / "ws"
        ws.mkdir()
        compiled = compile_project(
            env,
            CompileOptions(
                project="bench-raw", workspace=ws, labels={"org.orchestrator.managed": "1"}
            ),
        )
        compiled.write(Path(d) / "p")
        (Path(d) / "p" / "sandbox" / "entry.sh").write_text(compiled.files["sandbox/entry.sh"])
        base = ["docker", "compose", "-f", str(Path(d) / "p" / "compose.yaml"), "-p", "bench-raw"]
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run([*base, "up", "-d"], check=True, capture_output=True)
            raw_up.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([*base, "down", "-t", "2"], check=True, capture_output=True)
            raw_down.append(time.perf_counter() - t)
    return [
        Sample("orchestrator up (spawn returns)", up_s),
        Sample("raw docker compose up -d", raw_up),
        Sample("orchestrator up + first command (executor ready)", ready_s),
        Sample("orchestrator down (cleanup)", down_s),
        Sample("raw docker compose down", raw_down),
    ]


def pool_acquire(n: int) -> Sample:
    """Handing out a warm environment (the pool refills between calls, untimed)."""
    times = []
    with Pool(load_environment(PY_ENV), size=2, disable_setup=True) as pool:
        for _ in range(n):
            while pool.ready < 1:
                time.sleep(0.01)
            t = time.perf_counter()
            rt = pool.acquire()
            times.append(time.perf_counter() - t)
            pool.release(rt)
    return Sample("pool acquire (warm, size 2)", times)


def pool_reset(n: int) -> Sample:
    """A reuse pool taking one back and handing it out again: every process killed, the
    workspace refilled (a file and a background process are left each time, untimed)."""
    times = []
    with Pool(load_environment(PY_ENV), size=1, reuse=True, disable_setup=True) as pool:
        rt = pool.acquire(timeout=120)
        for _ in range(n):
            rt.execute("echo x > scratch; sleep 1000 >/dev/null 2>&1 &")
            t = time.perf_counter()
            pool.release(rt)
            rt = pool.acquire()
            times.append(time.perf_counter() - t)
        pool.release(rt)
    return Sample("pool release (reset) + acquire, reuse=True", times)


def concurrency(levels: list[int]) -> list[Sample]:
    path = Path(tempfile.mkdtemp()) / "env.yaml"
    path.write_text(
        "version: 1\nname: sweep\nimage: orchestrator-test/python:3.11\nnetwork: {outbound: true}\n"
    )
    env = load_environment(path)
    out = []
    for k in levels:

        def one(_: int) -> bool:
            try:
                with spawn_runtime(env, disable_setup=True) as rt:
                    return rt.execute("true").exit_code == 0
            except Exception:
                return False

        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=k) as pool:
            ok = list(pool.map(one, range(k)))
        out.append(
            Sample(
                f"{k} environments at once (wall)",
                [time.perf_counter() - t],
                failures=ok.count(False),
            )
        )
    return out


def load_render(n: int) -> Sample:
    ws = Path(tempfile.mkdtemp())

    def go() -> None:
        env = load_environment(ROOT / "environments" / "multi-service.yaml")
        compile_project(env, CompileOptions(project="bench", workspace=ws))

    return timed("load + validate + render (multi-service)", go, n)


def table(title: str, samples: list[Sample], floor: float | None, ref: float | None) -> str:
    lines = [
        f"### {title}",
        "",
        "| path | p50 ms | p90 ms | × floor | × compose exec | failures |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in samples:
        xf = f"{s.p50 / floor:.1f}" if floor else ""
        xr = f"{s.p50 / ref:.2f}" if ref else ""
        lines.append(
            f"| {s.name} | {s.p50 * 1000:.2f} | {s.p90 * 1000:.2f} | {xf} | {xr} | {s.failures} |"
        )
    return "\n".join(lines) + "\n"


def plot(samples: list[Sample], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install '.[bench]')")
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [s.name for s in samples]
    ax.barh(names, [s.p50 * 1000 for s in samples], color="#4a7ab5")
    ax.set_xscale("log")
    ax.set_xlabel("p50 latency of `true`, ms (log scale)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200, help="iterations of the fast paths")
    parser.add_argument("--levels", default="1,8,32,64", help="concurrency sweep levels")
    parser.add_argument("--up-runs", type=int, default=5)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    ex = exec_paths(args.n)
    by = {s.name: s for s in ex}
    floor = by["plain subprocess on the host"].p50
    ref = by["docker compose exec"].p50
    docker_overhead = by["orchestrator docker execute"].p50
    other = output_and_stream(max(20, args.n // 4))
    ud = up_down(args.up_runs)
    warm = pool_acquire(max(5, args.up_runs))
    reset = pool_reset(max(5, args.up_runs))
    sweep = concurrency([int(x) for x in args.levels.split(",") if x])
    lr = load_render(50)
    machine = f"{platform.node()}: {platform.platform()}, Python {sys.version.split()[0]}"
    md = [
        f"# Benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Machine: {machine}",
        "",
        table("Exec of `true`", ex, floor, ref),
        table("Output and streaming", other, floor, None),
        table("Up and down", ud, None, None),
        f"`up` ratio (orchestrator spawn / raw compose up -d): {ud[0].p50 / ud[1].p50:.2f}; "
        f"with the first command done: {ud[2].p50 / ud[1].p50:.2f}",
        "",
        table("Warm pool", [warm, reset, ud[2]], None, None),
        f"pool acquire vs a cold start with its first command: {ud[2].p50 / warm.p50:.0f}× faster; "
        f"a reset and acquire of a reuse pool: {ud[2].p50 / reset.p50:.1f}× faster",
        "",
        table("Concurrency sweep (each: up, run `true`, down)", sweep, None, None),
        table("Environment files", [lr], None, None),
        f"Docker `execute` p50: {docker_overhead * 1000:.2f} ms, "
        f"{ref / docker_overhead:.0f}× faster than `docker compose exec`.",
        "",
        f"With usage sampled every second and not at all: {docker_overhead * 1000:.2f} ms and "
        f"{by['orchestrator docker execute, usage not sampled'].p50 * 1000:.2f} ms p50; a "
        f"reading (`rt.usage()`) {by['rt.usage() (a reading of the sandbox)'].p50 * 1000:.2f} ms.",
        "",
    ]
    (OUT / "latest.md").write_text("\n".join(md))
    data = {
        s.name: {"p50": s.p50, "p90": s.p90, "n": len(s.times), "failures": s.failures}
        for s in [*ex, *other, *ud, warm, reset, *sweep, lr]
    }
    (OUT / "latest.json").write_text(json.dumps({"machine": machine, "results": data}, indent=2))
    plot(ex, OUT / "latency.png")
    print("\n".join(md))


if __name__ == "__main__":
    main()
