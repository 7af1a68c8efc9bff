"""The networks of a Docker environment, and what may leave them (docs/network.md).

Every container of the environment sits on its `default` network, internal unless every one
of them may reach anything (`egress: all`): an internal network has no route out and no
address on the host's side, so nothing leaves it. What may leave does so through containers
of the environment that no sandbox can reconfigure:

- `orchestrator-egress`, the egress gateway: Squid, allowing exactly the allowlist, on the
  `egress` network (the way out) and on the network its clients reach it by;
- `orchestrator-ports`, the port forwarder: socat, publishing the environment's ports from
  an outside network and passing each connection to its container, so a published port
  never puts a sandbox on a routed network;
- containers with `egress: all` join the `egress` network themselves.

A network the caller names (ORCHESTRATOR_EGRESS_NETWORK) may hold other environments: there,
no container of ours may answer to a name a file chooses, as Compose's service-name aliases
would let it (a neighbour's service `api.example.com` would take our allowlisted requests,
its `db` our connections to our own). Such containers join it after they are created, before
they start, with no alias (`NetPlan.late`): known there only by their container name, which
the engine keeps unique, and their id. The gateway listens only on the network its clients
reach it by, and never connects, for a name, to an address of a network it is on.

DNS: a container without `all` resolves only the environment's own names: its resolver
forwards every other name to its own loopback, where nothing answers (the gateway resolves
the names it lets through). Pure: this plans, it runs nothing."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import settings
from orchestrator.backends.container.layout import FORWARDER as FORWARDER
from orchestrator.backends.container.layout import FORWARDS_LABEL
from orchestrator.backends.container.layout import GATEWAY as GATEWAY
from orchestrator.errors import SpecIssue
from orchestrator.spec.egress import Egress, Rule
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import PortMap
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import MAIN

PROXY_PORT = 3128
PROXY_URL = f"http://{GATEWAY}:{PROXY_PORT}"
"""Squid: HTTPS_PROXY (CONNECT tunnels), and anything the plain-HTTP front hands it."""
FRONT_PORT = 3080
FRONT_URL = f"http://{GATEWAY}:{FRONT_PORT}"
"""The plain-HTTP front (templates/gateway/front.py): HTTP_PROXY."""
FRONT_UID_FILE = "/run/orchestrator-gateway/front.uid"
"""In the gateway: the user its front runs as, one of its own (templates/gateway/start)."""
RULES_DIR = "gateway/rules"
"""The folder of the gateway's rules, relative to the project folder: mounted read-only into
the gateway whole (not its one file), so a change renames a new file into it, which Squid
reads whole or not at all."""
RULES_FILE = f"{RULES_DIR}/rules.conf"
"""The gateway's allowlist rules, relative to the project folder."""
RULES_MOUNT = "/etc/orchestrator-gateway/rules"
EGRESS_NETWORK_ENV = settings.EGRESS_NETWORK.name
EGRESS_DNS_ENV = settings.EGRESS_DNS.name
PINNED_DNS = ("127.0.0.1",)
"""Where a container without `all` sends names that are not the environment's: its own
loopback, where nothing answers, so nothing resolves and no query leaves."""
PINNED_DNS_OPTIONS = ("timeout:1", "attempts:1")
"""So that such a name fails in about a second, not the resolver's usual five."""
FAR_PORT = 40000
"""First port the forwarder listens on for a container port another one already uses."""
PROXY_VARS = {
    "HTTP_PROXY": FRONT_URL,
    "http_proxy": FRONT_URL,
    "HTTPS_PROXY": PROXY_URL,
    "https_proxy": PROXY_URL,
}
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")


def egress_network() -> str:
    """The caller's shared network's name (ORCHESTRATOR_EGRESS_NETWORK), or ""."""
    return settings.EGRESS_NETWORK.get()


def egress_dns() -> tuple[str, ...]:
    return settings.EGRESS_DNS.get()


