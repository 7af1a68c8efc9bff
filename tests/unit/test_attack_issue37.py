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
from orchestrator.backends.container.archives import static_archive
from orchestrator.backends.container.binds import (
    PinRefused,
    Pins,
    closed_to_others,
    is_pinned_volume,
    open_exact,
)
from orchestrator.backends.docker.buildcheck import Budget, private_context, problems
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


BYPASSES = {
    "quoted": 'ADD "http://127.0.0.1:9/x" /x',
    "an ARG": "ARG U=http://127.0.0.1:9/\nADD $U /x",
    "an ENV": "ENV U=http://127.0.0.1:9/\nADD ${U} /x",
    "an escape in the scheme": "ADD h\\ttp://127.0.0.1:9/ /x",
    "ONBUILD": "ONBUILD ADD http://127.0.0.1:9/ /x",
    "a keyword split over lines": "AD\\\nD http://127.0.0.1:9/ /x",
    "a directive after an unknown one": "RUN echo \\\nADD http://127.0.0.1:9/ /x",
    "a no-break space after the escape": "RUN echo \\\u00a0\nADD http://127.0.0.1:9/ /x",
    "git": "ADD git@127.0.0.1:repo.git /x",
    "a checksum": "ADD --checksum=sha256:0 data /x",
    "JSON": 'ADD ["http://127.0.0.1:9/", "/x"]',
}


@pytest.mark.parametrize("body", BYPASSES.values(), ids=BYPASSES.keys())
def test_every_way_to_make_the_engine_fetch_is_refused(body: str) -> None:
    """The review's bypasses of the Dockerfile check (issue 37, item 4): each made the engine
    fetch http://127.0.0.1:PORT/ past `egress: none`. Every reading of the file is checked
    now, and ADD takes only plain paths of the context."""
    text = f"# x=y\n# escape=`\n\ufeffFROM orchestrator-test/busybox:1\n{body}\n"
    found, _ = problems(text, {})
    assert found, body
    plain, _ = problems("FROM orchestrator-test/busybox:1\nADD data.txt sub/ /x/\n", {})
    assert plain == []


def test_from_a_number_is_an_image_and_stages_are_names() -> None:
    """`FROM 0` is the image `0` (a pull), not a stage: only COPY --from takes indexes."""
    _, images = problems("FROM 0\nFROM base AS one\nFROM one\nCOPY --from=0 /a /b\n", {})
    assert images == ["0", "base"]


def test_a_context_file_swapped_for_a_fifo_does_not_hold_the_copy(tmp_path: Path) -> None:
    """Review item 4: the copy opened a file found by its descriptor blocking, before looking
    at its type: a FIFO swapped in held the start forever. Refused at once now."""
    fifo = tmp_path / "Dockerfile"
    os.mkfifo(fifo)
    (tmp_path / "ctx").mkdir()
    (tmp_path / "out").mkdir()
    outcome, took = bounded(
        lambda: private_context(tmp_path / "ctx", fifo, tmp_path / "out", Budget(1 << 20, 10)),
        10,
    )
    assert isinstance(outcome, ValueError) and took < 5, outcome


def test_a_context_larger_than_its_bound_is_refused_before_it_is_copied(tmp_path: Path) -> None:
    """Review item 5: a 4 GiB sparse file was copied whole into the state folder."""
    (tmp_path / "ctx").mkdir()
    with open(tmp_path / "ctx" / "sparse", "wb") as f:
        f.truncate(4 << 30)
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="larger than"):
        private_context(
            tmp_path / "ctx", tmp_path / "Dockerfile", tmp_path / "out", Budget(1 << 20, 10)
        )
    assert sum(f.stat().st_size for f in (tmp_path / "out").rglob("*") if f.is_file()) < 1 << 20


def test_a_files_volume_never_passes_for_a_pinned_folder() -> None:
    """Review item 7: a file's volume `data__pin0` passed for a pinned folder, and suspend
    dropped its data silently. Pinned ones are upper-case, which a file's never are."""
    assert is_pinned_volume("orch-x-1234abcd__PIN0")
    assert not is_pinned_volume("orch-x-1234abcd_data__pin0")
    assert not is_pinned_volume("orch-x-1234abcd_data__PIN0x")
