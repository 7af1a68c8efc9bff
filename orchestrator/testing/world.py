"""A small hermetic "outside world" for egress tests and benches: fake outside servers and a
logging DNS resolver behind a Docker network of its own, so nothing reaches past the machine.

`start_world()` makes the network (routed, but with no address on the host's side of its
bridge) and a hub container that takes the network's gateway address and, per served name, an
address of TEST-NET-3 (203.0.113.0/24, never routed anywhere): a container on the network
reaches those through its default route, that is through the hub, and never through the host.
In the hub's network namespace run, per served name, a server answering HTTP on 80, HTTPS on
443 (a self-signed certificate for the name) and a plain TCP echo on 7000, on that name's
address; and a resolver answering A queries for the served names and NXDOMAIN for every other
name, which logs each query name it receives (`World.queries()`). No container of the world
has a name or alias on the network: a served name resolves only through the resolver, and is
never on a network the egress gateway under test is on (the gateway refuses those for names).
The gateway joins `World.network` as its "egress network"; `World.close()` removes everything
the world made, by id.

The `docker` CLI is used through subprocess, so that the module stands alone."""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator import settings
from orchestrator.testing import world_files
from orchestrator.testing.world_files import Left

__all__ = ["LABEL", "PYTHON_IMAGE", "World", "start_world"]

PYTHON_IMAGE = settings.PYTHON_IMAGE.get()
HUB_IMAGE = settings.BUSYBOX_IMAGE.get()
"""The hub's image: anything with busybox's `ip`."""
OUTSIDE = "203.0.113."
"""The served names' addresses: OUTSIDE + 10, 11, ... (TEST-NET-3, held by the hub alone)."""
HUB_READY = "/tmp/hub-ready"
"""Made by the hub once it holds its addresses."""
LABEL = "org.orchestrator.test=1"
"""Carried by every container and network a world makes."""
WORLD_LABEL = "org.orchestrator.test.world"
"""Its value is the world's own token: finds what a call that timed out made (by id after)."""
QUERY_LOG = "/tmp/queries.log"
"""The resolver's log of query names, one a line, inside its container."""
MOUNT = "/world"
"""Where the scripts and certificates are mounted (read-only) in every world container."""
DOCKER_TIMEOUT = 30.0
"""Seconds one docker CLI call of close() or queries() may take."""


def _new_token() -> str:
    """The world's own token (names its network, labels its objects)."""
    return secrets.token_hex(6)


