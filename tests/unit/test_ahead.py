"""The snapshot images' listing asked ahead (backends/container/ahead.py): taken once, by
whichever thread of the process asks first."""

from __future__ import annotations

import threading

import pytest

from orchestrator.backends.container import ahead


def test_an_answer_taken_as_its_thread_starts_is_waited_for_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ps` asks ahead while its reaper thread may take the answer at once: it was published
    before its thread started, and a take that came between joined a thread not started
    (RuntimeError in the reaper's thread; CI, once, with environments coming and going)."""
    start = threading.Thread.start
    took: list[object] = []

    def start_after_a_take(self: threading.Thread) -> None:
        if self.name == "orch-images-ahead":
            took.append(ahead.taken("unix:///nowhere.sock", ahead.snapshot_labels()))
        start(self)

    monkeypatch.setattr(threading.Thread, "start", start_after_a_take)
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/orchestrator-test-none.sock")
    ahead.snapshot_images()
    assert took == [None]
    assert ahead.taken("unix:///nowhere.sock", ahead.snapshot_labels()) is None  # (waited)
