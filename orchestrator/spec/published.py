"""What a running environment reports of its services and ports: the sandbox's service
name, the host's loopback names, the ports published on the host. Apart from the file's
models (parts.py, resolve.py) so that what lists environments (`orchestrator ps`) loads no
pydantic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAIN = "main"
"""The Compose service of the sandbox itself (every other one is an extra service)."""
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
"""The host's own addresses, by the names a file may give them."""

Protocol = Literal["tcp", "udp", "sctp"]
"""Transport protocols a port may be published for."""


@dataclass(frozen=True)
class PublishedPort:
    """A container port reachable from the host."""

    service: str
    """Compose service: "main" for the sandbox, else the extra service's name."""
    container: int
    protocol: Protocol
    host_ip: str
    host: int
    """Host port (an ephemeral one, resolved, when the file left it out)."""

    def __str__(self) -> str:
        return f"{self.service}:{self.container}/{self.protocol} -> {self.host_ip}:{self.host}"
