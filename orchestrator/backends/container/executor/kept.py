"""Kept processes of a resident executor (agent.py `--resident`). Standard library only,
Python 3.7+ (copied into containers).

A command its session starts with `keep` (RUN's request names its id) outlives the
connection that started it: its output goes into a scrollback of at most SCROLLBACK bytes
and FRAMES pieces (the oldest dropped first), never into a connection directly, so nothing
it prints waits for a reader and nothing grows without bound. Every connection attached to
it (its starter's, and each later ATTACH naming its id) is a Reader with its own place in
that output and its own credit (wire.WINDOW frames ahead of what its host handed back, as
for any command): a slow or gone reader holds up neither the command nor another reader,
and one that fell behind the scrollback is told how much it lost (LOST) and goes on from
the oldest byte kept. Its stdin, signals, resizes and kill come from any reader; a reader
leaving ends nothing. The command still ends at its timeout, by a KILL, or with the
container. At most KEPT are known at once; one that ended is forgotten LINGER seconds after
(or sooner, for a new one, once KEPT are known), and an id no kept process has gets GONE.
"""

import bisect
import collections
import threading
import time

import wire

SCROLLBACK = 1 << 20
"""Bytes of a kept process's output held for its readers."""
FRAMES = 4096
"""Pieces of output held (small pieces of the two streams in turn do not merge)."""
KEPT = 16
"""Kept processes known at once (running, or ended and not yet forgotten)."""
LINGER = 600.0
"""Seconds an ended kept process is kept for a reader to come for its end."""

_known = {}  # id -> Hub
_known_lock = threading.Lock()


class Full(Exception):
    """KEPT kept processes run already."""


def register(ident, agent):
    """A new kept process's Hub; Full when KEPT are known and none ended; ValueError when
    the id is taken."""
    now = time.monotonic()
    with _known_lock:
        for key, hub in list(_known.items()):
            if hub.ended_at is not None and now - hub.ended_at > LINGER:
                del _known[key]
        if ident in _known:
            raise ValueError("a kept process has this id already")
        if len(_known) >= KEPT:
            ended = [h for h in _known.values() if h.ended_at is not None]
            if not ended:
                raise Full("%d kept processes run already" % KEPT)
            del _known[min(ended, key=lambda h: h.ended_at).ident]
        hub = _known[ident] = Hub(ident, agent)
        return hub


def forget(ident):
    with _known_lock:
        _known.pop(ident, None)


def find(ident):
    with _known_lock:
        return _known.get(ident)


class Hub:
    """One kept process's output, held for its readers."""

    def __init__(self, ident, agent):
        self.ident = ident
        self.agent = agent
        self.cond = threading.Condition()
        self.offsets = []  # where each piece starts in the output (stdout and stderr as one)
        self.pieces = []  # [kind, payload]
        self.head = 0  # pieces before it are dropped
        self.start = 0  # offset of the oldest byte kept
        self.end = 0  # offset after the newest byte
        self.held = 0  # bytes held
        self.exit = None  # the EXIT payload, once it ended
        self.ended_at = None
        self.writers = collections.deque()  # the reader of each STDIN frame not yet taken

    def add(self, kind, payload):
        """Output of the command (OUT or ERR), never waiting."""
        if not payload:
            return
        with self.cond:
            last = self.pieces[-1] if len(self.pieces) > self.head else None
            if last is not None and last[0] == kind and len(last[1]) + len(payload) <= 4096:
                last[1] += payload  # small pieces of one stream merge
            else:
                self.offsets.append(self.end)
                self.pieces.append([kind, payload])
            self.end += len(payload)
            self.held += len(payload)
            while self.held > SCROLLBACK or len(self.pieces) - self.head > FRAMES:
                dropped = self.pieces[self.head][1]
                self.pieces[self.head] = None
                self.head += 1
                self.held -= len(dropped)
                self.start = self.offsets[self.head] if self.head < len(self.offsets) else self.end
            if self.head > 1024 and self.head * 2 > len(self.pieces):
                del self.pieces[: self.head], self.offsets[: self.head]
                self.head = 0
            self.cond.notify_all()

    def finish(self, payload):
        with self.cond:
            self.exit = payload
            self.ended_at = time.monotonic()
            self.cond.notify_all()

    def piece_at(self, cursor):
        """(kind, bytes from `cursor` to its piece's end), or None when nothing is there
        yet; the caller holds `cond` and made sure start <= cursor."""
        if cursor >= self.end:
            return None
        i = bisect.bisect_right(self.offsets, cursor, self.head) - 1
        kind, payload = self.pieces[i]
        return kind, payload[cursor - self.offsets[i] :]

    def write(self, reader, kind, payload):
        """STDIN or STDIN_EOF from `reader`, to the command: the TAKEN of a STDIN frame goes
        back to the reader that sent it."""
        with self.cond:
            if kind == wire.STDIN:
                self.writers.append(reader)
            self.agent.act(kind, 1, payload)

    def taken(self, payload):
        """The command took a STDIN frame: tell its writer, if it is still there."""
        with self.cond:
            reader = self.writers.popleft() if self.writers else None
        if reader is not None:
            reader.send(wire.TAKEN, payload)


class Reader:
    """One connection reading a kept process's output from `cursor` on, at its own pace."""

    def __init__(self, hub, send, cursor):
        self.hub = hub
        self.send = send  # send(kind, payload): a frame of command 1 on this connection
        self.cursor = cursor
        self.credit = wire.WINDOW
        self.closed = False

    def grant(self, count):
        with self.hub.cond:
            self.credit += count
            self.hub.cond.notify_all()

    def close(self):
        with self.hub.cond:
            self.closed = True
            self.hub.cond.notify_all()

    def serve(self):
        """Send the output from the cursor on, then the exit report (in its own thread)."""
        hub = self.hub
        while True:
            with hub.cond:
                while not self.closed and (
                    self.credit <= 0 or (self.cursor >= hub.end and hub.exit is None)
                ):
                    hub.cond.wait()
                if self.closed:
                    return
                lost = max(0, hub.start - self.cursor)
                self.cursor += lost
                piece = hub.piece_at(self.cursor)
                if piece is not None:
                    self.cursor += len(piece[1])
                    self.credit -= 1
                exit_report = hub.exit if piece is None else None
            if lost:
                self.send(wire.LOST, wire.OFFSET.pack(lost))
            if piece is not None:
                self.send(*piece)
            elif exit_report is not None:
                self.send(wire.EXIT, exit_report)
                return
