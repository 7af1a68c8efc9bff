"""The loader: strict schema, errors with file:line:column and a fix, versions, migration."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import SpecError, load_environment, load_environment_text
from orchestrator.spec.loader import migrated_yaml

BASE = "version: 1\nname: t\nimage: img:1\n"


def issues(text: str, tmp_path: Path | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_environment_text(text, source="env.yaml", base_dir=tmp_path)
    return [str(i) for i in info.value.issues]


def test_minimal_file_gets_documented_defaults() -> None:
    env = load_environment_text(BASE)
    spec = env.spec
    assert (spec.backend, spec.workdir, spec.user, spec.network.mode) == (
        "docker",
        "/workspace",
        "host",
        "bridge",
    )
    assert spec.network.egress_setting() == "none" and spec.workspace.mount is True


def test_unknown_key_names_line_and_suggests() -> None:
    [msg] = issues(BASE + "workdri: /x\n")
    assert msg.startswith("env.yaml:4:1: workdri: unknown key")
    assert "did you mean 'workdir'" in msg


def test_nested_unknown_key_in_service() -> None:
    text = BASE + "services:\n  web:\n    image: b\n    helthcheck: {}\n"
    [msg] = issues(text)
    assert msg.startswith("env.yaml:7:5: services.web.helthcheck") and "'healthcheck'" in msg


def test_wrong_literal_lists_allowed_values() -> None:
    [msg] = issues(BASE + "network: {mode: bridged}\n")
    assert "env.yaml:4:17: network.mode" in msg and "'bridge', 'host' or 'none'" in msg


def test_several_issues_are_all_reported_in_line_order() -> None:
    found = issues(BASE + "user: no body\nresources: {cpus: -1}\n")
    assert (
        len(found) == 2 and found[0].startswith("env.yaml:4") and found[1].startswith("env.yaml:5")
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: t\nimage: i\n", "missing schema version"),
        ("version: 7\nname: t\nimage: i\n", "unknown schema version 7"),
        ("version: 1\nname: T!\nimage: i\n", "name"),
        ("version: 1\nname: t\nimage: i\nbuild: {}\n", "one of `image` or `build`, not both"),
        ("- a\n- b\n", "expected a mapping"),
        ("", "empty file"),
        ("version: 1\nname: [\n", "malformed YAML"),
        ("version: 1\nversion: 1\n", "duplicate key"),
        (BASE + "services: {main: {image: x}}\n", "`main` is the name"),
        (BASE + "env: {1BAD: x}\n", "env.1BAD"),
    ],
)
def test_bad_files(text: str, needle: str) -> None:
    assert any(needle in m for m in issues(text))


def test_numbers_in_env_become_text_but_booleans_do_not() -> None:
    assert load_environment_text(BASE + "env: {A: 1, B: 2.5}\n").spec.env == {"A": "1", "B": "2.5"}
    assert any("env.B" in m for m in issues(BASE + "env: {B: true}\n"))


def test_missing_asset_path_is_an_error(tmp_path: Path) -> None:
    text = BASE + "static_assets: [{name: t, path: nope, save_path: t}]\n"
    [msg] = issues(text, tmp_path)
    assert "env.yaml:4" in msg and "asset path does not exist" in msg


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_environment(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is a folder"):
        load_environment(tmp_path)


LEGACY = """\
type: docker
name: legacy-env
docker:
  image: img:1
  workdir: /work
  mount_workspace: true
  network: host
  extra_mounts: {/tmp/data: {bind: /data, mode: ro}}
environment:
  env: {A: b}
setup:
  eval_commands: [echo hi]
commands:
  command: uv run