@dataclass
class World:
    """A running test world; `close()` (or leaving the `with` block) removes it."""

    network: str
    """Name of the test network (routed through the hub alone, labelled)."""
    subnet: str
    """Its subnet."""
    resolver_ip: str
    """IP of the logging DNS resolver on it (the hub's address)."""
    hosts: dict[str, str]
    """Served name -> the address its server answers on (not on the network: beyond the
    hub, reached through the network's gateway address)."""
    servers: dict[str, str] = field(default_factory=dict)
    """Served name -> the id of its server's container."""
    certs: dict[str, str] = field(default_factory=dict, repr=False)
    """Served name -> its self-signed certificate (PEM), for clients that verify."""
    network_id: str = ""
    containers: list[str] = field(default_factory=list)
    """Ids of the world's containers (the hub's first, the resolver's last)."""
    token: str = ""
    """The value of the label `org.orchestrator.test.world` on all the world made."""
    _folder: Path | None = field(default=None, repr=False)
    _resolver: str = field(default="", repr=False)
    _seen: int = field(default=0, repr=False)
    """Lines of the query log that were the readiness probe's, not the caller's."""
    _late: bool = field(default=False, repr=False)
    """A call of its start outlived its deadline (what it asked for may come later)."""

    def queries(self) -> list[str]:
        """Every query name the resolver received so far (lower-case, no trailing dot), in
        order; the readiness probe's queries are left out."""
        if not self._resolver:
            return []
        out = _docker(["exec", self._resolver, "cat", QUERY_LOG], timeout=DOCKER_TIMEOUT)
        return out.splitlines()[self._seen :]

    def requests(self, name: str) -> list[dict[str, Any]]:
        """What the server of served name `name` got on /echo so far, oldest first: each
        request's method, path, headers ([name, value] pairs), body, and whether over TLS."""
        server = self.servers[name]
        out = _docker(
            ["exec", server, "sh", "-c", "cat /tmp/requests.log 2>/dev/null || true"],
            timeout=DOCKER_TIMEOUT,
        )
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def close(self) -> None:
        """Remove every container and the network the world made, by id, and its temporary
        folder; idempotent. Raises RuntimeError naming what could not be removed. When a
        call of its start outlived its deadline, the engine may still make what it asked
        for after this looked, and a removal may outlive its own: it looks again, a few
        times over LATE_PAUSES."""
        problems: list[str] = []
        self._sweep(problems)
        for pause in LATE_PAUSES:
            # a removal the loaded engine did not finish within its call's bound (CI: a
            # network's, while 64 environments made theirs) is asked for again: only the
            # last look's problems count
            if not (self._late or problems):
                break
            time.sleep(pause)
            problems = []
            self._sweep(problems)
        self._resolver = ""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if problems:
            raise RuntimeError("the test world was not removed whole: " + "; ".join(problems))

    def _sweep(self, problems: list[str]) -> None:
        found: list[str] = []
        if self.token:  # what a call that timed out made without telling its id
            selector = f"label={WORLD_LABEL}={self.token}"
            for kind in (["ps", "-aq", "--no-trunc"], ["network", "ls", "-q", "--no-trunc"]):
                try:
                    listed = _docker([*kind, "--filter", selector], timeout=DOCKER_TIMEOUT)
                except RuntimeError as exc:
                    problems.append(str(exc))
                    continue
                found += [f"{kind[0]}:{ident}" for ident in listed.split()]
        # the hub last: the others live in its network namespace
        containers = [*reversed(self.containers), *(f[3:] for f in found if f.startswith("ps:"))]
        for ident in dict.fromkeys(containers):
            removed = _remove(["rm", "-f", "-v", ident], "No such container", problems)
            if removed and ident in self.containers:
                self.containers.remove(ident)
        networks = [self.network_id] if self.network_id else []
        networks += [f[8:] for f in found if f.startswith("network:")]
        for ident in dict.fromkeys(networks):
            removed = _remove(["network", "rm", ident], "No such network", problems)
            if removed and ident == self.network_id:
                self.network_id = ""

    def __enter__(self) -> World:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_world(
    names: Sequence[str] = ("allowed.test", "www.allowed.test", "denied.test"),
    *,
    image: str = PYTHON_IMAGE,
    timeout: float = 90,
) -> World:
    """Start a world serving `names` and return it once every server and the resolver answer.
    Raises RuntimeError (having removed what it made) if it is not up within `timeout`
    seconds, or when the image or the `openssl` CLI is missing."""
    served = world_files.served_names(names)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the test world needs the openssl CLI on this machine (none on PATH)")
    deadline = time.monotonic() + timeout
    world = World(network="", subnet="", resolver_ip="", hosts={}, token=_new_token())
    try:
        try:
            _build(world, served, image, openssl, deadline, timeout)
        except RuntimeError as exc:
            late = time.monotonic() >= deadline and "did not come up" not in str(exc)
            if late:  # a step cut short by the deadline: say it is the deadline
                raise RuntimeError(
                    f"the test world did not come up within {timeout:g} s: {exc}"
                ) from exc
            raise
    except BaseException as exc:
        world._late = _outlived(exc)
        try:
            world.close()
        except Exception as err:
            exc.add_note(f"cleaning up after it failed too: {err}")
        raise
    return world


LATE_PAUSES = (1.0, 2.0, 4.0)
"""Seconds between the looks of close() after a call outlived its deadline (7 s in all)."""


