"""Which environment an id names, and which project folders are abandoned (no Docker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.backends.container.identity import OWNER_FILE, claim_folder, orphan_folders
from orchestrator.backends.container.inventory import match_project
from orchestrator.errors import ProjectNotFound

NAMES = ["orch-python-1a2b3c4d", "orch-python-5e6f7a8b", "orch-web-0011aabb"]


@pytest.mark.parametrize(
    ("ref", "name"),
    [
        ("orch-web-0011aabb", "orch-web-0011aabb"),
        ("5e6f7a8b", "orch-python-5e6f7a8b"),
        ("orch-web", "orch-web-0011aabb"),
        ("orch-python-1a", "orch-python-1a2b3c4d"),
    ],
)
def test_ids_name_exactly_one_environment(ref: str, name: str) -> None:
    assert match_project(ref, NAMES) == name


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("o", "at least 6"),  # once matched every id containing an "o"
        ("aabb", "at least 6"),  # suffixes other than the whole short id do not count
        ("python", "no environment"),
        ("orch-python", "matches several"),
        ("", "no environment"),
    ],
)
def test_loose_or_ambiguous_ids_are_refused(ref: str, needle: str) -> None:
    with pytest.raises(ProjectNotFound, match=needle):
        match_project(ref, NAMES)


def test_orphan_folders_are_those_of_dead_creators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path))
    projects = tmp_path / "projects"
    mine, running, dead = projects / "mine", projects / "running", projects / "dead"
    claim_folder(mine)
    claim_folder(running)
    code = (
        "import sys; from pathlib import Path; "
        "from orchestrator.backends.container.identity import claim_folder; "
        "claim_folder(Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", code, str(dead)], check=True)
    assert sorted(f.name for f in orphan_folders({"running"})) == ["dead"]
    old = projects / "no-owner-file"
    old.mkdir()
    assert "no-owner-file" not in [f.name for f in orphan_folders(set())]  # may be starting
    os.utime(old, (0, 0))
    assert "no-owner-file" in [f.name for f in orphan_folders(set())]
    assert (mine / OWNER_FILE).read_text().split()[0] == str(os.getpid())
