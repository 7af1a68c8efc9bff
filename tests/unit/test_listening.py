"""A container's listening ports seen from this machine's kernel (readiness.listening), as
the start's wait for the egress gateway reads them, on this test process's own sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from orchestrator.backends.container.readiness import listening


def _listener(family: socket.AddressFamily, host: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_a_listening_port_is_heard_and_a_connected_one_is_not() -> None:
    server = _listener(socket.AF_INET, "127.0.0.1")
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    talk = client.getsockname()[1]  # (an established socket's port: not a listener)
    try:
        assert listening(os.getpid(), {port}) is True
        assert listening(os.getpid(), {port, talk}) is False
    finally:
        client.close()
        server.close()
    assert listening(os.getpid(), {port}) is False


def test_an_ipv6_listener_counts() -> None:
    if not socket.has_ipv6:
        pytest.skip("this kernel has no IPv6")
    try:
        server = _listener(socket.AF_INET6, "::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with server:
        assert listening(os.getpid(), {server.getsockname()[1]}) is True


def test_a_process_gone_cannot_be_heard() -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert listening(int(child.stdout), {1}) is None
    assert listening(os.getpid(), set()) is True  # (nothing asked: nothing missing)