class _Outlived(RuntimeError):
    """A docker call killed at its deadline: the engine may still do what it was asked."""


def _outlived(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, _Outlived):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _build(
    world: World, served: list[str], image: str, openssl: str, deadline: float, timeout: float
) -> None:
    """Fill `world` step by step (each step recorded at once, for close() to undo)."""

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"the test world did not come up within {timeout:g} s")
        return remaining

    folder = Path(tempfile.mkdtemp(prefix="orch-world-"))
    world._folder = folder
    world_files.write_files(folder, served, openssl, left)
    world.certs = {name: (folder / "certs" / f"{name}.pem").read_text() for name in served}
    for needed in (image, HUB_IMAGE):
        if _docker(["image", "ls", "-q", needed], timeout=left()).strip() == "":
            raise RuntimeError(f"test image {needed} is missing (run scripts/build-images)")
    world.network = f"orch-world-{world.token}"
    labels = ["--label", LABEL, "--label", f"{WORLD_LABEL}={world.token}"]
    gateway, prefix = _network(world, labels, left)
    hub = _hub(world, labels, f"{gateway}/{prefix}", len(served), left)
    world.hosts = {name: f"{OUTSIDE}{10 + i}" for i, name in enumerate(served)}
    common = [*labels, "--pull", "never", "--network", f"container:{hub}"]
    common += ["-v", f"{folder}:{MOUNT}:ro", image, "python3", "-u"]
    servers = []
    for name, address in world.hosts.items():
        argv = ["create", *common, f"{MOUNT}/server.py", name, address]
        ident = _docker(argv, timeout=left()).strip()
        world.containers.append(ident)
        world.servers[name] = ident
        servers.append(ident)
    _docker(["start", *servers], timeout=left())
    pairs = [f"{name}={ip}" for name, ip in world.hosts.items()]
    argv = ["create", *common, f"{MOUNT}/resolver.py", QUERY_LOG, *pairs]
    world._resolver = _docker(argv, timeout=left()).strip()
    world.containers.append(world._resolver)
    _docker(["start", world._resolver], timeout=left())
    world.resolver_ip = _ips(world, [hub], left())[0]
    _wait_until_up(world, left)
    world._seen = len(world.queries())


def _network(world: World, labels: list[str], left: Left) -> tuple[str, int]:
    """Make the world's network: routed (its containers get a default route, through its
    gateway address), with no address on the host's side of the bridge (the hub takes the
    gateway address: nothing a container sends leaves through the host). Returns that
    address and the subnet's prefix length."""
    inhibit = "com.docker.network.bridge.inhibit_ipv4=true"
    argv = ["network", "create", "--opt", inhibit, *labels, world.network]
    world.network_id = _docker(argv, timeout=left()).strip()
    fmt = "{{json .IPAM.Config}}"
    ipam = json.loads(
        _docker(["network", "inspect", "--format", fmt, world.network_id], timeout=left())
    )
    config: dict[str, str] = next((c for c in ipam or [] if "." in c.get("Subnet", "")), {})
    world.subnet = config.get("Subnet", "")
    if not world.subnet:
        raise RuntimeError(f"the world's network has no IPv4 subnet: {ipam}")
    net = ipaddress.ip_network(world.subnet)
    gateway = config.get("Gateway") or str(net.network_address + 1)
    return gateway, net.prefixlen


