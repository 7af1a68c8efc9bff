"""The engine's listing of this state folder's snapshot images, asked ahead. Every `ps` reaps
snapshot images whose record is gone (images.reap_orphans), and an engine lists images
slowly (it walks every image it holds: 10 to 30 ms with a few hundred). Asked in a thread
as the listing of environments begins, that wait passes while this process loads what the
rest of the listing needs (a thread waiting on the engine's socket lets the loading run).

One answer, for the next `images.labelled` call in this process that asks the same labels
of the same engine, taken once: a later call asks the engine again. An answer that failed is
not taken (the call asks, and fails as it should). Light: what it loads, the listing loads
anyway."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence

_lock = threading.Lock()
_asked: list[tuple[threading.Thread, list[tuple[str, tuple[str, ...], list[str]]], float]] = []


def snapshot_images() -> None:
    """Start asking the process's engine for this state folder's snapshot images (in a
    thread that loads what it needs itself: the caller goes on at once)."""
    got: list[tuple[str, tuple[str, ...], list[str]]] = []

    def ask() -> None:
        with contextlib.suppress(Exception):  # (not taken: the call asks, and says it)
            from orchestrator.backends.container.engine import Engine

            engine, labels = Engine.at(), tuple(snapshot_labels())
            ids = engine.image_ids(labels=labels, action="listing snapshot images")
            got.append((engine.address, labels, ids))

    thread = threading.Thread(target=ask, name="orch-images-ahead", daemon=True)
    thread.start()  # (before it is published: the reaper's thread may take it at once)
    with _lock:
        _asked[:] = [(thread, got, time.monotonic())]


def taken(address: str, labels: Sequence[str]) -> list[str] | None:
    """The answer asked ahead for these labels of the engine at `address` (waited for), once;
    None when none was asked for them, or it failed."""
    with _lock:
        if not _asked:
            return None
        thread, got, asked = _asked.pop()
    if time.monotonic() - asked > FRESH:  # (a listing that failed before it took it: stale)
        return None
    thread.join()
    if got and got[0][:2] == (address, tuple(labels)):
        return got[0][2]
    return None


FRESH = 10.0
"""Seconds an answer asked ahead may be taken after it was asked."""


def snapshot_labels() -> list[str]:
    """The labels this state folder's snapshot images are listed by (images.orphaned)."""
    from orchestrator.backends.container.identity import (
        LABEL_SNAPSHOT_RECORD,
        LABEL_SNAPSHOT_STATE,
    )
    from orchestrator.paths import state_dir

    return [LABEL_SNAPSHOT_RECORD, f"{LABEL_SNAPSHOT_STATE}={state_dir().resolve()}"]
