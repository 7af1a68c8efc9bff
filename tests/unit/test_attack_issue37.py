"""Hostile review of issue 37 without an engine: what a path the file chooses can make the
host read or hand over (links, FIFOs), and the pin's walk (backends/container/binds.py)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from orchestrator import PolicyError, load_environment
from orchestrator.backends.container import seccomp
from orchestrator.backends.container.binds import PinRefused, Pins, closed_to_others, open_exact
from orchestrator.backends.container.copyin import static_archive
from tests.conftest import bounded


def test_copied_static_assets_never_read_through_a_link_or_open_a_fifo(tmp_path: Path) -> None:
    """On an engine that may be another machine the static assets are copied in: a link in
    an asset folder (`key -> /etc/shadow`) was read through as root and its target shipped
    to the sandbox, and a FIFO there would hold the start. A link goes as a link now, and
    what is neither a file, a folder nor a link stays behind."""
    assets = tmp_path / "assets"
    (assets / "sub").mkdir(parents=True)
    (assets / "sub" / "f").write_text("mine")
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (assets / "key").symlink_to(secret)
    os.mkfifo(assets / "fifo")
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        "version: 1\nname: sa\nimage: x\nstatic_assets: [{name: a, path: assets, save_path: a}]\n"
    )
    outcome, _ = bounded(lambda: static_archive(load_environment(env_file)), 10)
    assert isinstance(outcome, bytes), outcome
    with tarfile.open(fileobj=io.BytesIO(outcome)) as archive:
        members = {m.name: m for m in archive}
    assert members["static/a/key"].issym() and members["static/a/key"].linkname == str(secret)
    assert "static/a/fifo" not in members
    payload = outcome.decode("latin-1")
    assert "host secret" not in payload and "mine" in payload


def test_a_static_asset_swapped_for_a_link_is_not_copied(tmp_path: Path) -> None:
    """The asset's own path, swapped for a link after the spec was checked, is checked again
    where it is read: a secret folder is refused, never copied."""
    (tmp_path / "assets").mkdir()
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        "version: 1\nname: sa\nimage: x\nstatic_assets: [{name: a, path: assets, save_path: a}]\n"
    )
    env = load_environment(env_file)
    (tmp_path / "assets").rename(tmp_path / "away")
    (tmp_path / "assets").symlink_to("/etc")
    with pytest.raises(PolicyError, match="no sandbox may see"):
        static_archive(env)


def test_the_pin_walk_follows_no_link_anywhere(tmp_path: Path) -> None:
    """A link at any component of a checked path refuses the pin (it was resolved before:
    one there now was put there since)."""
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    fd = open_exact(tmp_path / "real" / "inner")
    os.close(fd)
    for path in (tmp_path / "link" / "inner", tmp_path / "link"):
        with pytest.raises(PinRefused, match="a link now"):
            Pins(tmp_path / "pins").pin(path, writable=False)


def test_a_pinned_file_is_the_inode_checked(tmp_path: Path) -> None:
    """A file's pin is a link to (or copy of) the file that was there when it was pinned;
    what the path names later does not change it."""
    source = tmp_path / "conf"
    source.write_text("checked\n")
    with Pins(tmp_path / "pins") as pins:
        pinned = pins.pin(source, writable=False)
        source.rename(tmp_path / "away")
        source.symlink_to("/etc/passwd")
        assert not pinned.folder
        assert Path(pinned.device).read_text() == "checked\n"
    assert oct(Path(pinned.device).stat().st_mode & 0o777) in ("0o444", "0o644")


def test_a_folder_reachable_by_others_is_told_apart(tmp_path: Path) -> None:
    """gVisor's rule: a folder a sandbox writes needs a folder above it closed to others."""
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    for folder in (tmp_path, tmp_path / "a", inner):
        folder.chmod(0o755)
    (tmp_path / "a").chmod(0o700)
    assert closed_to_others(inner) == tmp_path / "a"
    (tmp_path / "a").chmod(0o711)
    above = closed_to_others(inner)
    assert above is None or tmp_path.is_relative_to(above)


def test_the_profile_filters_every_call_that_sets_a_set_id_bit() -> None:
    """Each call that takes a mode is allowed only with the bits clear (or, open/openat,
    without O_CREAT); the calls a filter cannot read are ENOSYS; nothing else of the mode
    family is allowed unconditionally."""
    profile = seccomp.profile()
    plain = set(profile["syscalls"][0]["names"])
    assert not plain & {*seccomp.MODE_ARG, *seccomp.UNAVAILABLE}
    for name, index in seccomp.MODE_ARG.items():
        rules = [r for r in profile["syscalls"] if name in r["names"]]
        assert rules and all(r.get("args") for r in rules), name
        assert any(a["index"] == index and a["value"] == 0o6000 for r in rules for a in r["args"])
    denied = [r for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ERRNO"]
    assert any(set(seccomp.UNAVAILABLE) <= set(r["names"]) for r in denied)
    assert "clone3" in {n for r in denied for n in r["names"]}
