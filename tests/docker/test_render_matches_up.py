"""`render` renders what `up` runs (issue 21, item 3): the same mounts, relative ones resolved
against the environment file's folder whatever the working folder, and the same workspace
choice: without --workspace a private folder in the project folder (the rendering says its
path is a stand-in), with one that folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests.conftest import BUSYBOX_IMAGE


def _load_yaml(text: str) -> Any:
    return YAML(typ="safe").load(text)


CLI = [sys.executable, "-m", "orchestrator"]


def cli(*args: str, cwd: Path, roots: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHESTRATOR_ALLOWED_MOUNT_ROOTS": str(roots)}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=180, env=env
    )


def volumes(compose: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Target -> (source, read_only) of the main sandbox's mounts of host folders; a folder
    `up` pinned (a volume bound to the descriptor it checked) by the path it stands for."""
    pinned = {
        name: v["labels"]["org.orchestrator.source"]
        for name, v in (compose.get("volumes") or {}).items()
    }
    return {
        v["target"]: (pinned.get(v["source"], v["source"]), v["read_only"])
        for v in compose["services"]["main"]["volumes"]
        if not v["target"].startswith("/.orchestrator")
    }


def _up_compose(e4: Path, e1: Path, cwd: Path, *extra: str) -> dict[str, Any]:
    up = cli("up", str(e4 / "env.yaml"), *extra, cwd=cwd, roots=e1)
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        project = Path(os.environ["ORCHESTRATOR_STATE_DIR"]) / "projects" / ident
        compose: dict[str, Any] = _load_yaml((project / "compose.yaml").read_text())
        compose["x-folder"] = str(project)
        return compose
    finally:
        down = cli("down", ident, cwd=cwd, roots=e1)
        assert down.returncode == 0, down.stderr


def test_render_mounts_what_up_mounts(tmp_path: Path) -> None:
    e4, e1, elsewhere = tmp_path / "eval" / "e4", tmp_path / "eval" / "e1", tmp_path / "cwd"
    for folder in (e4 / "data", e1, elsewhere):
        folder.mkdir(parents=True)
    (e4 / "env.yaml").write_text(
        f"version: 1\nname: same\nimage: {BUSYBOX_IMAGE}\n"
        "mounts:\n"
        "  - {source: ../e1, target: /e1, read_only: true}\n"
        "  - {source: ./data, target: /data}\n"
    )
    rendered = cli("render", str(e4 / "env.yaml"), cwd=elsewhere, roots=e1)
    assert rendered.returncode == 0, rendered.stderr
    preview = volumes(_load_yaml(rendered.stdout))
    ran = _up_compose(e4, e1, elsewhere)
    running = volumes(ran)
    # the file's mounts: the same host folders, resolved against the file's folder
    assert preview["/e1"] == running["/e1"] == (str(e1), True)
    assert preview["/data"] == running["/data"] == (str(e4 / "data"), False)
    # the workspace: up's private one in its project folder; render's stands in for it
    assert running["/workspace"] == (ran["x-folder"] + "/workspace", False)
    stand_in, _ = preview["/workspace"]
    assert stand_in.endswith("/orch-same-preview/workspace")
    assert Path(stand_in).parent.parent == Path(ran["x-folder"]).parent
    assert not stand_in.startswith(str(elsewhere))  # never the working folder
    assert "stand-in" in rendered.stdout.split("name:")[0]  # said above the project
    # with --workspace, render and up mount that same folder
    ws = tmp_path / "ws"
    given = cli("render", str(e4 / "env.yaml"), "-w", str(ws), cwd=elsewhere, roots=e1)
    assert given.returncode == 0, given.stderr
    assert "stand-in" not in given.stdout
    ran_given = volumes(_up_compose(e4, e1, elsewhere, "-w", str(ws)))
    assert volumes(_load_yaml(given.stdout)) == ran_given
    assert ran_given["/workspace"] == (str(ws), False)
