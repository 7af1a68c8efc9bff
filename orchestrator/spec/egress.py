"""What a sandbox may reach outside its environment: `network.egress` (and a service's
`egress`), parsed into rules, and narrowed by the caller's policy.

An egress setting is "none" (nothing leaves: the default), "all" (anything may), or an
allowlist, each entry one of:

    example.com            that host, ports 80 and 443
    *.example.com          any name under example.com (not example.com itself), 80 and 443
    example.com:8443       that host, that port only
    10.0.0.0/8, 10.1.2.3   those addresses, any port (only as addresses: never a name that
    10.0.0.0/8:5432        resolves to one), or that port only (IPv4 only: the gateway has no IPv6)

Names are compared lower-case, without a trailing dot. Pure: nothing here touches the
network or the engine."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

DEFAULT_PORTS = (80, 443)
"""Ports a name entry without a port allows: HTTP and HTTPS."""
MAX_RULES = 256
"""Most entries one allowlist may hold (each is a proxy rule)."""

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")

Kind = Literal["name", "suffix", "net"]
Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, order=True)
class Rule:
    """One allowlist entry: a host name, a name suffix (`*.x`) or an address range, and the
    ports it opens (empty: any port, for an address range only)."""

    kind: Kind
    value: str
    """The name (lower-case), the suffix without `*.`, or the range (`10.0.0.0/8`)."""
    ports: tuple[int, ...]

    def __str__(self) -> str:
        host = {"name": self.value, "suffix": "*." + self.value, "net": self.value}[self.kind]
        if self.kind == "net" and ":" in host and self.ports:
            host = f"[{host}]"
        if self.kind != "net" and self.ports == DEFAULT_PORTS:
            return host
        return host + "".join(f":{p}" for p in self.ports[:1])

    def network(self) -> Network:
        return ipaddress.ip_network(self.value, strict=False)

    def covers(self, other: Rule) -> bool:
        """Whether everything `other` lets through, this lets through too."""
        if self.ports and not set(other.ports or range(1, 65536)) <= set(self.ports):
            return False
        if self.kind == "net":
            if other.kind != "net":
                return False
            mine, theirs = self.network(), other.network()
            return mine.version == theirs.version and theirs.subnet_of(mine)  # type: ignore[arg-type]
        if other.kind == "net":
            return False
        if self.kind == "name":
            return other.kind == "name" and other.value == self.value
        same = other.kind == "suffix" and other.value == self.value
        return same or other.value.endswith("." + self.value)


_ENTRY = re.compile(r"^[a-z0-9_.*:/\[\]-]+$")
"""Every character an entry may hold: anything else (a zone `%eth0`, space, newline, `#`)
never reaches the gateway's rules."""
_VALUE = re.compile(r"^[a-z0-9_.:/-]+$")


def parse_rule(text: str) -> Rule:
    """One allowlist entry, or ValueError saying what a valid one looks like."""
    entry = text.strip().lower().rstrip(".")
    if not _ENTRY.match(entry):
        raise ValueError(_what(text))
    host, port = entry, ""
    if entry.startswith("["):  # [v6 range]:port
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(_what(text))
        port = rest[1:]
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    ports: tuple[int, ...] = ()
    if port:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
        ports = (int(port),)
    try:
        net = ipaddress.ip_network(host, strict=False)
    except ValueError:
        net = None
    if net is not None and net.version == 6:
        raise ValueError(
            f"{text!r}: IPv6 addresses cannot be allowed: the egress gateway reaches the "
            "outside over IPv4 only (name the host, or give its IPv4 address)"
        )
    if net is not None and _VALUE.match(str(net)):
        return Rule("net", str(net), ports)
    if "/" in host or ":" in host or not _NAME.match(host) or len(host) > 253:
        raise ValueError(_what(text))
    if host.startswith("*."):
        return Rule("suffix", host[2:], ports or DEFAULT_PORTS)
    if "*" in host:
        raise ValueError(_what(text))
    return Rule("name", host, ports or DEFAULT_PORTS)


def _what(text: str) -> str:
    return (
        f"{text!r} is not an allowlist entry: give a host name (example.com), a wildcard "
        "(*.example.com), an IPv4 address or range (10.0.0.0/8), each with an "
        "optional :PORT"
    )


Egress: TypeAlias = Literal["none", "all"] | tuple[Rule, ...]
"""A parsed setting: nothing, anything, or the rules of an allowlist (never empty)."""


def parse(value: str | Sequence[str]) -> Egress:
    """A setting as a file or the caller writes it: "none", "all" or a list of entries
    (ValueError for a bad one, naming it). An empty list is "none"."""
    if isinstance(value, str):
        if value in ("none", "all"):
            return value  # type: ignore[return-value]
        raise ValueError(f"{value!r}: give none, all or a list of allowed hosts")
    if len(value) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} entries (this list has {len(value)})")
    if any(str(v).strip().lower() in ("none", "all") for v in value):
        raise ValueError("none and all stand alone: give `none` or `all`, not in a list")
    rules = tuple(sorted(set(parse_rule(v) for v in value)))
    return rules or "none"


def narrow(asked: Egress, allowed: Egress) -> tuple[Egress, list[str]]:
    """What a container gets when the file asks `asked` and the caller allows `allowed`:
    the stricter of the two (the caller narrows, never widens). Returns it and a note for
    each entry of the file the caller's allowlist does not cover (dropped)."""
    if allowed == "all" or asked == "none":
        return asked, []
    if allowed == "none":
        return "none", ["the caller's policy allows no egress"]
    if asked == "all":
        return allowed, []
    assert not isinstance(asked, str) and not isinstance(allowed, str)
    kept = tuple(r for r in asked if any(a.covers(r) for a in allowed))
    dropped = [str(r) for r in asked if r not in kept]
    notes = [f"{', '.join(dropped)} not allowed by the caller's egress policy"] if dropped else []
    return (kept or "none"), notes


def takes_away(old: Egress, new: Egress) -> bool:
    """Whether going from `old` to `new` stops something `old` let through."""
    if old == "none" or new == "all":
        return False
    if new == "none" or old == "all":
        return True
    return any(not any(n.covers(o) for n in new) for o in old)


def describe(egress: Egress) -> str:
    """One line for messages and tables: none, all, or the entries."""
    return egress if isinstance(egress, str) else ", ".join(str(r) for r in egress)
