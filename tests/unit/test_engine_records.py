"""Which engine a snapshot or suspend record names: one engine named two ways is one engine,
and a wake goes only to an engine the caller names (a record is a file anyone with access
to it can write)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import UsageError, settings
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.services.suspend import _wake_target
from orchestrator.spec.policy import Policy


def test_an_engine_named_two_ways_is_one_engine() -> None:
    assert settings.same_engine("", settings.DEFAULT_ENGINE)
    assert settings.same_engine(settings.DEFAULT_ENGINE, "")
    assert not settings.same_engine("", "unix:///run/podman/podman.sock")
    assert not settings.same_engine("tcp://a:2375", "tcp://b:2375")


def _record(tmp_path: Path, host: str) -> Snapshot:
    return Snapshot(tmp_path / "s.tar", "e", "d", "", 0, "img", host, "docker", suspended=True)


def test_a_record_of_the_default_socket_wakes_from_a_process_naming_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DOCKER_HOST", settings.DOCKER_HOST.name, settings.ENGINE.name):
        monkeypatch.delenv(name, raising=False)
    env = tmp_path / "env.yaml"
    env.write_text("version: 1\nname: e\nimage: busybox\n")
    _wake_target(_record(tmp_path, settings.DEFAULT_ENGINE), env, None, None, Policy())
    monkeypatch.setenv("DOCKER_HOST", "tcp://elsewhere.test:2375")  # another engine
    with pytest.raises(UsageError, match="its images are on the engine at unix://"):
        _wake_target(_record(tmp_path, settings.DEFAULT_ENGINE), env, None, None, Policy())
    with pytest.raises(UsageError, match="its images are on the engine at tcp://x"):
        _wake_target(_record(tmp_path, "tcp://x.test:2375"), env, None, None, Policy())
    _wake_target(_record(tmp_path, "tcp://x.test:2375"), env, None, "tcp://x.test:2375", Policy())


@pytest.mark.parametrize("path", ["/a\nb", "/a\rb", "/a\0b", "/a\udcffb"])
def test_a_label_path_no_instruction_can_carry_is_refused(path: str) -> None:
    """A line break would end the commit's LABEL instruction (the rest read as another),
    and a path that is not UTF-8 would be labelled as another path: both refused, on both
    engines' writers, before any image is made."""
    from orchestrator.backends.container.images import _podman_word, _word

    for write in (_word, _podman_word):
        with pytest.raises(UsageError, match=r"line break or NUL|must be UTF-8"):
            write(path)


def test_a_docker_label_word_escapes_exactly_what_its_parser_reads() -> None:
    from orchestrator.backends.container.images import _podman_word, _word

    assert _word('/é $HOME "q" \\b') == '"/é \\$HOME \\"q\\" \\\\b"'
    assert _podman_word('/é $HOME "q" \\b') == '"/é $HOME "q" \\b"'


@pytest.mark.parametrize(
    ("record", "replaced"),
    [
        ({"image": "orchestrator-snapshot:a"}, False),
        ({"image": "", "services": {"db": "orchestrator-snapshot:a"}}, False),
        ({"image": "orchestrator-snapshot:b"}, True),
        # a record anyone may write: a list or a mapping where a name goes is no name,
        # and judging it must not fail (every reap, so every `ps`, judges every record)
        ({"image": ["orchestrator-snapshot:a"]}, True),
        ({"image": {"x": 1}, "services": {"db": ["x"], "web": {"y": 2}}}, True),
        (["orchestrator-snapshot:a"], False),  # not a record: not judged
    ],
)
def test_which_records_no_longer_name_their_image(
    tmp_path: Path, record: object, replaced: bool
) -> None:
    import json

    from orchestrator.backends.container.identity import LABEL_SNAPSHOT_TAG
    from orchestrator.backends.container.images import _replaced

    path = tmp_path / "s.json"
    path.write_text(json.dumps(record))
    labels = {LABEL_SNAPSHOT_TAG: "orchestrator-snapshot:a"}
    assert _replaced(labels, path) is replaced
    assert _replaced({}, path) is False  # an image from before tags: not judged