def _hub(world: World, labels: list[str], gateway: str, served: int, left: Left) -> str:
    """Start the hub: it takes the network's gateway address (`gateway`, with its prefix)
    and the served names' addresses, then sleeps; the servers and the resolver run in its
    network namespace. Returns its id once it holds them all."""
    if served > 200:
        raise ValueError("a test world serves at most 200 names")
    script = f"ip addr add {gateway} dev eth0"
    for i in range(served):
        script += f" && ip addr add {OUTSIDE}{10 + i}/32 dev lo"
    script += f" && touch {HUB_READY} && exec sleep 2147483647"
    argv = ["create", *labels, "--pull", "never", "--network", world.network_id]
    argv += ["--cap-drop", "ALL", "--cap-add", "NET_ADMIN", HUB_IMAGE, "sh", "-c", script]
    hub = _docker(argv, timeout=left()).strip()
    world.containers.append(hub)
    _docker(["start", hub], timeout=left())
    while True:
        ready = subprocess.run(
            ["docker", "exec", hub, "test", "-e", HUB_READY],
            capture_output=True,
            timeout=min(left(), DOCKER_TIMEOUT),
            check=False,
        )
        if ready.returncode == 0:
            return hub
        _fail_if_stopped(world, left())
        time.sleep(min(0.1, left()))


def _ips(world: World, containers: list[str], timeout: float) -> list[str]:
    """Each container's IP on the world's network."""
    fmt = "{{json .NetworkSettings.Networks}}"
    out = _docker(["inspect", "--format", fmt, *containers], timeout=timeout)
    ips = []
    for line in out.splitlines():
        networks: dict[str, dict[str, str]] = json.loads(line)
        # Docker names the network by id here, Podman by name
        ours = (world.network_id, world.network)
        found = [n["IPAddress"] for n in networks.values() if n["NetworkID"] in ours]
        if not found or not found[0]:
            _fail_if_stopped(world, timeout)  # the likely cause, with its logs
            raise RuntimeError(f"a world container has no IP on {world.network}: {networks}")
        ips.append(found[0])
    return ips


def _wait_until_up(world: World, left: Left) -> None:
    """Run the probe in the resolver's container until all answer; fail fast (with its logs)
    when a container of the world has stopped."""
    spec = json.dumps({"hosts": world.hosts, "resolver": world.resolver_ip})
    argv = ["exec", world._resolver, "python3", f"{MOUNT}/probe.py", spec]
    last = ""
    while True:
        try:
            probe = subprocess.run(
                ["docker", *argv],
                capture_output=True,
                text=True,
                timeout=min(left(), 15),
                check=False,
            )
        except subprocess.TimeoutExpired:
            probe = None
        if probe is not None and probe.returncode == 0:
            return
        last = probe.stderr.strip() if probe is not None else "the probe hung"
        _fail_if_stopped(world, left())
        try:
            time.sleep(min(0.2, left()))
        except RuntimeError as exc:
            exc.add_note(f"the last probe said: {last}")
            raise


def _fail_if_stopped(world: World, timeout: float) -> None:
    fmt = "{{.Id}} {{.State.Running}}"
    out = _docker(["inspect", "--format", fmt, *world.containers], timeout=timeout)
    for line in out.splitlines():
        ident, _, running = line.partition(" ")
        if running != "true":
            logs = subprocess.run(
                ["docker", "logs", "--tail", "20", ident],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            raise RuntimeError(
                f"a test world container ({ident[:12]}) stopped as it started: "
                f"{(logs.stdout + logs.stderr).strip()}"
            )


def _remove(argv: list[str], gone: str, problems: list[str]) -> bool:
    """Run a docker removal; True when the object is gone (also when it was already)."""
    try:
        done = subprocess.run(
            ["docker", *argv], capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        problems.append(f"docker {' '.join(argv)}: {exc}")
        return False
    if done.returncode == 0 or gone in done.stderr:
        return True
    problems.append(f"docker {' '.join(argv)}: {done.stderr.strip()}")
    return False


def _docker(args: list[str], *, timeout: float) -> str:
    """Stdout of `docker ARGS`; RuntimeError when it fails or outlives `timeout` seconds."""
    what = f"docker {' '.join(args[:2])}"
    try:
        done = subprocess.run(
            ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise _Outlived(f"{what} did not end within {timeout:.3g} s") from exc
    except FileNotFoundError as exc:
        raise RuntimeError("the docker CLI is missing") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {done.stderr.strip()}")
    return done.stdout
