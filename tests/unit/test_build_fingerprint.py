"""The fingerprint a build is tagged by (issue 21, item 1): it changes with the Dockerfile,
the args and any entry of the context, and a hostile context cannot make it read outside
the context, open a FIFO or a device, or run without bound. The builder's lines are made
safe to print; off a terminal the CLI copies them plain to stderr (item 10)."""

from __future__ import annotations

import io
import logging
import os
import time
from pathlib import Path

import pytest

from orchestrator.backends.docker import fingerprint as fp
from orchestrator.backends.docker.build import clean_line
from orchestrator.cli.progress import BUILD_LOG, build_progress


def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "sub").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM scratch\n")
    (ctx / "sub" / "a.txt").write_text("a\n")
    return ctx


def digest(ctx: Path, dockerfile: str | None = None, **args: str) -> tuple[str, bool]:
    return fp.fingerprint(ctx, dockerfile, args)


def test_each_input_changes_it_and_nothing_else_does(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    first, complete = digest(ctx)
    assert complete and digest(ctx) == (first, True)
    (ctx / "Dockerfile").write_text("FROM scratch\nENV A=1\n")
    second = digest(ctx)[0]
    assert second != first
    (ctx / "sub" / "a.txt").write_text("b\n")  # same size: its time tells
    os.utime(ctx / "sub" / "a.txt", ns=(1, 1))
    third = digest(ctx)[0]
    assert third != second
    assert digest(ctx, X="1")[0] not in (third, digest(ctx, X="2")[0])
    (ctx / "sub" / "a.txt").chmod(0o600)
    assert digest(ctx)[0] != third
    (ctx / "new").write_text("")
    assert digest(ctx)[0] not in (first, second, third)


def test_symlinks_are_hashed_as_links_never_followed(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    secret = outside / "secret"
    secret.write_text("one")
    (ctx / "file-link").symlink_to(secret)
    (ctx / "dir-link").symlink_to(outside)
    before = digest(ctx)
    secret.write_text("two, longer")  # what the links point to changes: not seen here
    (outside / "deep" / "x").write_text("x")
    assert digest(ctx) == before
    (ctx / "file-link").unlink()
    (ctx / "file-link").symlink_to(outside / "deep")  # the link itself changes: seen
    assert digest(ctx) != before


def test_a_linked_dockerfile_is_read_where_the_builder_reads_it(tmp_path: Path) -> None:
    """The builder follows links to the Dockerfile (the policy has checked where they lead):
    an edit there must make a new tag, or the old image runs."""
    ctx = context(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (ctx / "via").symlink_to(outside)
    (ctx / "real").mkdir()

    def same_size_same_time(path: Path, text: str, name: str) -> str:
        path.write_text(text)
        os.utime(path, ns=(0, 0))
        for folder in (ctx, ctx / "real"):  # the context's own times stay too
            os.utime(folder, ns=(0, 0))
        return digest(ctx, name)[0]

    linked = outside / "Dockerfile"
    assert same_size_same_time(linked, "FROM one\n", "via/Dockerfile") != same_size_same_time(
        linked, "FROM two\n", "via/Dockerfile"
    )  # through a linked folder
    plain = ctx / "real" / "Dockerfile"
    assert same_size_same_time(plain, "FROM one\n", "real/Dockerfile") != same_size_same_time(
        plain, "FROM two\n", "real/Dockerfile"
    )  # and in the context itself


def test_fifos_and_devices_are_never_opened(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    (ctx / "Dockerfile").unlink()
    os.mkfifo(ctx / "Dockerfile")  # opening it to read would wait for a writer
    os.mkfifo(ctx / "sub" / "pipe")
    (ctx / "zero").symlink_to("/dev/zero")
    (ctx / "tty").symlink_to("/dev/tty")
    started = time.monotonic()
    found, complete = digest(ctx)
    assert complete and found
    assert time.monotonic() - started < 2
    assert fp.read_regular(ctx / "Dockerfile", 100) is None
    assert fp.read_regular(Path("/dev/zero"), 100) is None


def test_a_context_too_large_or_too_slow_is_left_to_the_engine(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    for i in range(50):
        (ctx / f"f{i}").write_text("")
    whole, complete = fp.fingerprint(ctx, None, {}, files=20)
    assert not complete
    (ctx / "f1").write_text("changed")  # not seen: the engine's cache decides
    assert fp.fingerprint(ctx, None, {}, files=20) == (whole, False)
    (ctx / "Dockerfile").write_text("FROM other\n")  # the Dockerfile still is
    assert fp.fingerprint(ctx, None, {}, files=20)[0] != whole
    assert not fp.fingerprint(ctx, None, {}, seconds=0.0)[1]


def test_a_context_that_is_not_a_folder_is_not_walked(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    (tmp_path / "link").symlink_to(ctx)
    assert fp.walk_context(tmp_path / "link") is None
    assert fp.walk_context(ctx / "Dockerfile") is None
    assert fp.walk_context(tmp_path / "missing") is None


def test_builder_lines_lose_escapes_and_controls_and_are_bounded() -> None:
    raw = b"ok \x1b[31mred\x1b[0m \x1b]0;title\x07done\x08\x00 \xff"
    assert clean_line(raw) == "ok red done \ufffd"
    assert len(clean_line(b"x" * 100_000)) == 500


def test_off_a_terminal_builder_lines_go_plain_to_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    logger = logging.getLogger(BUILD_LOG)
    with build_progress("preparing x"):
        logger.info("Step 1/2 : FROM scratch")
    logger.info("after the display: not shown")
    assert err.getvalue() == "Step 1/2 : FROM scratch\n"
    assert logger.propagate and not logger.handlers
