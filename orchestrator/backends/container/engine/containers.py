"""What the container backends ask of an engine through its CLI, as typed operations:
inspect, pause, remove and list containers, networks, volumes and images; commit, logs,
build; a container beside a paused one; and what `orchestrator doctor` asks. Each is one
bounded call, its failure typed (errors.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from orchestrator.backends.container.engine import api, cli
from orchestrator.backends.container.engine.api import TooLong
from orchestrator.backends.container.engine.bounds import (
    backstop,
    bounded,
    engine_timeout,
    up_timeout,
)
from orchestrator.backends.container.engine.core import EngineCore
from orchestrator.backends.container.engine.errors import (
    CallFailed,
    NoSuchContainer,
    NoSuchImage,
    NoSuchNetwork,
)
from orchestrator.backends.container.layout import FORWARDS_LABEL, parse_forwards
from orchestrator.errors import DockerError, OrchestratorError, UsageError
from orchestrator.spec.published import Protocol, PublishedPort

if TYPE_CHECKING:
    from python_on_whales import Container

Kind = Literal["container", "network", "volume"]
_LIST = {"container": ("ps", "-a"), "network": ("network", "ls"), "volume": ("volume", "ls")}
_API_LIST = {"container": "/containers/json", "network": "/networks", "volume": "/volumes"}
"""Where each kind is listed through the API, where the engine is on this machine's socket
(no docker CLI process: about 12 ms less each, and `ps` makes three)."""
_API_FIELDS = {"ID": "Id", "State": "State", "Name": "Name", "Ports": "Ports"}
"""The API's name of each field a listing may ask for (`rows`)."""


def _api_value(item: dict[str, Any], field: str) -> Any:
    """A `rows` field of an object as the API lists it (see `_api_rows`)."""
    value = item.get(_API_FIELDS[field])
    if field != "Ports":
        return value if isinstance(value, str) else None if field in ("ID", "Name") else ""
    out = []
    for port in value if isinstance(value, list) else []:
        if not isinstance(port, dict):
            continue
        ip, host, inside, proto = (port.get(k) for k in ("IP", "PublicPort", "PrivatePort", "Type"))
        if isinstance(host, int) and isinstance(inside, int) and isinstance(ip, str) and ip:
            out.append(f"{f'[{ip}]' if ':' in ip else ip}:{host}->{inside}/{proto}")
    return ", ".join(out)


