"""`python -m bench.snapshot` (part of `just bench`): a 100 MB workspace saved and put back,
side by side with `tar` of the same tree, in interleaved rounds (each round runs every path
once, in turn, so drift on a shared machine hits them alike).

- orchestrator: `rt.snapshot(path)` (the host's tar packing the workspace's bind mount
  straight into the file), then `rt.restore(snap)` (every process killed, the workspace
  emptied and refilled by the sandbox's tar, reading the file through a FIFO).
- tar on the host: `tar -c` of the workspace folder (a bind mount) to a file, then `rm -rf`
  of its content and `tar -x` back: the same work with nothing between.
- tar through docker exec: the same two tars run in the container by `docker exec`.

The ratio is given two ways: median of ours over median of tar, and the median of the
per-round ratios (each round's two times taken moments apart: the steadier of the two on a
busy machine). The goal (issue 26): at most TARGET x.

Also timed: a resume into a new environment (spawn_runtime(resume=...)) against a cold
spawn of the same file. Writes bench/results/snapshot.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.measure import report
from bench.transfer import make_tree
from orchestrator import Snapshot, load_environment_text, spawn_runtime
from orchestrator.backends.docker.runtime import ComposeRuntime

ENV = "version: 1\nname: snapbench\nimage: orchestrator-test/python:3.11\n"
OURS, TAR = "orchestrator: snapshot + restore", "tar on the host: pack + unpack"
TARGET = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 (the result is a median)")
    work = Path(tempfile.mkdtemp(prefix="orch-snapbench-"))
    make_tree(work / "tree", args.megabytes, args.files)
    env = load_environment_text(ENV)
    rows: dict[str, list[float]] = {}
    with spawn_runtime(env, disable_setup=True) as rt:
        assert isinstance(rt, ComposeRuntime) and rt.project is not None
        rt.upload(work / "tree", rt.workdir)
        host = work / "host.tar"
        folder = rt.project.directory / "workspace"  # the bind mount behind rt.workdir
        container, user = rt.project.main_container, rt.default_user or "0:0"
        exec_tar = ["docker", "exec", "-i", "-u", user, "-w", rt.workdir, container]
        snaps: list[Snapshot] = []
        packed: dict[str, list[float]] = {OURS: [], TAR: []}  # the first half of each

        def ours() -> None:
            t = time.perf_counter()
            snap = rt.snapshot(work / "ours.tar")
            packed[OURS].append(time.perf_counter() - t)
            rt.restore(snap)
            snaps.append(snap)

        def host_tar() -> None:
            t = time.perf_counter()
            subprocess.run(["tar", "-c", "-f", str(host), "-C", str(folder), "."], check=True)
            packed[TAR].append(time.perf_counter() - t)
            for child in folder.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            subprocess.run(["tar", "-x", "-f", str(host), "-C", str(folder)], check=True)

        def docker_exec_tar() -> None:
            with (work / "exec.tar").open("wb") as out:
                subprocess.run([*exec_tar, "tar", "-c", "-f", "-", "."], stdout=out, check=True)
            subprocess.run([*exec_tar, "sh", "-c", "rm -rf -- ./* ./.[!.]*"], check=True)
            with (work / "exec.tar").open("rb") as src:
                subprocess.run([*exec_tar, "tar", "-x", "-f", "-"], stdin=src, check=True)

        paths: dict[str, Callable[[], None]] = {
            OURS: ours,
            TAR: host_tar,
            "tar through docker exec: pack + unpack": docker_exec_tar,
        }
        for _ in range(args.rounds):  # alternate, so drift on a shared machine hits all alike
            for name, fn in paths.items():
                t = time.perf_counter()
                fn()
                rows.setdefault(name, []).append(time.perf_counter() - t)
        size = snaps[-1].size
        check = rt.execute("find . -type f | wc -l").stdout.strip()
        assert int(check) == args.files, f"the workspace holds {check} files after the rounds"
    resume, cold = [], []
    for _ in range(max(3, args.rounds // 2)):
        t = time.perf_counter()
        with spawn_runtime(env, resume=snaps[-1]) as resumed:
            resume.append(time.perf_counter() - t)
            assert resumed.execute("find . -type f | wc -l").stdout.strip() == str(args.files)
        t = time.perf_counter()
        with spawn_runtime(env):
            cold.append(time.perf_counter() - t)
    shutil.rmtree(work, ignore_errors=True)
    med = {name: statistics.median(times) for name, times in rows.items()}
    tar, load = med[TAR], os.getloadavg()[1]
    paired = statistics.median(o / t for o, t in zip(rows[OURS], rows[TAR], strict=True))
    verdict = "met" if max(paired, med[OURS] / tar) <= TARGET else "not met"
    lines = [
        "# Snapshot and restore of a workspace",
        "",
        f"{args.files} files, {args.megabytes} MB ({size / 1e6:.0f} MB archive), in a Docker "
        f"sandbox's workspace; median of {args.rounds} interleaved rounds, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| path | median s | × tar on the host |",
        "|---|---:|---:|",
        *(f"| {name} | {m:.2f} | {m / tar:.2f} |" for name, m in med.items()),
        "",
        f"Snapshot + restore against host `tar c` + `tar x`: {med[OURS] / tar:.2f}x (medians), "
        f"{paired:.2f}x (median of the {args.rounds} per-round ratios); goal <= {TARGET}x: "
        f"{verdict}.",
        "",
        "Where the time goes (medians): snapshot "
        f"{statistics.median(packed[OURS]):.2f} s + restore "
        f"{statistics.median(a - p for a, p in zip(rows[OURS], packed[OURS], strict=True)):.2f} s"
        f"; host `tar c` {statistics.median(packed[TAR]):.2f} s + emptying and `tar x` "
        f"{statistics.median(a - p for a, p in zip(rows[TAR], packed[TAR], strict=True)):.2f} s.",
        "",
        "Per round (s), ours / tar: "
        + ", ".join(f"{o:.2f}/{t:.2f}" for o, t in zip(rows[OURS], rows[TAR], strict=True))
        + f". Load average over the run: {load:.1f} on {os.cpu_count()} CPUs.",
        "",
        f"Resume into a new environment (spawn_runtime(resume=...)): median "
        f"{statistics.median(resume):.2f} s, against {statistics.median(cold):.2f} s for a "
        f"cold spawn of the same file.",
        "",
    ]
    report("snapshot", lines)


if __name__ == "__main__":
    main()
