"""Listings by label through the engine's API on this machine's socket (networks, volumes,
images: `ps` makes these without a docker CLI process) give what the docker CLI's give,
an answer too long for its bound is asked of the CLI instead (never cut short), and Podman
finds by two labels what Docker finds."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.container.engine import Engine, api
from orchestrator.backends.container.engine import core as listings
from tests.conftest import BUSYBOX_IMAGE, PODMAN, cannot_run


def _docker(*argv: str) -> str:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def labelled() -> Iterator[tuple[str, list[str]]]:
    """A label of this test's own, on two networks, two volumes and an image (one network
    and one volume with a second label, one with a value that needs quoting)."""
    label = f"org.orchestrator.test.listing={uuid.uuid4().hex[:8]}"
    made: dict[str, list[str]] = {"network": [], "volume": [], "image": []}
    try:
        for kind in ("network", "volume"):
            for i, extra in enumerate(("plain", 'a "quoted"\tvalue\n', None)):
                labels = ["--label", label, *(["--label", f"extra={extra}"] if extra else [])]
                name = f"orchestrator-test-listing-{uuid.uuid4().hex[:8]}-{i}"
                made[kind].append(_docker(kind, "create", *labels, name))
        base = _docker("create", BUSYBOX_IMAGE, "true")
        try:
            made["image"].append(_docker("commit", "--change", f"LABEL {label}", base))
        finally:
            _docker("rm", base)
        yield label, ["extra", "org.orchestrator.test.listing", "unset"]
    finally:
        for kind in ("network", "volume", "image"):
            if made[kind]:
                subprocess.run(["docker", kind, "rm", *made[kind]], capture_output=True, timeout=60)


def _by_cli(engine: Engine) -> Engine:
    """The same engine, asked through the docker CLI only (as one that is not on a local
    socket is)."""
    cli = Engine(engine.address)
    cli.socket = None
    return cli


def test_api_listings_give_what_the_cli_gives(labelled: tuple[str, list[str]]) -> None:
    label, keys = labelled
    engine = Engine.at()
    assert engine.socket is not None
    for kind, fields in (("network", ["ID"]), ("volume", ["Name"])):
        rows = [
            sorted(e.rows(kind, fields, keys, label=label, retry=True))  # type: ignore[arg-type]
            for e in (engine, _by_cli(engine))
        ]
        assert rows[0] == rows[1] and len(rows[0]) == 3, (kind, rows)
        assert {r[1] for r in rows[0]} == {"plain", 'a "quoted"\tvalue\n', ""}
    images = [e.image_ids(labels=[label], action="listing") for e in (engine, _by_cli(engine))]
    assert images[0] == images[1] and len(images[0]) == 1


def test_api_container_listings_give_what_the_cli_gives() -> None:
    """Ids, states, labels and published ports (which the CLI writes in ranges, in an order
    of its version's) read the same from both."""
    from orchestrator.backends.container.projects import parse_ports

    label = f"org.orchestrator.test.listing={uuid.uuid4().hex[:8]}"
    ports = ["127.0.0.1::8000", "127.0.0.1::8001", "127.0.0.1::9000/udp"]
    made = [
        _docker("create", "--label", label, "--label", "extra=plain", BUSYBOX_IMAGE, "true"),
        _docker(
            "run",
            "-d",
            "--label",
            label,
            *(w for p in ports for w in ("-p", p)),
            "--expose",
            "7000",  # (not published: in neither)
            BUSYBOX_IMAGE,
            "sleep",
            "60",
        ),
    ]
    try:
        engine = Engine.at()
        fields = ["ID", "State", "Ports"]
        rows = [
            sorted(e.rows("container", fields, ["extra"], label=label, retry=True))
            for e in (engine, _by_cli(engine))
        ]
        assert [len(r) for r in rows] == [2, 2], rows
        for api_row, cli_row in zip(*rows, strict=True):
            assert api_row[:2] == cli_row[:2] and api_row[3:] == cli_row[3:], rows
            assert parse_ports("s", api_row[2]) == parse_ports("s", cli_row[2]), rows
        published = [parse_ports("s", r[2]) for r in rows[0]]
        assert sorted(len(p) for p in published) == [0, 3], published
        assert {r[1] for r in rows[0]} == {"created", "running"}
    finally:
        subprocess.run(["docker", "rm", "-f", *made], capture_output=True, timeout=60)


def test_an_api_listing_too_long_for_its_bound_is_the_clis(
    labelled: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATTACK (anyone on the engine may add labels in bulk to objects wearing ours): an
    answer over the bound failed every listing, so every ps, down and reap; it is asked
    of the docker CLI instead (which prints the labels asked for alone), never cut."""
    label, keys = labelled
    engine = Engine.at()
    wanted = sorted(_by_cli(engine).rows("network", ["ID"], keys, label=label, retry=True))
    monkeypatch.setattr(listings, "LISTING_LIMIT", 100)
    assert sorted(engine.rows("network", ["ID"], keys, label=label, retry=False)) == wanted
    assert engine.image_ids(labels=[label], action="listing") != []
    with pytest.raises(api.TooLong):
        engine.api("GET", "/networks", action="listing", limit=100)


def test_a_label_with_a_line_separator_in_it_breaks_no_listing() -> None:
    """ATTACK: U+0085 in a label (which the docker CLI's JSON leaves as it is) split its
    listing's lines where no line ended: every listing of ours failed with a traceback,
    for every user of the engine, while such a container existed."""
    label = f"org.orchestrator.test.listing={uuid.uuid4().hex[:8]}"
    odd = "a\u0085b\u2028c"
    cid = _docker(
        "create", "--label", label, "--label", f"org.orchestrator.env={odd}", BUSYBOX_IMAGE, "true"
    )
    try:
        rows = Engine.at().rows(
            "container", ["ID", "State"], ["org.orchestrator.env"], label=label, retry=False
        )
        assert rows == [[cid, "created", odd]]
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60)


def test_podman_lists_snapshot_images_by_two_labels(tmp_path: Path) -> None:
    """Podman answers an API listing by two labels in a list with nothing at all: snapshot
    images whose record is gone were never found there, so never removed. One label is
    asked, the others held here: the API and the CLI find the same images."""
    podman = Engine.at(PODMAN)
    if podman.socket is None or not Path(podman.socket).exists():
        cannot_run("Podman's API socket is missing (scripts/bootstrap-podman)")
    state = tmp_path / "state"
    labels = [
        f"org.orchestrator.test.record={tmp_path}/gone.json",
        f"org.orchestrator.test.state={state}",
    ]
    base = _on(PODMAN, "create", BUSYBOX_IMAGE, "true")
    repo = f"orchestrator-test-listing-{uuid.uuid4().hex[:8]}"
    try:  # (through the API: Podman's cannot decode the docker CLI's commit)
        podman.commit_api(base, repo, "1", pause=False, changes=[f"LABEL {x}" for x in labels])
        image = _on(PODMAN, "image", "inspect", "--format", "{{.Id}}", f"{repo}:1")
    finally:
        _on(PODMAN, "rm", base)
    try:
        asked = ["org.orchestrator.test.record", labels[1]]
        found = [e.image_ids(labels=asked, action="listing") for e in (podman, _by_cli(podman))]
        assert found[0] == found[1] and len(found[0]) == 1 and image.endswith(found[0][0][-12:])
    finally:
        _on(PODMAN, "rmi", f"{repo}:1")


def _on(host: str, *argv: str) -> str:
    return _docker("--host", host, *argv)