def test_a_record_nested_past_the_parsers_depth_is_no_record(tmp_path: Path) -> None:
    """A record is a file a sandbox may write where its workspace holds it: JSON nested
    deeper than the parser goes raised RecursionError through every reap (so every `ps`,
    `cleanup` and `down`); it is judged as no record now, as is one over RECORD_MOST or
    one behind a link."""
    from orchestrator.backends.container.identity import LABEL_SNAPSHOT_TAG
    from orchestrator.backends.container.images import _replaced
    from orchestrator.sandbox.snapshot import RECORD_MOST, _load

    record, archive = tmp_path / "s.json", tmp_path / "s.tar"
    fields = '"env": "e", "digest": "d", "created": "", "size": 0'
    record.write_text("{" + fields + "}")
    assert _load(archive) is not None  # (a record of that form is one)
    record.write_text('{"image": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert _replaced({LABEL_SNAPSHOT_TAG: "orchestrator-snapshot:a"}, record) is False
    assert _load(archive) is None
    record.write_text("{" + fields + ', "pad": "' + "x" * RECORD_MOST + '"}')
    assert _load(archive) is None  # (too long to be one of ours)
    record.unlink()
    (tmp_path / "elsewhere.json").write_text("{" + fields + "}")
    record.symlink_to(tmp_path / "elsewhere.json")
    assert _load(archive) is None  # (never read through a link)


class _Images:
    """An engine's images, by name and by id, for the orphan judgement (no engine)."""

    address = "unix:///nowhere/docker.sock"

    def __init__(self, images: dict[str, tuple[str, dict[str, str]]]) -> None:
        self.images = images

    def image_ids(self, *, labels: object, action: str) -> list[str]:
        return sorted({ident for ident, _ in self.images.values()})

    def image_labels(self, image: str) -> tuple[str, dict[str, str]]:
        from orchestrator.backends.container.engine import NoSuchImage

        if image not in self.images:
            raise NoSuchImage(image)
        return self.images[image]


def test_only_a_snapshot_image_of_the_form_commit_makes_is_judged_an_orphan(
    tmp_path: Path,
) -> None:
    """Any image's labels are anyone's to set (a file's build, a pulled image): a record
    label of `/` or a name the kernel refuses raised through every reap (every `ps`); an
    image with no tag label, or one of another form, was removed by id once its record
    was gone: a user's image made from an older snapshot of ours. Only the tagged images
    commit makes are judged, and a bad label is not ours."""
    from orchestrator.backends.container.identity import (
        LABEL_SNAPSHOT_RECORD,
        LABEL_SNAPSHOT_STATE,
        LABEL_SNAPSHOT_TAG,
    )
    from orchestrator.backends.container.images import _orphans
    from orchestrator.paths import state_dir

    ours = str(state_dir().resolve())
    gone = str(tmp_path / "gone.json")

    def image(ident: str, record: str, tag: str = "") -> tuple[str, dict[str, str]]:
        labels = {LABEL_SNAPSHOT_STATE: ours, LABEL_SNAPSHOT_RECORD: record}
        return (ident, labels | ({LABEL_SNAPSHOT_TAG: tag} if tag else {}))

    good = "orchestrator-snapshot:0123456789ab"
    engine = _Images(
        {
            "a": image("a", gone, good),
            good: image("a", gone, good),  # (its tag names it: an orphan of ours)
            "b": image("b", "/"),  # (no name: ValueError from pathlib before)
            "c": image("c", "/" + "x" * 300 + ".json", "orchestrator-snapshot:0123456789ac"),
            "orchestrator-snapshot:0123456789ac": image("c", "/" + "x" * 300 + ".json"),
            "d": image("d", gone),  # (no tag: from before tags, or a user's made from it)
            "e": image("e", gone, "latest"),  # (a tag of no form of ours)
            "latest": image("e", gone, "latest"),
            "f": image("f", gone, good),  # (made from "a": its tag names "a")
        }
    )
    assert _orphans(engine) == [("a", good)]  # type: ignore[arg-type]


def test_a_record_whose_created_is_no_string_is_listed_beside_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing sorts the records by when they were made: one whose `created` was a
    number next to one of ours failed every listing, and so every reap. Both are listed
    (a hostile record is shown as text: test_cli_manners)."""
    from orchestrator.sandbox.snapshot import list_snapshots, snapshots_dir

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    folder = snapshots_dir()
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    (folder / "a.json").write_text('{"env": "e", "digest": "d", "created": 0, "size": 0}')
    (folder / "b.json").write_text('{"env": "e", "digest": "d", "created": "2026", "size": 1}')
    assert [s.name for s in list_snapshots()] == ["a", "b"]
