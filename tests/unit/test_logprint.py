"""logprint.py: what `orchestrator logs` prints, the same however the log's bytes come
(both of its entries print through it): lines whole after their service's name, a line
longer than LINE_LIMIT in the same pieces wherever its chunks were cut, the main sandbox's
note when it printed nothing, and the error that ended one service's log."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from orchestrator.errors import DockerError
from orchestrator.logprint import LINE_LIMIT, show_logs

LOG = b"a\n" + b"x" * (2 * LINE_LIMIT) + b"\n" + b"y" * (LINE_LIMIT + 5) + b"\nend"


def _cut(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def test_lines_come_out_the_same_however_the_log_was_cut(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    printed = []
    for seed in range(8):
        chunks = [LOG] if seed == 0 else _cut(LOG, seed)

        def chunks_of(name: str, given: list[bytes] = chunks) -> Iterator[bytes]:
            return iter(given)

        assert show_logs(["web"], chunks_of, follow=False) is None
        printed.append(capsysbinary.readouterr().out)
    assert len(set(printed)) == 1
    lines = printed[0].split(b"\n")
    assert [len(x) for x in lines] == [1, LINE_LIMIT, LINE_LIMIT, LINE_LIMIT, 5, 3, 0]


def test_services_are_named_and_an_error_is_returned_after_the_rest(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    failing = DockerError("the engine's answer broke off")

    def chunks_of(name: str) -> Iterator[bytes]:
        if name == "web":
            yield b"up\npartial"
            raise failing
        if name == "db":
            yield b"ready\n"

    error = show_logs(["main", "db", "web"], chunks_of, follow=False)
    out, err = capsysbinary.readouterr()
    assert error is failing
    assert out == b"db   | ready\nweb  | up\nweb  | partial\n"
    assert b"main: no output of its own" in err
