"""The container layout every container backend shares: where things are inside a
container, what keeps the main sandbox alive, and the labels on its containers."""

from __future__ import annotations

from orchestrator.spec.models import EnvironmentV1
from orchestrator.spec.resolve import LOOPBACK, MAIN

__all__ = [
    "FORWARDS_LABEL",
    "IO_DIR",
    "IO_MOUNT",
    "KEEP_ALIVE",
    "MAIN",
    "SANDBOX_DIR",
    "SANDBOX_MOUNT",
    "STATIC_ROOT",
    "USER_LABEL",
    "container_bind_host",
    "parse_forwards",
]

STATIC_ROOT = "/static"
"""Static assets are read-only at STATIC_ROOT/<save_path>."""
SANDBOX_DIR = "sandbox"
SANDBOX_MOUNT = "/.orchestrator"
"""The executor's files and entry.sh: <project>/SANDBOX_DIR, read-only in every container."""
IO_DIR = "io"
IO_MOUNT = "/.orchestrator-io"
"""Where the transfer FIFOs of one container appear: <project>/IO_DIR/<service> (mode 0700),
read-only in that container only, so that no other container (root in a service, or in the
main sandbox) sees or opens them."""
USER_LABEL = "org.orchestrator.user"
"""On the main container: the user commands run as ("uid:gid"), for `orchestrator exec`."""

KEEP_ALIVE = (
    "trap 'exit 0' TERM INT HUP; f=/dev/shm/.orchestrator-keep-alive; "
    'if rm -f "$f" && mkfifo -m 600 "$f" && exec 3<>"$f"; then rm -f "$f"; '
    "while :; do read -r _ <&3; done; fi; "
    "while :; do sleep 86400 & wait $!; done"
)
"""What keeps the main sandbox alive (the child of its init; templates/entry.sh.j2 runs
it too): a shell blocked reading a FIFO only it holds, so it has no child process and runs
no program of the image after the start. A reset kills everything else, and a root sandbox
that replaces a program the keep-alive would start again has nothing to replace. Where
`mkfifo` or /dev/shm is missing, it sleeps in a loop instead."""


def container_bind_host(spec: EnvironmentV1, network_mode: str) -> tuple[str, str | None]:
    """In bridge mode a loopback bind address cannot be reached through published ports,
    so it becomes 0.0.0.0. Returns (bind host, notice or None)."""
    asked = spec.network.bind_host
    if network_mode == "bridge" and asked in LOOPBACK:
        return "0.0.0.0", (
            f"network.bind_host {asked} rewritten to 0.0.0.0: in bridge mode a "
            "loopback address is unreachable through published ports"
        )
    return asked, None


FORWARDS_LABEL = "org.orchestrator.forwards"
"""On an environment's port forwarder: which container port each of its own ports stands
for, "LISTEN/PROTO=SERVICE:PORT,..." (see backends/docker/network.py)."""


def parse_forwards(label: str) -> dict[tuple[int, str], tuple[str, int]]:
    """FORWARDS_LABEL read back: (listen port, protocol) -> (service, container port)."""
    out = {}
    for part in label.split(","):
        key, _, target = part.partition("=")
        listen, _, proto = key.partition("/")
        service, _, port = target.rpartition(":")
        if listen.isdigit() and port.isdigit() and service:
            out[(int(listen), proto)] = (service, int(port))
    return out
