"""The endpoint's reading of `orchestrator exec` (orchestrator/endpoint.py) against the full
CLI's: whatever the endpoint takes, it reads as the full CLI does; the rest it leaves to the
full CLI. And its state folder is the settings' one."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import endpoint, settings
from orchestrator.cli.exec_cmds import _argv, _exec_words

WORDS = st.sampled_from(
    ["--", "--timeout", "--timeout=2", "3", "-i", "-t", "--service", "side", "-u", "echo",
     "hi", "sh", "-c", "exit 3", "main", "", "-", "--tty", "1e9", "nan", "0", "-1"]
)  # fmt: skip


def full_reading(words: list[str]) -> tuple[object, float | None, bool] | None:
    """What the full CLI runs for `exec ID WORDS` (None: it refuses or takes options the
    endpoint does not)."""
    try:
        given_, rest = _exec_words(words)
        argv = _argv(rest)
    except Exception:
        return None
    if set(given_) - {"timeout", "interactive"}:
        return None
    timeout = float(given_["timeout"]) if "timeout" in given_ else None
    if timeout is not None and not 0 < timeout < float("inf"):
        return None
    if len(rest) >= 2 and rest[1] == "--":
        return None
    shell = ["/bin/sh", "-c", argv] if isinstance(argv, str) else argv
    return shell, timeout, "interactive" in given_


@given(st.lists(WORDS, max_size=6))
def test_what_the_endpoint_takes_it_reads_as_the_full_cli(words: list[str]) -> None:
    try:
        call = endpoint.parse(["exec", "orch-x-0011aabb", *words])
    except endpoint.NotHere:
        return
    assert full_reading(words) == (call.argv, call.timeout, call.interactive)


@pytest.mark.parametrize(
    ("args", "taken"),
    [
        (["exec", "-i", "orch-a", "--", "cat"], True),
        (["exec", "--interactive", "orch-a", "cat"], True),
        (["exec", "-t", "orch-a", "--", "sh"], True),
        (["exec", "-it", "orch-a", "--", "sh"], True),
        (["exec", "-ti", "--tty", "orch-a", "--", "sh"], True),
        (["exec", "orch-a", "--service", "side", "--", "true"], False),
        (["exec", "orch-a", "side", "--", "true"], False),
        (["exec", "orch-a", "--timeout", "x", "--", "true"], False),
        (["exec", "orch-a"], False),
        (["ps"], False),
        (["--host", "h", "exec", "orch-a", "--", "true"], False),
    ],
)
def test_what_it_leaves_to_the_full_cli(args: list[str], taken: bool) -> None:
    try:
        call = endpoint.parse(args)
    except endpoint.NotHere:
        assert not taken
        return
    assert taken and (call.interactive or call.tty)
    assert call.tty == any(w in ("-t", "-it", "-ti", "--tty") for w in args)


@pytest.mark.parametrize(
    ("state", "xdg", "home"),
    [
        (None, None, "/home/u"),
        (None, "/x/state", "/home/u"),
        (None, "relative/state", "/home/u"),
        ("~/st", None, "/home/u"),
        ("/abs/st", "/x/state", "/home/u"),
        (None, "", "/home/u"),
        (None, "~/state", "/home/u"),
        (None, "/x/state", "relative-home"),
        (None, None, "relative-home"),
        (None, None, "/home/u/"),
    ],
)
def test_its_state_folder_is_the_settings_one(
    monkeypatch: pytest.MonkeyPatch, state: str | None, xdg: str | None, home: str
) -> None:
    for name, value in (("ORCHESTRATOR_STATE_DIR", state), ("XDG_STATE_HOME", xdg)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", home)
    try:
        mine = endpoint.state_dir()
    except endpoint.NotHere:  # (a rule it leaves to the full CLI: never a different folder)
        assert not home.startswith("/")
        return
    assert Path(mine) == settings.STATE_DIR.get()


def test_a_folder_others_may_change_is_not_taken(tmp_path: Path) -> None:
    """As the full CLI holds its state folder (paths.private_folder): the endpoint takes no
    folder, record or socket that another user could have put there."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    endpoint._ours(str(folder), stat.S_IFDIR)
    folder.chmod(0o777)
    with pytest.raises(endpoint.NotHere):
        endpoint._ours(str(folder), stat.S_IFDIR)
    folder.chmod(0o700)
    (tmp_path / "link").symlink_to(folder)
    with pytest.raises(endpoint.NotHere):
        endpoint._ours(str(tmp_path / "link"), stat.S_IFDIR)


@pytest.mark.parametrize(
    ("xdg", "home"),
    [
        (None, "/home/u"),
        ("/x/state", "/home/u"),
        ("/x/state/", "relative-home"),
        ("relative/state", "/home/u"),
        ("", "/home/u"),
        ("   ", "/home/u"),
        ("~/state", "/home/u"),
        (None, "/home/u/"),
        (None, "relative-home"),
        (None, ""),
    ],
)
def test_the_state_folders_rule_written_out_is_platformdirs_own(
    monkeypatch: pytest.MonkeyPatch, xdg: str | None, home: str
) -> None:
    """settings' default state folder, written out for the plain cases (loading platformdirs
    costs each `ps`), is the one platformdirs' Unix rule gives, in every case."""
    from platformdirs.unix import Unix

    monkeypatch.delenv("ORCHESTRATOR_STATE_DIR", raising=False)
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    monkeypatch.setenv("HOME", home)
    assert settings.STATE_DIR.get() == Path(Unix("orchestrator").user_state_dir)
