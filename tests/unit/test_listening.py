"""A container's listening ports seen from this machine's kernel (readiness.listening), as
the start's wait for the egress gateway reads them, on this test process's own sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.backends.container.readiness import listening
from orchestrator.backends.docker.lifecycle import Project


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


def test_every_listener_is_heard_past_the_kernels_first_page() -> None:
    """The kernel gives /proc/PID/net/tcp a page (about 26 sockets) a read: each is read."""
    servers = [_listener(socket.AF_INET, "127.0.0.1") for _ in range(60)]
    try:
        ports = {s.getsockname()[1] for s in servers}
        assert listening(os.getpid(), ports) is True
    finally:
        for server in servers:
            server.close()


def _project(runtime: str, pid: int) -> Any:
    """What `_gateway_heard` and `wait_gateway` ask of a project: its engine's inspection
    of the gateway (`runtime`, `pid`), and no exec."""

    def inspected(container: str, action: str) -> dict[str, Any]:
        return {
            "Id": "x" * 64,
            "State": {"Running": True, "Pid": pid},
            "HostConfig": {"Runtime": runtime},
        }

    def exec_target(container: str) -> Any:
        raise AssertionError("no exec")

    engine = SimpleNamespace(inspected=inspected, exec_target=exec_target)
    project: Any = SimpleNamespace(
        name="t", engine=engine, container_of=lambda s: f"t-{s}-1", logs=lambda s, tail: ""
    )
    project._gateway_failed = lambda deadline: Project._gateway_failed(project, deadline)
    project._gateway_heard = lambda ends: Project._gateway_heard(project, ends)
    return project


def test_the_gateway_is_heard_from_the_kernel_only_on_a_kernel_network_runtime(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under gVisor (its own network stack) the kernel lists none of the gateway's
    sockets: the start would wait its whole bound and fail, where the exec from inside
    hears it. Only a runtime of the kernel's network is read from /proc."""
    from orchestrator.backends.docker import lifecycle

    monkeypatch.setattr(lifecycle, "runs_here", lambda got: True)
    monkeypatch.setattr(lifecycle, "listening", lambda pid, ports: True)
    soon = time.monotonic() + 1
    for runtime in ("runc", "crun", "io.containerd.runc.v2"):
        assert Project._gateway_heard(_project(runtime, os.getpid()), soon) is True
    for runtime in ("runsc", "runsc-sealed", "kata", ""):
        assert Project._gateway_heard(_project(runtime, os.getpid()), soon) is None
    monkeypatch.setattr(lifecycle, "listening", lambda pid, ports: False)
    assert Project._gateway_heard(_project("runc", os.getpid()), soon) is False
    monkeypatch.setattr(lifecycle, "listening", lambda pid, ports: None)  # (gone)
    assert Project._gateway_heard(_project("runc", os.getpid()), soon) is None


def test_the_gateways_wait_is_one_bound_whichever_way_it_looks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look from the kernel that gives up late (the gateway gone or restarted at the
    end of the bound) left the exec a fresh bound of its own: twice the bound in all."""
    from orchestrator.errors import StartupError

    monkeypatch.setenv("ORCHESTRATOR_UP_TIMEOUT", "1")
    project = _project("runc", os.getpid())

    def late(ends: float) -> None:
        time.sleep(max(0.0, ends - time.monotonic()))
        return None

    project._gateway_heard = late
    started = time.monotonic()
    with pytest.raises(StartupError, match="did not take connections within 1s"):
        Project.wait_gateway(project)
    assert time.monotonic() - started < 1.5
