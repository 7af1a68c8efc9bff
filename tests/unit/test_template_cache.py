"""Compiled templates kept in the state folder (backends/container/templating.py): a CLI
process takes them instead of compiling again; they are read only from this user's private
folder, never through a link, and one that is cut short, planted, or from another release
or set of options is compiled again, never trusted."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest

from orchestrator.backends.container import templating

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="another user's folder needs root")
SAMPLE = {"text": "x"}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "state"
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(path))
    templating.jinja.cache_clear()
    yield path
    templating.jinja.cache_clear()


def _fresh() -> jinja2.Environment:
    """The environment a new process would make."""
    templating.jinja.cache_clear()
    return templating.jinja()


def _entry(env: jinja2.Environment) -> str:
    context = {"project": "p", "ca": None, "bundle": "", "keep_alive": "sleep 1"}
    return env.get_template("entry.sh.j2").render(context)


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names compiled from their source from now on."""
    seen: list[str] = []
    original = jinja2.Environment.compile

    def compile_(self: jinja2.Environment, source: str, name: str | None = None, *a: object,
                 **k: object) -> object:  # fmt: skip
        seen.append(str(name))
        return original(self, source, name, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(jinja2.Environment, "compile", compile_)
    return seen


def test_a_new_process_takes_the_compiled_template(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _entry(_fresh())
    folder = state / "cache" / "templates"
    files = list(folder.iterdir())
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    compiled = _compiles(monkeypatch)
    assert _entry(_fresh()) == first and compiled == []


@pytest.mark.parametrize("damage", ["cut-short", "garbage", "a-link", "a-fifo", "too-large"])
def test_a_damaged_or_planted_cache_file_is_compiled_again(
    state: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, damage: str
) -> None:
    first = _entry(_fresh())
    (cached,) = (state / "cache" / "templates").iterdir()
    good = cached.read_bytes()
    cached.unlink()
    if damage == "cut-short":
        cached.write_bytes(good[: len(good) // 2])
    elif damage == "garbage":
        cached.write_bytes(os.urandom(len(good)))
    elif damage == "a-link":  # to a file that would pass: never followed
        (tmp_path / "elsewhere").write_bytes(good)
        cached.symlink_to(tmp_path / "elsewhere")
    elif damage == "a-fifo":  # never opened for reading (it would hold the render)
        os.mkfifo(cached)
    else:
        cached.write_bytes(good + b"\0" * templating.CACHE_LIMIT)
    compiled = _compiles(monkeypatch)
    assert _entry(_fresh()) == first
    assert compiled == ["entry.sh.j2"]


def test_another_release_or_other_options_compile_their_own(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _entry(_fresh())
    monkeypatch.setattr(templating, "OPTIONS", templating.OPTIONS + " changed")
    compiled = _compiles(monkeypatch)
    _entry(_fresh())
    assert compiled == ["entry.sh.j2"]
    assert len(list((state / "cache" / "templates").iterdir())) == 2


@ROOT_ONLY
def test_a_cache_folder_someone_else_made_is_neither_read_nor_written(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = state / "cache" / "templates"
    folder.mkdir(parents=True, mode=0o777)
    os.chmod(folder, 0o777)
    os.chown(folder, 65534, 65534)
    compiled = _compiles(monkeypatch)
    assert _entry(_fresh()).endswith("sleep 1\n")
    assert compiled == ["entry.sh.j2"] and os.listdir(folder) == []
