"""Listings by label through the engine's API on this machine's socket (networks, volumes,
images: `ps` makes these without a docker CLI process) give what the docker CLI's give,
and an answer too long for its bound fails, never cut short silently."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.engine import containers as listings
from orchestrator.errors import DockerError
from tests.conftest import BUSYBOX_IMAGE


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


def test_an_api_listing_too_long_for_its_bound_fails(
    labelled: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    label, keys = labelled
    monkeypatch.setattr(listings, "LISTING_LIMIT", 100)
    with pytest.raises(DockerError, match="broke off"):
        Engine.at().rows("network", ["ID"], keys, label=label, retry=False)
