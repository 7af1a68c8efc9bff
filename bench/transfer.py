"""`python -m bench.transfer` (part of `just bench`): a folder tree into and out of a sandbox,
`rt.upload`/`rt.download` (one tar stream, through a FIFO in the sandbox folder) side by side
with `docker cp` and `docker compose cp`, in alternating rounds; then a folder of one small
file. Writes bench/results/transfer.md."""

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

from bench.measure import compose_argv, report, timed
from orchestrator import load_environment_text, spawn_runtime
from orchestrator.backends.docker.runtime import ComposeRuntime

ENV = "version: 1\nname: transfer\nimage: orchestrator-test/python:3.11\nuser: root\n"


def make_tree(root: Path, megabytes: int, files: int) -> None:
    size = megabytes * 1024 * 1024 // files
    for i in range(files):
        path = root / f"d{i % 20}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small-rounds", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-transfer-"))
    tree = work / "tree"
    make_tree(tree, args.megabytes, args.files)
    rows: dict[str, list[float]] = {}
    with spawn_runtime(load_environment_text(ENV), disable_setup=True) as rt:
        assert isinstance(rt, ComposeRuntime) and rt.project is not None
        container, project = rt.project.main_container, rt.project
        compose = compose_argv(project)

        rt.upload(tree, "/tmp/src")  # what the downloads read

        def paths(n: int) -> dict[str, Callable[[], object]]:
            """Each run writes a new folder: nothing is deleted while the rounds run, so no
            path pays for the file system reclaiming what another path removed."""
            down = work / f"round-{n}"
            down.mkdir()
            return {
                "upload: orchestrator rt.upload": lambda: rt.upload(tree, f"/tmp/up-o-{n}"),
                "upload: docker cp": lambda: subprocess.run(
                    ["docker", "cp", f"{tree}/.", f"{container}:/tmp/up-d-{n}"], check=True
                ),
                "upload: docker compose cp": lambda: subprocess.run(
                    [*compose, "cp", f"{tree}/.", f"main:/tmp/up-c-{n}"],
                    check=True,
                    capture_output=True,
                ),
                "download: orchestrator rt.download": lambda: rt.download(
                    "/tmp/src", down / "o", limit=4 * args.megabytes * 1024 * 1024
                ),
                "download: docker cp": lambda: subprocess.run(
                    ["docker", "cp", f"{container}:/tmp/src/.", str(down / "d")], check=True
                ),
                "download: docker compose cp": lambda: subprocess.run(
                    [*compose, "cp", "main:/tmp/src/.", str(down / "c")],
                    check=True,
                    capture_output=True,
                ),
            }

        for n in range(args.rounds):  # alternate, so drift on a shared machine hits all alike
            for name, fn in paths(n).items():
                rows.setdefault(name, []).extend(timed(name, fn, 1, warmup=0).times)
            counts = {len(list((work / f"round-{n}" / way).rglob("*"))) for way in "odc"}
            assert counts == {args.files + 20}, f"the downloads differ: {counts}"
        small = work / "small"
        small.mkdir()
        (small / "result.json").write_text('{"passed": true}\n')
        few: dict[str, list[float]] = {}

        def small_paths(n: int) -> dict[str, Callable[[], object]]:
            return {
                "upload: orchestrator rt.upload": lambda: rt.upload(small, f"/tmp/s-o-{n}"),
                "upload: docker cp": lambda: subprocess.run(
                    ["docker", "cp", f"{small}/.", f"{container}:/tmp/s-d-{n}"], check=True
                ),
                "download: orchestrator rt.download": lambda: rt.download(
                    f"/tmp/s-o-{n}", work / f"small-o-{n}"
                ),
                "download: docker cp": lambda: subprocess.run(
                    ["docker", "cp", f"{container}:/tmp/s-d-{n}/.", str(work / f"small-d-{n}")],
                    check=True,
                ),
            }

        for n in range(args.small_rounds):  # a harness's usual folder: one small file
            for name, fn in small_paths(n).items():
                few.setdefault(name, []).extend(timed(name, fn, 1, warmup=0).times)
    shutil.rmtree(work, ignore_errors=True)
    med = {name: statistics.median(times) for name, times in rows.items()}
    lines = [
        "# Folder transfer",
        "",
        f"A tree of {args.files} files, {args.megabytes} MB in all, into and out of a Docker "
        f"sandbox; median of {args.rounds} alternating rounds, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| path | median s | × docker cp |",
        "|---|---:|---:|",
    ]
    for name, value in med.items():
        way = name.split(":")[0]
        lines.append(f"| {name} | {value:.2f} | {value / med[f'{way}: docker cp']:.2f} |")
    small_med = {name: statistics.median(times) for name, times in few.items()}
    lines += [
        "",
        f"A folder of one small file, median of {args.small_rounds} alternating rounds (what "
        "a harness moves per sample: the command's start-up is most of it).",
        "",
        "| path | median ms | × docker cp |",
        "|---|---:|---:|",
    ]
    for name, value in small_med.items():
        ratio = value / small_med[f"{name.split(':')[0]}: docker cp"]
        lines.append(f"| {name} | {value * 1000:.1f} | {ratio:.2f} |")
    report("transfer", lines)


if __name__ == "__main__":
    main()