class ContainerOps(EngineCore):
    # ----- inspecting ----------------------------------------------------------------------
    def inspect(
        self, *names: str, fmt: str | None = None, kind: str | None = None, action: str
    ) -> str:
        """`docker inspect` of `names` (of `kind`: container, image, network, task), each
        as the Go template `fmt` gives it (None: the JSON list)."""
        words = [*(["--type", kind] if kind else []), *(["--format", fmt] if fmt else [])]
        return self.run("inspect", *words, "--", *names, action=action, retry=True)

    def paused_states(self, containers: Sequence[str]) -> list[tuple[bool, bool]]:
        """(running, paused) of each container, in order (one call)."""
        fmt = "{{.State.Running}} {{.State.Paused}}"
        out = self.inspect(*containers, fmt=fmt, action="inspecting the containers")
        rows = [line.split() for line in out.splitlines() if line.strip()]
        return [(row[0] == "true", row[-1] == "true") for row in rows]

    def image_config(self, container: str) -> dict[str, object]:
        """The config of the image a container runs (its entrypoint, command and user)."""
        image = self.inspect(
            container, fmt="{{.Image}}", kind="container", action="inspecting a service"
        ).strip()
        raw = self.inspect(
            image, fmt="{{json .Config}}", kind="image", action="inspecting a service's image"
        )
        config = json.loads(raw.strip() or "null")
        return config if isinstance(config, dict) else {}

    def status(self, container: str) -> str:
        """created, running, paused, exited, ... of a container."""
        fmt = "{{.State.Status}}"
        return self.inspect(
            container, fmt=fmt, kind="container", action="inspecting a service"
        ).strip()

    # ----- pause ---------------------------------------------------------------------------
    def pause(self, containers: Sequence[str]) -> None:
        """Freeze the containers (the cgroup freezer: FreezerBusy when it gave up)."""
        self.run("pause", *containers, action=f"pause of {len(containers)} container(s)")

    def unpause(self, containers: Sequence[str]) -> None:
        self.run("unpause", *containers, action=f"unpause of {len(containers)} container(s)")

    def signal(self, container: str, sig: str, *, action: str) -> None:
        """Send its first process `sig` (HUP, ...)."""
        self.run("kill", "--signal", sig, container, action=action)

    def restart(self, container: str, *, grace: int, action: str) -> None:
        """Stop (SIGTERM, SIGKILL after `grace` seconds) and start it again."""
        self.run("restart", "--time", str(grace), container, action=action)

    def first_process(self, container: str) -> tuple[str, int]:
        """A container's full id and the host pid of its first process (0: none runs)."""
        said = self.inspect(
            container, fmt="{{.Id}}\t{{.State.Pid}}", action="inspecting the sandbox"
        )
        ident, _, pid = said.strip().partition("\t")
        return ident, int(pid) if pid.isdigit() else 0

    # ----- listing and removing, by label and id -------------------------------------------
    def rows(
        self, kind: Kind, fields: Sequence[str], labels: Sequence[str], *, label: str, retry: bool
    ) -> list[list[Any]]:
        """One listing of the objects of `kind` carrying `label`, each a list of its
        `fields` (ID, State, Ports, Name) then of its `labels` (JSON-quoted, so any value
        parses; "" when unset). Nothing is inspected afterwards: an object removed by
        someone else meanwhile cannot fail it."""
        if self.socket is not None and kind in _API_LIST:
            with contextlib.suppress(TooLong):
                return self._api_rows(kind, fields, labels, label=label, retry=retry)
        parts = [f"{{{{json .{f}}}}}" for f in fields]
        parts += [f"{{{{json (.Label {json.dumps(k)})}}}}" for k in labels]
        fmt = "[" + ",".join(parts) + "]"
        words = [*_LIST[kind], *(["--no-trunc"] if kind != "volume" else [])]
        out = self.listing(
            *words,
            "--filter",
            f"label={label}",
            "--format",
            fmt,
            action=f"listing ({' '.join(words)})",
            gone=(NoSuchContainer, NoSuchNetwork),
            retry=retry,
        )
        try:  # (lines end at "\n" only: a label may hold U+0085 or U+2028 unescaped)
            return [json.loads(line) for line in out.split("\n") if line.strip()]
        except ValueError as exc:
            raise DockerError(f"listing ({' '.join(words)}) could not be read: {exc}") from None

    def _api_rows(
        self, kind: Kind, fields: Sequence[str], labels: Sequence[str], *, label: str, retry: bool
    ) -> list[list[Any]]:
        """`rows` from the API: the same lists, but for Ports, which is written in one form
        `parse_ports` reads ("IP:HOST->PORT/PROTO" for each published port, an IPv6 address
        in brackets), where the docker CLI groups ranges, in an order of its version's."""
        unknown = [f for f in fields if f not in _API_FIELDS]
        if unknown:
            raise UsageError(f"a {kind} listing from the API gives no {unknown}")
        action = f"listing ({' '.join(_LIST[kind])})"
        gone = (NoSuchContainer, NoSuchNetwork)
        query = {"all": "1"} if kind == "container" else None
        items = self.listed(
            _API_LIST[kind], label, action=action, gone=gone, retry=retry, query=query
        )
        if kind != "container":  # (as the CLI lists them; containers: newest first, in both)
            items.sort(key=lambda i: str(i.get("Name")))
        found = []
        for item in items:
            row = [_api_value(item, field) for field in fields]
            if isinstance(row[0], str) and row[0]:
                said = item.get("Labels")
                values = said if isinstance(said, dict) else {}
                found.append([*row, *(str(values.get(k) or "") for k in labels)])
        return found

    def ids(self, kind: Kind, *, label: str, action: str) -> list[str]:
        """Ids (a volume's: its name) of the objects of `kind` carrying `label`."""
        words = [*_LIST[kind], "-q", *(["--no-trunc"] if kind != "volume" else [])]
        return self.run(*words, "--filter", f"label={label}", action=action, retry=True).split()

    def remove_containers(self, ids: Sequence[str], *, action: str) -> None:
        """Remove the containers, running or not, with their anonymous volumes."""
        self.run("rm", "--force", "--volumes", "--", *ids, action=action)

    def remove_volumes(self, names: Sequence[str], *, action: str) -> None:
        self.run("volume", "rm", "--", *names, action=action)

    def remove_networks(self, ids: Sequence[str], *, action: str) -> None:
        self.run("network", "rm", "--", *ids, action=action)

    def joined(self, network: str) -> list[str]:
        """What holds `network`: the ids of the containers that joined it, and for an
        endpoint whose container is gone (the engine can leave one when a removal races its
        own cleanup; the network is then "in use" for good) the endpoint's name, which a
        forced disconnect takes instead."""
        fmt = "{{range $id, $c := .Containers}}{{json $id}} {{json $c.Name}}\n{{end}}"
        out = self.inspect(
            network, fmt=fmt, kind="network", action=f"listing what joined {network}"
        )
        found = []
        for line in out.split("\n"):
            ident, _, name = line.strip().partition(" ")  # (an id, as JSON, has no space)
            if not ident:
                continue
            try:
                ident, name = json.loads(ident), json.loads(name or '""')
            except ValueError:
                continue
            stale = str(ident).startswith("ep-") and isinstance(name, str) and name
            found.append(name if stale else str(ident))
        return found

    def disconnect(self, network: str, container: str) -> None:
        self.run(
            "network",
            "disconnect",
            "--force",
            network,
            container,
            action=f"disconnecting {container} from {network}",
        )

    def image_ids(self, *, labels: Sequence[str], action: str) -> list[str]:
        """Ids of the images carrying every one of `labels` (KEY or KEY=VALUE); one removed
        while listed does not fail the listing."""
        if self.socket is not None and labels:
            with contextlib.suppress(TooLong):
                return self._api_image_ids(labels, action=action)
        filters = [word for label in labels for word in ("--filter", f"label={label}")]
        out = self.listing(
            "image", "ls", "-q", "--no-trunc", *filters, action=action, gone=(NoSuchImage,)
        )
        return sorted(set(out.split()))

    def _api_image_ids(self, labels: Sequence[str], *, action: str) -> list[str]:
        """`image_ids` from the API, asked by one label (Podman answers several in a list
        with none at all) and held to the others here."""
        asked = next((label for label in labels if "=" in label), labels[0])
        found = set()
        for item in self.listed(
            "/images/json", asked, action=action, gone=(NoSuchImage,), retry=True
        ):
            said = item.get("Labels")
            have = said if isinstance(said, dict) else {}
            if item.get("Id") and all(_carries(have, w) for w in labels):
                found.add(str(item["Id"]))
        return sorted(found)

    def image_labels(self, image: str) -> tuple[str, dict[str, str]]:
        """An image's id and labels (NoSuchImage: none by that name or id), through the CLI
        alone."""
        out = self.inspect(
            image,
            fmt="[{{json .Id}},{{json .Config.Labels}}]",
            kind="image",
            action="inspecting a snapshot image",
        )
        try:
            answer = json.loads(out)
        except ValueError:
            answer = None
        if not (isinstance(answer, list) and len(answer) == 2 and isinstance(answer[0], str)):
            raise DockerError(f"inspecting image {image}: the engine answered {out[:200]!r}")
        labels = answer[1] if isinstance(answer[1], dict) else {}
        return answer[0], {str(k): str(v) for k, v in labels.items()}

    def remove_image(self, image: str, *, action: str) -> None:
        """Remove an image by name or id, never forced (one a container runs stays)."""
        self.run("image", "rm", "--", image, action=action, retry=True)

    # ----- images of containers, and their logs ----------------------------------------------
    def commit_cli(self, container: str, tag: str, *, pause: bool, changes: Sequence[str]) -> None:
        """`docker commit` of a container as `tag`, with Dockerfile instructions `changes`
        (a LABEL line)."""
        words = ["commit", f"--pause={str(pause).lower()}"]
        for change in changes:
            words += ["--change", change]
        self.run(*words, container, tag, action=f"committing {container}")

    def logs(
        self,
        container: str,
        *,
        tail: int | None,
        follow: bool,
        since: str | None = None,
        timestamps: bool = False,
        stdout_only: bool = False,
        within: float | None = None,
    ) -> Iterator[bytes]:
        """A container's log (both streams; its stdout alone with `stdout_only`) as it
        comes; ended when the caller stops reading, and after `within` seconds (default
        LOGS_TIMEOUT) unless `follow`. `since`: only lines logged at or after that
        timestamp (RFC 3339, as `timestamps` puts before each line)."""
        limit = None if follow else (LOGS_TIMEOUT if within is None else within)
        if self.socket is not None and since is None and not timestamps and not stdout_only:
            return api.logs(self.socket, container, tail=tail, follow=follow, within=limit)
        words = ["logs", *(["--tail", str(tail)] if tail is not None else [])]
        words += ["--follow"] if follow else []
        words += ["--since", since] if since else []
        words += ["--timestamps"] if timestamps else []
        return self.output(*words, container, limit=limit, both=not stdout_only)

    def build_argv(
        self,
        tag: str,
        *,
        labels: Mapping[str, str],
        dockerfile: Path,
        network: str,
        limits: Mapping[str, object],
        args: Mapping[str, str],
        context: Path,
    ) -> list[str]:
        """`docker build` of one image with the classic builder (the one that takes
        --network, --memory and --cpu-quota for its RUN steps; run with DOCKER_BUILDKIT=0),
        bounded by the up timeout. `--force-rm`: it otherwise keeps the container of a
        failed step, unlabelled, one more for every failed `up`."""
        words = ["build", "--force-rm", "--pull=false", "--tag", tag]
        for key, value in labels.items():
            words += ["--label", f"{key}={value}"]
        words += ["--file", str(dockerfile), "--network", network]
        if "mem_limit" in limits:  # no swap: as the container's own
            words += [
                "--memory",
                str(limits["mem_limit"]),
                "--memory-swap",
                str(limits["mem_limit"]),
            ]
        if "cpus" in limits:
            quota = str(int(float(str(limits["cpus"])) * 100000))
            words += ["--cpu-period", "100000", "--cpu-quota", quota]
        for key, value in args.items():
            words += ["--build-arg", f"{key}={value}"]
        return self.argv(*words, "--", str(context), seconds=up_timeout())

    # ----- what the engine has ---------------------------------------------------------------
    def runtimes(self) -> dict[str, list[str]]:
        """The engine's runtimes and the arguments each is registered with (`docker info`)."""
        text = self.run(
            "info", "--format", "{{json .Runtimes}}", action="asking the engine for its runtimes"
        )
        try:
            listed = json.loads(text or "{}")
        except ValueError:
            listed = {}
        return {
            str(name): [str(a) for a in (spec or {}).get("runtimeArgs") or []]
            for name, spec in (listed if isinstance(listed, dict) else {}).items()
        }

    def versions(self) -> tuple[str, str]:
        """The docker CLI's version and the engine's (a DockerError: not reachable)."""
        said = self.run(
            "version",
            "--format",
            "{{.Client.Version}} {{.Server.Version}}",
            action="asking the engine's version",
        )
        client, _, server = said.strip().partition(" ")
        return client, server

    def compose_version(self) -> str:
        """The Compose plugin's version (a DockerError: none)."""
        return self.run("compose", "version", "--short", action="asking Compose's version")

    def runs_python(self, image: str) -> bool:
        """Whether python3 runs in `image` (the executor needs it), in a container of no
        network, removed at once."""
        try:
            self.run(
                *("run", "--rm", "--pull=never", "--network", "none", "--log-driver", "none"),
                *("--entrypoint", "python3"),
                image,
                *("-c", "import sys; print(sys.version_info[:2])"),
                action=f"running python3 in {image}",
            )
        except OrchestratorError:
            return False
        return True


