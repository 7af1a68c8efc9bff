"""The kept process's scrollback (executor/kept.py, run here as the executor imports it):
whatever is written, in whatever pieces, a reader from any cursor gets the bytes it did not
lose, in order, each stream's as it was written, and is told how many it lost; what is held
stays within SCROLLBACK bytes and FRAMES pieces; a reader that never gives credit holds up
nobody; the registry is bounded."""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

EXECUTOR = (
    Path(__file__).resolve().parents[2] / "orchestrator" / "backends" / "container" / "executor"
)


@pytest.fixture(scope="module")
def kept() -> Iterator[ModuleType]:
    sys.path[:0] = [str(EXECUTOR), str(EXECUTOR.parents[2])]
    try:
        yield importlib.import_module("kept")
    finally:
        del sys.path[:2]


class Sink:
    def __init__(self, wire: Any) -> None:
        self.wire = wire
        self.frames: list[tuple[int, bytes]] = []

    def __call__(self, kind: int, payload: bytes) -> None:
        self.frames.append((kind, payload))


def _drain(kept: ModuleType, hub: Any, cursor: int) -> tuple[int, bytes, list[tuple[int, bytes]]]:
    """Read `hub` (ended) from `cursor` to its end: (bytes lost, bytes got, frames)."""
    wire = sys.modules["wire"]
    sink = Sink(wire)
    reader = kept.Reader(hub, sink, cursor)
    reader.credit = 10**9
    reader.serve()
    lost = sum(wire.OFFSET.unpack(p)[0] for k, p in sink.frames if k == wire.LOST)
    got = b"".join(p for k, p in sink.frames if k in (wire.OUT, wire.ERR))
    assert sink.frames[-1][0] == wire.EXIT
    return lost, got, sink.frames


writes = st.lists(
    st.tuples(st.sampled_from([11, 12]), st.binary(min_size=0, max_size=70_000)), max_size=60
)


@settings(max_examples=60, deadline=None)
@given(writes=writes, cursor=st.integers(min_value=0, max_value=3_000_000))
def test_a_reader_gets_what_was_not_lost_in_order(
    kept: ModuleType, writes: list[tuple[int, bytes]], cursor: int
) -> None:
    hub = kept.Hub("a" * 32, None)
    for kind, data in writes:
        hub.add(kind, data)
        assert hub.held <= kept.SCROLLBACK
        assert len(hub.pieces) - hub.head <= kept.FRAMES
    hub.finish(b"{}")
    everything = b"".join(d for _, d in writes)
    cursor = min(cursor, len(everything))
    lost, got, frames = _drain(kept, hub, cursor)
    assert cursor + lost + len(got) == len(everything)
    assert got == everything[cursor + lost :]
    assert len(got) <= kept.SCROLLBACK
    # each frame's bytes are of the stream that wrote them
    wire = sys.modules["wire"]
    stream = {11: b"", 12: b""}
    for kind, data in writes:
        stream[kind] += data
    for kind in (wire.OUT, wire.ERR):
        mine = b"".join(p for k, p in frames if k == kind)
        assert mine in stream[kind]


def test_alternating_tiny_writes_are_held_to_frames(kept: ModuleType) -> None:
    hub = kept.Hub("b" * 32, None)
    for i in range(50_000):
        hub.add(11 if i % 2 else 12, b"x")
    assert len(hub.pieces) - hub.head <= kept.FRAMES
    assert len(hub.pieces) <= 2 * kept.FRAMES + 1024  # dropped pieces are let go of too
    hub.finish(b"{}")
    lost, got, _ = _drain(kept, hub, 0)
    assert lost + len(got) == 50_000 and len(got) <= kept.FRAMES


def test_a_reader_without_credit_holds_up_neither_writer_nor_other_readers(
    kept: ModuleType,
) -> None:
    hub = kept.Hub("c" * 32, None)
    stuck = kept.Reader(hub, lambda kind, payload: None, 0)
    stuck.credit = 0
    waiting = threading.Thread(target=stuck.serve, daemon=True)
    waiting.start()
    for _ in range(100):
        hub.add(11, b"y" * 65536)  # 6.4 MiB: never waits
    hub.finish(b"{}")
    lost, got, _ = _drain(kept, hub, 0)
    assert lost + len(got) == 100 * 65536
    assert waiting.is_alive()
    stuck.close()
    waiting.join(5)
    assert not waiting.is_alive()


def test_the_registry_is_bounded_and_forgets_ended_ones_first(kept: ModuleType) -> None:
    kept._known.clear()
    try:
        hubs = [kept.register(f"{i:032x}", None) for i in range(kept.KEPT)]
        with pytest.raises(kept.Full):
            kept.register("f" * 32, None)
        with pytest.raises(ValueError):
            kept.register(f"{3:032x}", None)  # taken
        hubs[5].finish(b"{}")
        kept.register("f" * 32, None)  # the ended one makes room
        assert kept.find(f"{5:032x}") is None and kept.find("f" * 32) is not None
    finally:
        kept._known.clear()


def test_the_host_takes_lost_and_gone_only_as_a_kept_call_may_send_them() -> None:
    """An executor (the image's python3, which root in the sandbox may replace) sending
    LOST or GONE where they cannot come breaks the protocol: LOST frames cost no credit, so
    they are held to one before each output frame, and only on a kept call."""
    from orchestrator.backends.container.executor import wire
    from orchestrator.backends.container.executor.link import Inbox

    plain = Inbox()
    assert plain.admit(wire.LOST) is not None and Inbox().admit(wire.GONE) is not None
    kept = Inbox()
    kept.kept = True
    assert kept.admit(wire.LOST) is None
    assert kept.admit(wire.LOST) is not None  # a second before any output
    kept = Inbox()
    kept.kept = True
    assert kept.admit(wire.LOST) is None and kept.admit(wire.OUT) is None
    assert kept.admit(wire.LOST) is None
    assert kept.admit(wire.GONE) is not None  # only as its first frame
    first = Inbox()
    first.kept = True
    assert first.admit(wire.GONE) is None and first.admit(wire.OUT) is not None
    assert first.admit(wire.AT) is not None  # (after GONE: nothing)
    fresh = Inbox()
    fresh.kept = True
    assert fresh.admit(wire.AT) is not None  # AT answers ATTACH only
    at = Inbox()
    at.kept = at.attached = True
    assert at.admit(wire.AT) is None and at.admit(wire.OUT) is None
    assert at.admit(wire.AT) is not None  # only as its first frame
    assert Inbox().admit(wire.AT) is not None
