"""Published ports: a file publishes on this machine's loopback only. A file from a dataset
nobody reviewed must not open a port to other machines by itself (`host_ip: 0.0.0.0`, a
Compose file's `"0.0.0.0:8080:80"`): only the caller may allow that
(`Policy(allow_public_ports=True)`, ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1), with a warning."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from orchestrator.errors import SpecIssue
from orchestrator.spec.models import PortMap
from orchestrator.spec.policy import PUBLIC_PORTS_ENV, HardeningReport, Policy


def is_loopback(address: str) -> bool:
    """Whether a host address to bind is this machine's loopback (127.0.0.0/8, ::1)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def check_ports(
    source: str, where: str, ports: Sequence[PortMap], policy: Policy, report: HardeningReport
) -> None:
    """A file's published ports (`where`: network.ports or services.NAME.ports) bind this
    machine's loopback, unless the caller allows more (`Policy.allow_public_ports`, with a
    warning): a file from a dataset must not open a port to other machines by itself."""
    for i, port in enumerate(ports):
        if is_loopback(port.host_ip):
            continue
        if policy.allow_public_ports:
            report.warnings.append(
                f"WARNING: {where}.{i}.host_ip: port {port.container} is published on "
                f"{port.host_ip} by policy opt-in ({PUBLIC_PORTS_ENV}): other machines reach it"
            )
            continue
        report.issues.append(
            SpecIssue(
                source,
                field=f"{where}.{i}.host_ip",
                message=f"port {port.container} would be published on {port.host_ip!r}, "
                "which other machines may reach; a file may publish ports on this "
                "machine's loopback only",
                fix=f"remove host_ip (127.0.0.1 is the default), or let the caller allow it "
                f"with {PUBLIC_PORTS_ENV}=1 (Policy(allow_public_ports=True) in the library)",
            )
        )