LOGS_TIMEOUT = 120.0
"""Seconds `logs` without `follow` may take (an engine that stopped answering)."""


def context_address(name: str) -> str:
    """The engine address of the docker CLI's context `name` (UsageError: no such context)."""
    fmt = "{{.Endpoints.docker.Host}}"
    bound = engine_timeout()
    argv = bounded(["docker", "context", "inspect", "--format", fmt, name], bound)
    try:
        found = cli.run(argv, backstop=backstop(bound)).strip()
    except CallFailed as exc:
        raise UsageError(f"no Docker context {name!r}: {(exc.stderr or '').strip()}") from None
    except FileNotFoundError:
        raise UsageError("no docker CLI to ask for a context (see `orchestrator doctor`)") from None
    if not found:
        raise UsageError(f"no Docker context {name!r}: it names no engine")
    return found


COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_PROJECT = "com.docker.compose.project"


def service_of(labels: Mapping[str, str] | None, default: str = "") -> str:
    """The Compose service a container belongs to, from its labels."""
    return (labels or {}).get(COMPOSE_SERVICE, default)


def published_ports(containers: Iterable[Container]) -> list[PublishedPort]:
    """Published ports of containers (python-on-whales' objects), with ephemeral host ports
    resolved; a port the environment's forwarder publishes is reported as the container
    port it stands for."""
    return _published(
        (c.config.labels or {}, c.name, c.network_settings.ports or {}) for c in containers
    )