"""


def test_legacy_format_migrates_with_a_notice(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(LEGACY)
    env = load_environment(path)
    spec = env.spec
    assert (spec.version, spec.image, spec.workdir, spec.network.mode) == (
        1,
        "img:1",
        "/work",
        "host",
    )
    assert spec.mounts[0].target == "/data" and spec.mounts[0].read_only
    assert spec.env == {"A": "b"} and spec.setup.eval_commands == ["echo hi"]
    assert spec.commands == {"command": "uv run"}
    assert any("legacy format" in n for n in env.notices)
    v1 = migrated_yaml(path)
    assert v1.startswith("version: 1\n")
    again = tmp_path / "new.yaml"
    again.write_text(v1)
    assert load_environment(again).spec == spec


def test_legacy_errors_point_at_the_legacy_key() -> None:
    text = LEGACY.replace("workdir: /work", "workdir: relative")
    [msg] = issues(text)
    assert msg.startswith("env.yaml:5:12: workdir")


def test_legacy_sections_without_a_v1_meaning_are_reported_not_dropped() -> None:
    text = "type: local\nname: l\nlocal:\n  shell: bash\ndocker:\n  image: i\n  gpus: all\n"
    found = issues(text)
    assert any(m.startswith("env.yaml:4:3: local.shell: unknown key") for m in found), found
    assert any(m.startswith("env.yaml:7:3: docker.gpus: unknown key") for m in found), found
    assert load_environment_text("type: local\nname: l\nlocal: {}\n").spec.backend == "local"


def test_static_placeholders_must_name_an_asset(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    text = (
        BASE + "static_assets: [{name: data, path: data, save_path: d}]\n"
        "setup: {commands: ['cat {{static:data}}/x', 'cat {{static:dta}}/x']}\n"
        "commands: {test: 'pytest {{ static:tests }}'}\n"
    )
    with pytest.raises(SpecError) as info:
        load_environment_text(text, source="env.yaml", base_dir=tmp_path)
    found = [str(i) for i in info.value.issues]
    assert len(found) == 2, found
    assert "setup.commands.1: {{static:dta}} names no static asset (known: data)" in found[0]
    assert "commands.test: {{ static:tests }} names no static asset" in found[1]


def test_digest_is_stable_and_sensitive() -> None:
    a = load_environment_text(BASE).digest
    assert a == load_environment_text(BASE).digest
    assert a != load_environment_text(BASE + "env: {X: y}\n").digest


def _bomb(levels: int) -> str:
    lines = [
        "version: 1",
        "name: bomb",
        "image: x",
        "commands:",
        "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]",
    ]
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"  {cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_quickly_and_in_little_memory() -> None:
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(SpecError, match="expands to more than"):
        load_environment_text(_bomb(9))  # 9**9 = 387 million values if expanded
    assert time.monotonic() - started < 2
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200


def test_a_few_aliases_are_fine() -> None:
    env = load_environment_text(
        "version: 1\nname: t\nimage: x\nenv: &e {A: '1'}\nservices: {db: {image: y, env: *e}}\n"
    )
    assert env.spec.services["db"].env == {"A": "1"}


def test_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    import time

    path = tmp_path / "big.yaml"
    path.write_text("version: 1\nname: t\nimage: x\nenv:\n" + "  K: v\n" * (10 * 1024 * 1024 // 7))
    started = time.monotonic()
    with pytest.raises(SpecError, match="over the limit"):
        load_environment(path)
    assert time.monotonic() - started < 2


def test_fifo_and_deep_nesting_are_clear_errors(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "env.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_environment(fifo)
    with pytest.raises(SpecError, match="malformed YAML"):
        load_environment_text("a: " + "[" * 5000 + "]" * 5000 + "\n")


@pytest.mark.parametrize("user", ["app", "app:staff", "1000", "1000:1000", "root", "host"])
def test_the_file_user_is_a_name_or_ids(user: str) -> None:
    assert load_environment_text(BASE + f"user: '{user}'\n").spec.user == user


@pytest.mark.parametrize("user", ["a b", ":1000", "-rf", "app:"])
def test_a_malformed_file_user_is_refused_at_its_line(user: str) -> None:
    [msg] = issues(BASE + f"user: '{user}'\n")
    assert msg.startswith("env.yaml:4:7: user")


@pytest.mark.parametrize("user", ["4294967295", "0:4294967295", "2147483648", "1:99999999999"])
def test_a_file_user_out_of_the_kernels_range_is_refused(user: str) -> None:
    """4294967295 is -1 to setuid and setgid ("leave it unchanged"): the commands of a file
    asking for it ran as root. Refused at its line, in the main sandbox and in a service."""
    [msg] = issues(BASE + f"user: '{user}'\n")
    assert msg.startswith("env.yaml:4:7: user") and "out of range" in msg
    service = f"services:\n  db:\n    image: i\n    user: '{user}'\n"
    [msg] = issues(BASE + service)
    assert msg.startswith("env.yaml:7:11: services.db.user") and "out of range" in msg


def test_the_largest_id_is_taken() -> None:
    user = "2147483647:2147483647"
    assert load_environment_text(BASE + f"user: '{user}'\n").spec.user == user


@pytest.mark.parametrize(
    ("text", "got"),
    [("- a\n- b\n", "a list"), ("hello\n", "a string"), ("3\n", "a number"), ("", "an empty file")],
)
def test_a_file_that_is_not_a_mapping_says_what_it_is(text: str, got: str) -> None:
    """In the file's words: "got a CommentedSeq" named the parser's class."""
    [msg] = issues(text)
    assert msg.startswith("env.yaml:1:1:")
    assert f"expected a mapping at the top, got {got}\n" in msg


def test_text_that_trips_the_yaml_parser_is_a_spec_error() -> None:
    [msg] = issues("-_")
    assert "malformed YAML" in msg


def test_the_digest_follows_the_templates_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No template version to bump by hand: a changed template changes every digest."""
    import shutil

    from orchestrator import _resources

    copy = tmp_path / "templates"
    shutil.copytree(_resources.data_dir("templates"), copy)
    monkeypatch.setattr(_resources, "data_dir", lambda name: copy)
    env = load_environment(Path(__file__).parents[2] / "environments" / "python.yaml")
    _resources.templates_version.cache_clear()
    before = env.digest
    (copy / "entry.sh.j2").write_text((copy / "entry.sh.j2").read_text() + "# changed\n")
    _resources.templates_version.cache_clear()
    try:
        assert env.digest != before
    finally:
        _resources.templates_version.cache_clear()
