"""Removing a checkpoint's memory image (snapshot.remove_files): never through a link, and
never failing on what a folder of plain files should not hold."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.sandbox.snapshot import remove_files


def test_a_link_in_place_of_the_folder_goes_and_what_it_names_stays(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    link = tmp_path / "x.memory"
    link.symlink_to(victim)
    remove_files(link)
    assert not link.is_symlink() and (victim / "keep").read_text() == "mine"


def test_files_links_and_fifos_go_a_folder_in_it_stays_and_nothing_raises(tmp_path: Path) -> None:
    folder = tmp_path / "x.memory"
    folder.mkdir()
    (folder / "checkpoint.img").write_bytes(b"x")
    os.mkfifo(folder / "fifo")
    outside = tmp_path / "outside"
    outside.write_text("mine")
    (folder / "link").symlink_to(outside)
    (folder / "sub").mkdir()
    remove_files(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["sub"]
    assert outside.read_text() == "mine"
    remove_files(tmp_path / "absent")  # gone already: fine
