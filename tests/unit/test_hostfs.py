"""A host-side reader of a sandbox's workspace (a grader) never follows a link out of it,
and what a root sandbox leaves there is made harmless once it ends."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator import OutputLimitExceeded, SandboxPermissionError
from orchestrator.sandbox import hostfs


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "secret").write_text("host secret\n")
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "answer.txt").write_text("42\n")
    return ws


def test_reads_a_plain_file(workspace: Path) -> None:
    assert hostfs.read_inside(workspace, "sub/answer.txt") == b"42\n"


@pytest.mark.parametrize(
    "plant",
    [
        lambda ws: (ws / "answer.txt").symlink_to(ws.parent / "secret"),  # the file a link
        lambda ws: (ws / "answer.txt").symlink_to("sub/answer.txt"),  # even one inside
        lambda ws: (ws / "up").symlink_to(ws.parent) or None,  # a folder on the way a link
        lambda ws: os.mkfifo(ws / "answer.txt"),  # would block a reader forever
    ],
)
def test_a_link_or_fifo_planted_by_the_sandbox_is_refused(workspace: Path, plant: object) -> None:
    plant(workspace)  # type: ignore[operator]
    name = "up/secret" if (workspace / "up").exists() else "answer.txt"
    with pytest.raises(SandboxPermissionError):
        hostfs.read_inside(workspace, name)


@pytest.mark.parametrize("name", ["../secret", "/etc/passwd", "sub/../../secret", ""])
def test_names_that_leave_the_workspace_are_refused(workspace: Path, name: str) -> None:
    with pytest.raises((SandboxPermissionError, ValueError)):
        hostfs.read_inside(workspace, name)


def test_a_file_over_the_limit_is_refused(workspace: Path) -> None:
    with pytest.raises(OutputLimitExceeded):
        hostfs.read_inside(workspace, "sub/answer.txt", limit=2)


def test_defuse_clears_setuid_bits_and_follows_no_link(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside-suid"
    outside.write_text("x")
    outside.chmod(0o4755)
    (workspace / "run").write_text("#!/bin/sh\n")
    (workspace / "run").chmod(0o6755)
    (workspace / "link").symlink_to(outside)
    assert hostfs.defuse(workspace) == ["run"]
    assert stat.S_IMODE((workspace / "run").stat().st_mode) == 0o755
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755  # not ours: the link was not followed