@dataclass
class Forward:
    service: str
    port: int
    protocol: str
    listen: int
    published: str
    """The Compose port string the forwarder publishes ("127.0.0.1:8000:8000/tcp")."""


@dataclass
class NetPlan:
    """How the environment is networked: what the template renders, per container."""

    egress: dict[str, Egress] = field(default_factory=dict)
    """Each networked container's egress, after the caller's policy."""
    networks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Networks beyond `default` (egress, ingress, proxy): internal, external, subnet."""
    default_internal: bool = True
    members: dict[str, list[str]] = field(default_factory=dict)
    """The networks of each container (when more than `default`)."""
    dns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    dns_options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Variables added to a container's environment (the proxy's)."""
    gateway: dict[str, Any] | None = None
    forwarder: dict[str, Any] | None = None
    direct_ports: bool = True
    """Containers publish their own ports (every container may reach anything anyway)."""
    late: dict[str, list[str]] = field(default_factory=dict)
    """Networks a container joins after it is created, before it starts, with no alias (by
    their engine names: the caller's shared network)."""
    rules: str | None = None
    """The gateway's rules file."""
    proxied: list[str] = field(default_factory=list)
    """The containers that reach outside through the gateway (its clients)."""
    warnings: list[str] = field(default_factory=list)
    issues: list[SpecIssue] = field(default_factory=list)

    @property
    def infra(self) -> list[str]:
        """The environment's own containers (gateway, forwarder)."""
        return [s["name"] for s in (self.gateway, self.forwarder) if s]


def _field(name: str) -> str:
    return "network.egress" if name == MAIN else f"services.{name}.egress"


_NEVER = [
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "0.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/4",
        "::1/128",
        "fe80::/10",
        "ff00::/8",
    )
]
"""Squid's `orch_never` (templates/gateway/squid.conf): never reached through a name, nor
through a range that merely contains them; an entry inside one of them is a choice."""


_SAFE = re.compile(r"^[a-z0-9_.:/-]+$")


def gateway_rules(egress: Egress) -> str:
    """The gateway's rules for what its clients may reach now: nothing, anything (through
    the proxy: HTTP and CONNECT, to any host and port but what is never a destination), or
    an allowlist (`squid_rules`)."""
    if egress == "none":
        return "# Generated by orchestrator: nothing may leave. Do not edit.\n"
    if egress == "all":
        return (
            "# Generated by orchestrator: anything may leave through the proxy. Do not edit.\n"
            "http_access allow orch_ipliteral !orch_never !orch_host\n"
            "http_access allow !orch_ipliteral !orch_never !orch_host !orch_local\n"
            "#@front any\n"
        )
    return squid_rules(egress)


def squid_rules(rules: Sequence[Rule]) -> str:
    """The gateway's rules: one `http_access allow` per entry. A name is matched as written
    (never looked up to match, no reverse lookup of an address), and a name let through
    must not resolve to an address that is never a destination (loopback, link-local, the
    host) nor to one on a network the gateway is on (`orch_local`: its own environment's,
    or a shared one, whose names anyone there may take). An address range matches only
    requests that name an address (`orch_ipliteral`, strict: no name is ever looked up
    to match a range), and is taken as asked, but for what is never a destination."""
    lines = ["# Generated by orchestrator from network.egress. Do not edit."]
    for i, rule in enumerate(rules):
        if not _SAFE.match(rule.value):  # parse_rule never makes one: a second lock
            raise ValueError(f"not an allowlist value: {rule.value!r}")
        acl = f"orch_e{i}"
        if rule.kind == "name":
            lines.append(f"acl {acl} dstdomain -n {rule.value}")
        elif rule.kind == "suffix":
            escaped = rule.value.replace(".", r"\.")
            lines.append(f"acl {acl} dstdom_regex -n -i \\.{escaped}$")
        else:
            lines.append(f"acl {acl} dst {rule.value}")
        ports = ""
        if rule.ports:
            lines.append(f"acl {acl}p port {' '.join(str(p) for p in rule.ports)}")
            ports = f" {acl}p"
        guard = " !orch_never !orch_host"
        if rule.kind != "net":  # a name never leads to a network the gateway is on
            guard += " !orch_local"
        elif any(
            n.version == rule.network().version and rule.network().subnet_of(n)  # type: ignore[arg-type]
            for n in _NEVER
        ):
            guard = ""  # asked for by address, on purpose (169.254.169.254, say)
        if rule.kind == "net":  # an address the request names: no lookup needed to match
            lines.append(f"http_access allow orch_ipliteral {acl}{ports}{guard}")
        else:
            lines.append(f"http_access allow {acl}{ports}{guard}")
            # the plain-HTTP front's copy of a name's rule (front.py; Squid skips comments):
            # it serves a name's requests itself, and hands Squid whatever it does not
            ports_text = " ".join(str(p) for p in rule.ports)
            lines.append(f"#@front {rule.kind} {rule.value} {ports_text}")
    return "\n".join(lines) + "\n"


