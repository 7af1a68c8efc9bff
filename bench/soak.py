"""`python -m bench.soak` (or `just soak`): many environments, each with a random fault
injected, to find hangs, leaks and errors that only show at volume.

Every call runs under a bound (its own timeout plus 5 s); a call past it counts as a hang.
An exception the fault does not explain counts as an error. After the run, anything of ours
created during it (containers, networks, volumes, project folders) counts as a leak.
Writes bench/results/soak.md; exits 1 unless hangs, leaks and errors are all 0.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchestrator import (
    ExecutorLost,
    Runtime,
    SandboxUnavailable,
    UsageError,
    load_environment_text,
    spawn_runtime,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results"
IMAGE = os.environ.get("ORCHESTRATOR_PYTHON_IMAGE", "orchestrator-test/python:3.11")
SIDECAR = os.environ.get("ORCHESTRATOR_BUSYBOX_IMAGE", "orchestrator-test/busybox:1")
SLACK = 5.0
LABEL = "org.orchestrator.managed=1"


class Hang(Exception):
    pass


def bounded(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run fn in a thread; raise Hang if it has not returned after `seconds`."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as exc:
            box.append(("err", exc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise Hang(f"still running after {seconds:g}s")
    kind, value = box[0]
    if kind == "err":
        raise value
    return value


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], capture_output=True, timeout=60, check=False)


# ----- faults: each gets a live runtime and returns normally when the contract held -------
def f_none(rt: Runtime) -> None:
    assert bounded(10 + SLACK, lambda: rt.execute("echo ok", timeout=10)).stdout == "ok\n"


def f_timeout_closed_pipes(rt: Runtime) -> None:
    r = bounded(2 + SLACK, lambda: rt.execute("exec >/dev/null 2>&1; sleep 60", timeout=2))
    assert r.timed_out


def f_stalled_stream(rt: Runtime) -> None:
    stream = rt.stream("yes spam", timeout=30)
    next(stream)
    try:
        assert bounded(10 + SLACK, lambda: rt.execute("echo other", timeout=10)).ok
    finally:
        stream.close()


def _container(rt: Runtime) -> str:
    container = rt.info().container
    assert container is not None
    return container


def f_bad_requests(rt: Runtime) -> None:
    r = bounded(10 + SLACK, lambda: rt.execute("id", user="no-such-user", timeout=10))
    assert r.exit_code == 126
    for call in ({"command": ["a\0b"]}, {"command": "true", "env": {"A=B": "1"}}):
        try:
            bounded(SLACK, lambda call=call: rt.execute(**call))  # type: ignore[misc]
        except UsageError:
            continue
        raise AssertionError(f"{call} was accepted")


def f_kill_executor(rt: Runtime) -> None:
    script = (
        "for p in /proc/[0-9]*; do grep -q 'agen[t].py' $p/cmdline 2>/dev/null "
        "&& kill -9 ${p#/proc/}; done; true"
    )
    docker("exec", "-u", "0", _container(rt), "sh", "-c", script)
    try:  # sent while the death is not yet noticed: ExecutorLost (it may or may not have run)
        r = bounded(20 + SLACK, lambda: rt.execute("echo back", timeout=20))
    except ExecutorLost:
        r = bounded(20 + SLACK, lambda: rt.execute("echo back", timeout=20))
    assert r.stdout == "back\n"


def f_kill_container(rt: Runtime) -> None:
    docker("kill", _container(rt))
    try:
        bounded(10 + SLACK, lambda: rt.execute("true", timeout=10))
    except SandboxUnavailable:
        return
    raise AssertionError("a killed sandbox ran a command")


def f_pause(rt: Runtime) -> None:
    box: list[BaseException] = []

    def run() -> None:
        try:
            rt.execute("sleep 20", timeout=3)
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.3)
    docker("pause", _container(rt))
    try:
        t.join(3 + 2 + SLACK)
        if t.is_alive():
            raise Hang("paused sandbox: no answer within timeout + 2 s + slack")
        assert box and isinstance(box[0], SandboxUnavailable), box
    finally:
        docker("unpause", _container(rt))


OWNER = (
    "import sys, time\nfrom orchestrator import spawn_runtime\n"
    "rt = spawn_runtime(sys.argv[1]); print(rt.info().id, flush=True); time.sleep(600)\n"
)


def f_owner_sigkill(path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    try:
        name = bounded(120, owner.stdout.readline).strip()
        owner.kill()
        owner.wait(10)
        flt = f"label=org.orchestrator.project={name}"
        deadline = time.monotonic() + 10 + SLACK
        while time.monotonic() < deadline:
            left = subprocess.run(
                ["docker", "ps", "-aq", "--filter", flt], capture_output=True, text=True
            ).stdout.split()
            if not left:
                return
            time.sleep(0.5)
        raise Hang(f"{name}: containers left 15 s after the owner was killed")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()


IN_RUNTIME = {
    "none": f_none,
    "timeout, pipes closed": f_timeout_closed_pipes,
    "stalled stream": f_stalled_stream,
    "bad requests": f_bad_requests,
    "executor killed": f_kill_executor,
    "container killed": f_kill_container,
    "container paused": f_pause,
}
FAULTS = [*IN_RUNTIME, "owner SIGKILL"]


def env_text(i: int, sidecar: bool) -> str:
    text = f"version: 1\nname: soak-{i % 1000}\nimage: {IMAGE}\nuser: '1000:1000'\n"
    text += "resources: {memory: 256m, pids: 128}\n"
    if sidecar:
        text += f"services: {{db: {{image: {SIDECAR}, command: [sleep, '600']}}}}\n"
    return text


def one(i: int, fault: str, folder: Path, rng: random.Random) -> str:
    """Run environment i with its fault; return "ok", "hang: ..." or "error: ..."."""
    sidecar = rng.random() < 0.3
    path = folder / f"env-{i}.yaml"
    path.write_text(env_text(i, sidecar))
    try:
        if fault == "owner SIGKILL":
            f_owner_sigkill(path)
            return "ok"
        env = load_environment_text(path.read_text(), source=str(path), base_dir=folder)
        rt = bounded(120, lambda: spawn_runtime(env))
        try:
            IN_RUNTIME[fault](rt)
        finally:
            bounded(60, rt.cleanup)
        return "ok"
    except Hang as exc:
        return f"hang: {exc}"
    except Exception:
        return "error: " + traceback.format_exc(limit=4).strip().splitlines()[-1]


def ours() -> set[str]:
    ids: set[str] = set()
    for kind in (["ps", "-aq"], ["network", "ls", "-q"], ["volume", "ls", "-q"]):
        out = subprocess.run(
            ["docker", *kind, "--filter", f"label={LABEL}"], capture_output=True, text=True
        ).stdout
        ids |= {f"{kind[0]}:{x}" for x in out.split()}
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", type=int, default=300)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    plan = [(i, rng.choice(FAULTS)) for i in range(args.envs)]
    state = Path(tempfile.mkdtemp(prefix="orch-soak-state-"))
    os.environ["ORCHESTRATOR_STATE_DIR"] = str(state)
    before = ours()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="orch-soak-") as tmp:
        seeds = [rng.random() for _ in plan]
        with ThreadPoolExecutor(args.workers) as pool:
            outcomes = list(
                pool.map(
                    lambda p: (p[0][1], one(p[0][0], p[0][1], Path(tmp), random.Random(p[1]))),
                    zip(plan, seeds, strict=True),
                )
            )
    elapsed = time.monotonic() - started
    time.sleep(10)  # what a dead owner leaves may take a few seconds to go
    leaked = sorted(ours() - before)
    folders = sorted(p.name for p in (state / "projects").glob("*")) if state.exists() else []
    report(args, outcomes, leaked, folders, elapsed)
    if not folders:
        shutil.rmtree(state, ignore_errors=True)
    bad = [o for _, o in outcomes if o != "ok"]
    return 0 if not bad and not leaked and not folders else 1


def report(
    args: argparse.Namespace,
    outcomes: list[tuple[str, str]],
    leaked: list[str],
    folders: list[str],
    elapsed: float,
) -> None:
    per: dict[str, Counter[str]] = {f: Counter() for f in FAULTS}
    for fault, outcome in outcomes:
        per[fault][outcome.split(":")[0]] += 1
    lines = [
        f"# Soak: {args.envs} environments, {args.workers} at a time, seed {args.seed}",
        "",
        f"{elapsed:.0f} s on {os.cpu_count()} cores.",
        "",
        "| fault injected | environments | ok | hangs | errors |",
        "|---|---:|---:|---:|---:|",
    ]
    for fault, c in per.items():
        count = sum(c.values())
        lines.append(f"| {fault} | {count} | {c['ok']} | {c['hang']} | {c['error']} |")
    total = Counter(o.split(":")[0] for _, o in outcomes)
    lines += [
        f"| **all** | {len(outcomes)} | {total['ok']} | {total['hang']} | {total['error']} |",
        "",
        f"Leaked Docker objects: {len(leaked)}. Leaked project folders: {len(folders)}.",
    ]
    details = [f"- {fault}: {o}" for fault, o in outcomes if o != "ok"]
    details += [f"- leaked {x}" for x in leaked + folders]
    if details:
        lines += ["", "## Problems", "", *details[:50]]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "soak.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