def api_published_ports(items: Iterable[dict[str, Any]]) -> list[PublishedPort]:
    """`published_ports` of containers as the API lists them (/containers/json: their
    `Labels`, `Names` and `Ports`), read in the one listing call."""
    seen: list[tuple[Mapping[str, str], str, Mapping[str, Any]]] = []
    for item in sorted(items, key=lambda i: str(i.get("Names") or "")):
        got_labels, names, ports = item.get("Labels"), item.get("Names"), item.get("Ports")
        labels = got_labels if isinstance(got_labels, dict) else {}
        name = str(names[0]).lstrip("/") if isinstance(names, list) and names else ""
        binds: dict[str, list[dict[str, str]]] = {}
        for port in ports if isinstance(ports, list) else []:
            if not isinstance(port, dict):
                continue
            ip, host, inside, proto = (
                port.get(k) for k in ("IP", "PublicPort", "PrivatePort", "Type")
            )
            if isinstance(host, int) and isinstance(inside, int) and proto in ("tcp", "udp"):
                key = f"{inside}/{proto}"
                binds.setdefault(key, []).append({"HostIp": str(ip or ""), "HostPort": str(host)})
        seen.append((labels, name, binds))
    return _published(seen)


def _published(
    containers: Iterable[tuple[Mapping[str, str], str, Mapping[str, Any]]],
) -> list[PublishedPort]:
    """(labels, name, {"PORT/PROTO": [{"HostIp", "HostPort"}...]}) of each container: its
    published ports, the forwarder's reported as the container port each stands for."""
    out = []
    for labels, name, ports in containers:
        service = service_of(labels, name)
        forwards = parse_forwards(labels.get(FORWARDS_LABEL, ""))
        for key, binds in sorted(ports.items()):
            port, _, proto = key.partition("/")
            owner, target = forwards.get((int(port), proto), (service, int(port)))
            out += [
                PublishedPort(
                    owner,
                    target,
                    cast(Protocol, proto),
                    b.get("HostIp", ""),
                    int(b["HostPort"]),
                )
                for b in binds or []
            ]
    return out


def _carries(labels: Mapping[str, object], wanted: str) -> bool:
    """Whether `labels` has `wanted` (KEY, or KEY=VALUE), as a label filter means it."""
    key, eq, value = wanted.partition("=")
    return labels.get(key) == value if eq else key in labels