def _neighbour(subnet: str | None, i: int) -> str | None:
    """The i-th subnet after `subnet`, of its size (before it, past the end of its /16):
    extra networks take these, and an overlap retries the whole start with a new one."""
    if subnet is None:
        return None
    net = ipaddress.ip_network(subnet)
    size = net.num_addresses
    start = int(net.network_address) + i * size
    if (start >> 16) != (int(net.network_address) >> 16):
        start = int(net.network_address) - i * size
    return str(ipaddress.ip_network((start, net.prefixlen)))


def _listen(subnet: str | None) -> list[str]:
    """The gateway's clients' network (templates/gateway/start listens only on its address
    there); none when it is not known (a render without a subnet) or not IPv4, and the
    gateway then listens on every network but the one its default route leaves by."""
    if subnet is None or ipaddress.ip_network(subnet).version != 4:
        return []
    return [subnet]


def _net(
    *, internal: bool = False, subnet: str | None = None, external: str = ""
) -> dict[str, Any]:
    return {"internal": internal, "subnet": subnet, "external": external}


def plan_network(
    env: Environment,
    policy: Policy,
    *,
    networked: Sequence[str],
    ports: Mapping[str, Sequence[PortMap]],
    compose_ports: Mapping[str, list[str]],
    subnet: str | None,
    leave_by: str = "",
    resolvers: tuple[str, ...] = (),
) -> NetPlan:
    """Plan the networks of the containers `networked` (main when it is on the project's
    network, and every service), with the ports each publishes (`compose_ports`: as Compose
    strings, in the same order)."""
    plan = NetPlan()
    for name in networked:
        got, notes = policy.egress_of(env.spec, name)
        plan.egress[name] = got
        plan.warnings += notes
    phased = False  # the sandbox's egress changes for setup (`setup.egress`)
    if MAIN in networked:
        setup, notes = policy.setup_egress_of(env.spec)
        plan.warnings += notes
        phased = setup is not None and setup != plan.egress[MAIN]
    # a phased sandbox goes through the gateway whatever its phase allows
    listed = [n for n in networked if isinstance(plan.egress[n], tuple)]
    if phased:
        listed = [MAIN, *(n for n in listed if n != MAIN)]
    every = [n for n in networked if plan.egress[n] == "all" and n not in listed]
    closed = [n for n in networked if plan.egress[n] == "none" and n not in listed]
    if phased and len(listed) > 1:
        plan.issues.append(
            SpecIssue(
                env.source,
                field="setup.egress",
                message=f"setup changes what the egress gateway lets through, and "
                f"{', '.join(_field(n) for n in listed[1:])} goes through it too (an "
                "allowlist): the gateway has one set of rules for all its clients",
                fix="give those services `egress: none` or `all`, or drop setup.egress",
            )
        )
        return plan
    if networked and len(every) == len(networked) and not leave_by:  # none to hold in
        plan.default_internal = False
        for name in networked:
            if resolvers:
                plan.dns[name] = resolvers
        return plan
    lists = {plan.egress[n] for n in listed}
    if len(lists) > 1:
        first = listed[0]
        for name in listed[1:]:
            if plan.egress[name] != plan.egress[first]:
                plan.issues.append(
                    SpecIssue(
                        env.source,
                        field=_field(name),
                        message=f"this allowlist differs from {_field(first)}'s: an "
                        "environment has one egress gateway, with one allowlist",
                        fix="give every container that has an allowlist the same one (or none, "
                        "or all)",
                    )
                )
        return plan
    published = [n for n in networked if ports.get(n)]
    outside = bool(every) or bool(listed) or bool(published)
    if outside and not leave_by:
        plan.networks["egress"] = _net(subnet=_neighbour(subnet, 1))
    leave = [] if leave_by else ["egress"]  # the way out in the Compose file (not a shared one)
    ingress = "egress"
    if published and leave_by:  # never publish through a network someone else made
        ingress = "ingress"
        plan.networks["ingress"] = _net(subnet=_neighbour(subnet, 2))
    reach = "default"
    if listed and closed:  # a container without egress must not reach the proxy at all
        reach = "proxy"
        plan.networks["proxy"] = _net(internal=True, subnet=_neighbour(subnet, 3))
    for name in networked:
        nets = ["default"]
        if name in every:
            nets += leave
            if leave_by:
                plan.late[name] = [leave_by]
            if resolvers:
                plan.dns[name] = resolvers
        else:
            plan.dns[name] = PINNED_DNS
            plan.dns_options[name] = PINNED_DNS_OPTIONS
        if name in listed and reach == "proxy":
            nets.append("proxy")
        if len(nets) > 1:
            plan.members[name] = nets
    if listed:
        plan.proxied = listed
        plan.rules = gateway_rules(plan.egress[listed[0]])  # a phased sandbox's: the run's
        no_proxy = ",".join(["localhost", "127.0.0.1", "::1", *networked, GATEWAY])
        for name in listed:
            plan.env[name] = {
                **PROXY_VARS,
                **{v: no_proxy for v in NO_PROXY_VARS},
            }
        plan.gateway = {
            "name": GATEWAY,
            "networks": [reach, *leave],
            "dns": list(resolvers),
            "listen": _listen(subnet if reach == "default" else _neighbour(subnet, 3)),
        }
        if leave_by:
            plan.late[GATEWAY] = [leave_by]
    if published:
        plan.direct_ports = False
        forwards = _forwards(published, ports, compose_ports)
        plan.forwarder = {
            "name": FORWARDER,
            "networks": ["default", ingress],
            "ports": [f.published for f in forwards],
            "args": [f"{f.protocol}:{f.listen}:{f.service}:{f.port}" for f in forwards],
            "labels": {
                FORWARDS_LABEL: ",".join(
                    f"{f.listen}/{f.protocol}={f.service}:{f.port}" for f in forwards
                )
            },
            "dns": list(PINNED_DNS),
            "dns_options": list(PINNED_DNS_OPTIONS),
        }
    return plan


def _forwards(
    published: Sequence[str],
    ports: Mapping[str, Sequence[PortMap]],
    compose_ports: Mapping[str, list[str]],
) -> list[Forward]:
    """One forward per published port; each listens on the container port it stands for,
    unless another forward took that number already."""
    taken: set[tuple[int, str]] = set()
    spare = FAR_PORT
    out = []
    for name in published:
        for port, text in zip(ports[name], compose_ports[name], strict=True):
            listen = port.container
            while (listen, port.protocol) in taken:
                listen, spare = spare, spare + 1
            taken.add((listen, port.protocol))
            host_part = text.rsplit(":", 1)[0]  # "IP:HOST" of "IP:HOST:PORT/PROTO"
            out.append(
                Forward(
                    name,
                    port.container,
                    port.protocol,
                    listen,
                    f"{host_part}:{listen}/{port.protocol}",
                )
            )
    return out
