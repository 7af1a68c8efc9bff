"""Egress counted from the gateway's own access log (templates/gateway/squid.conf writes one
`ORCH` line per request to its stdout, which the engine keeps as the container's log, 16 MB
at most: templates/compose.yaml.j2): the requests that went out, those the gateway refused,
and their bytes. Read on demand (each `rt.usage()`, and once as the environment goes), from
where the last read stopped: the engine's `--since` the last line's timestamp, skipping the
lines at that very timestamp that were counted already. One read takes at most READ_LIMIT
bytes of log and READ_WITHIN seconds; whatever is left is read next time, so a flood of
requests costs the reader a bound, never a hang or the host's memory (`Egress.complete`
says when a count is short).

Only the gateway's stdout is read: its lines hold no text a request chose (no URL, no
header), so a sandbox changes its own counts by making requests, and nobody else's. Its
stderr (Squid's own log, which quotes requests) is never read."""

from __future__ import annotations

import re
import threading
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.sandbox.usage import Egress

READ_LIMIT = 32 * 1024 * 1024
"""Bytes of log one read takes at most (about 300,000 requests' lines)."""
READ_WITHIN = 5.0
"""Seconds one read takes at most (the engine reads the log from its start for `--since`)."""
LINE_LIMIT = 4096
"""A line longer than this is not one of the gateway's (its lines are about 80 bytes)."""
MARK = b"ORCH"
FRONT_MARK = b"ORCF"
"""The plain-HTTP front's lines (templates/gateway/front.py): the same fields, its own serial."""
RESTART_MARK = b"ORCS"
"""Printed by the gateway's start script each time Squid or the front starts again (killed
for memory, or the container restarted by a change of egress that cut what was open): what
either had open then was never logged, so the count is short from then on."""
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z")
"""The engine's timestamp before each line (RFC 3339, UTC), which `--since` takes back."""


class EgressCount:
    """One environment's gateway's counts so far (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: str | None = None
        self._at_since = 0  # lines at exactly `_since` counted already
        self._lost = False  # lines were gone from the log before they were read
        self._serials = {MARK: -1, FRONT_MARK: -1}  # each writer's last serial read (from 0)
        self._got = Egress()

    def read(self, engine: Any, container: str) -> Egress:
        """The counts, after reading what the gateway logged since the last read."""
        with self._lock:  # (one reader at a time: each read goes on from the last)
            self._read(engine, container)
            return self._got

    def _read(self, engine: Any, container: str) -> None:
        since, skip = self._since, self._at_since
        counts = [0, 0, 0, 0]  # allowed, denied, bytes sent, bytes received
        last, at_last = since, skip
        taken, rest, dropping = 0, b"", False
        chunks = engine.logs(
            container,
            tail=None,
            follow=False,
            since=since,
            timestamps=True,
            stdout_only=True,
            within=READ_WITHIN,
        )
        short = False  # this read stopped before the log's end
        try:
            for chunk in chunks:
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if dropping:  # the end of a line too long to be one of the gateway's
                        dropping = False
                        continue
                    stamp, _, text = line.partition(b" ")
                    when = stamp.decode(errors="replace")
                    if not STAMP.fullmatch(when):
                        continue
                    if when == since and skip > 0:  # counted by the last read
                        skip -= 1
                        continue
                    if skip > 0:  # lines the last read counted are gone: so are others
                        self._lost, skip = True, 0
                    at_last = at_last + 1 if when == last else 1
                    last = when
                    if text.split(b" ", 1)[0] == RESTART_MARK:
                        self._lost = True
                    mark, serial = _count(text, counts)
                    if mark is not None:
                        # a line between was never read (0: Squid counts from 0 again
                        # each time it reads its rules anew or restarts: a change of them;
                        # the front, each time it starts)
                        if serial not in (self._serials[mark] + 1, 0):
                            self._lost = True
                        self._serials[mark] = serial
                    taken += len(line) + 1
                if len(rest) > LINE_LIMIT:
                    rest, dropping = b"", True
                if taken >= READ_LIMIT:
                    short = True
                    break  # the rest next time, from the last whole line read
        except OrchestratorError:  # past READ_WITHIN, or the gateway gone: what was read stands
            short = True
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        allowed, denied, sent, received = counts
        self._since, self._at_since = last, at_last
        got = self._got
        self._got = Egress(
            allowed=got.allowed + allowed,
            denied=got.denied + denied,
            bytes_sent=got.bytes_sent + sent,
            bytes_received=got.bytes_received + received,
            complete=not (short or self._lost),
        )


def _count(text: bytes, counts: list[int]) -> tuple[bytes | None, int]:
    """Add one line's request to `counts` (allowed, denied, bytes sent, bytes received);
    its writer's mark and its serial, (None, 0) for a line that is not a request's."""
    fields = text.split()
    if len(fields) != 8 or fields[0] not in (MARK, FRONT_MARK):
        return None, 0  # (a line of the gateway's own, not a request's)
    mark = bytes(fields[0])
    try:
        serial, up, down = int(fields[1]), max(int(fields[6]), 0), max(int(fields[7]), 0)
    except ValueError:
        return None, 0
    if fields[3].startswith(b"127."):
        return mark, serial  # the gateway's own: its probes, or the secrets relay's way out
    if fields[5].startswith(b"HIER_DIRECT") or b"_PARENT" in fields[5]:  # out (or the relay)
        counts[0] += 1
        counts[2] += up
        counts[3] += down
    else:
        counts[1] += 1
    return mark, serial
