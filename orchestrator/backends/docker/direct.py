"""Bring a one-container project up through the Engine API instead of `docker compose up`.

Most environments are one sandbox with no network of its own (`network_mode: none`, the
default), no service, no port and no named volume. For those Compose only parses the file,
finds nothing to create but the one container, and makes it: about 0.15 CPU-s and 0.1 s more
per start than creating the same container directly, and about as much again at `down`
(`bench/results/inspect_race.md`, where environments start and end by the hundred).

`direct_run` reads the compose file we rendered (the same text Compose would get) and, when
every key in it is one it knows, says how to create the container Compose would: the same
name, configuration, mounts and labels, plus the labels Compose itself looks for, so
`docker compose ps`, `logs`, `stop`, `kill` and `down` keep working on it. Any other key,
or a value it does not read exactly as Compose does, leaves the project to Compose: what
the fast path cannot make exactly, it does not make. The container is created and started
with two Engine API calls on the local socket (engine/sockets.py), and removed with one: no
docker CLI process, and no network hook for a sandbox with no network (see `_plan`).

ORCHESTRATOR_UP_PATH=compose sends every project through Compose (auto: the fast path where
it applies)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator import settings
from orchestrator.backends.docker.namefiles import unnetworked

UP_PATH_ENV = settings.UP_PATH.name
SERVICE = "main"

_TOP = {"name", "services", "volumes"}
_SERVICE_KEYS = {
    "image",
    "pull_policy",
    "init",
    "runtime",
    "entrypoint",
    "command",
    "working_dir",
    "user",
    "stop_grace_period",
    "network_mode",
    "environment",
    "volumes",
    "mem_limit",
    "memswap_limit",
    "cpus",
    "pids_limit",
    "tmpfs",
    "storage_opt",
    "cap_drop",
    "cap_add",
    "security_opt",
    "labels",
    "logging",
}
_LOG_OPTIONS = {"max-size": "8m", "max-file": "2"}
_LOGGING = {"driver": "json-file", "options": _LOG_OPTIONS}
"""The one `logging` the template writes (compose.yaml.j2's log_bounds), as the engine takes it
below; any other leaves the project to Compose."""
_MOUNT_KEYS = {"type", "source", "target", "read_only", "bind", "volume"}
_PINNED_OPTS = ("type", "o", "device")
"""A pinned host folder's volume (binding.py): the `local` driver binding a descriptor."""
_NETWORK_MODES = {"none"}
"""Only a sandbox without network (the default): the one the comparison test proves alike
(tests/docker/test_direct_up.py); the host's network stays with Compose."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([bkmg]?)")
_SECONDS = re.compile(r"(\d{1,4})s")


def up_path() -> str:
    return settings.UP_PATH.get()


@dataclass(frozen=True)
class DirectRun:
    """How to make a project's only container as Compose would, through the Engine API."""

    name: str
    body: dict[str, Any]
    """Of `POST /containers/create`."""
    folders: tuple[Path, ...]
    """Host folders to make first (Compose's `bind.create_host_path`)."""
    files: dict[Path, str] = field(default_factory=dict)
    """Host files to write first (a sandbox without a network: its name files)."""
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Volumes to make first, by name (pinned host folders), as `POST /volumes/create`."""
    seccomp: Path | None = None
    """The seccomp profile's file, whose text `SecurityOpt` carries (Podman's API takes the
    file's path there instead: `for_podman`)."""

    @property
    def runtime(self) -> str | None:
        got = self.body["HostConfig"].get("Runtime")
        return got if isinstance(got, str) else None

    def sealed(self, gvisor: str, sealed: str) -> DirectRun:
        """The same container on the runtime `sealed` (runsc with no network stack at all:
        memory.py) when it is a gVisor sandbox with no network; else this one."""
        host = self.body["HostConfig"]
        if host.get("Runtime") != gvisor or host.get("NetworkMode") != "none":
            return self
        return replace(self, body={**self.body, "HostConfig": {**host, "Runtime": sealed}})

    def for_podman(self) -> DirectRun:
        """The same container for Podman's Docker-compatible API, which reads a seccomp
        profile from the path `SecurityOpt` names (on its own machine: this one)."""
        if self.seccomp is None:
            return self
        host = dict(self.body["HostConfig"])
        host["SecurityOpt"] = [
            f"seccomp={self.seccomp}" if o.startswith("seccomp=") else o
            for o in host["SecurityOpt"]
        ]
        return replace(self, body={**self.body, "HostConfig": host})


class _Refused(Exception):
    """A key or value the fast path does not make exactly as Compose would."""


def direct_run(compose_yaml: str, project: str, directory: Path) -> DirectRun | None:
    """How to make this project through the Engine API, or None when Compose must."""
    if up_path() != "auto" or not compose_yaml:
        return None
    try:
        doc = _unescaped(YAML(typ="safe").load(compose_yaml))
        return _plan(doc, project, directory)
    except (_Refused, YAMLError, TypeError, ValueError, AttributeError, ArithmeticError):
        return None


def _unescaped(value: Any) -> Any:
    """The file as Compose reads it: every `$` we render is escaped as `$$`; a lone `$` is
    Compose's interpolation, which the fast path does not do."""
    if isinstance(value, str):
        if "$" in value.replace("$$", "") or _SURROGATE.search(value):
            raise _Refused(value)  # interpolation, or a string Compose may read otherwise
        return value.replace("$$", "$")
    if isinstance(value, dict):
        return {_unescaped(k): _unescaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unescaped(v) for v in value]
    return value


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Refused(value)
    return list(value)


def _mapping(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _Refused(value)
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k or "=" in k or "\x00" in k:
            raise _Refused(k)  # the CLI would split NAME=VALUE elsewhere
        if isinstance(v, (dict, list)) or v is None:
            raise _Refused(k)
        out[k] = v if isinstance(v, str) else json.dumps(v)
    return out


def _plan(doc: Any, project: str, directory: Path) -> DirectRun:
    if not isinstance(doc, dict) or set(doc) - _TOP or doc.get("name") != project:
        raise _Refused(doc)
    services = doc.get("services")
    if not isinstance(services, dict) or list(services) != [SERVICE]:
        raise _Refused(services)
    svc = services[SERVICE]
    if not isinstance(svc, dict) or set(svc) - _SERVICE_KEYS:
        raise _Refused(svc)
    if svc.get("network_mode") not in _NETWORK_MODES:  # else Compose makes a network
        raise _Refused("network")
    volumes = _pinned(doc.get("volumes", {}), project)
    made = _container(SERVICE, svc, project, directory, volumes, {})
    config, host = made.config, made.host
    files: dict[Path, str] = {}
    if svc["network_mode"] == "none" and "runtime" not in svc and os.geteuid() == 0:
        # (root's files, as the engine's are: a sandbox user whose uid is ours could
        # otherwise chmod and rewrite them)
        files = unnetworked(config, host, directory)
    body = {**config, "HostConfig": host}
    return DirectRun(made.name, body, made.folders, files, volumes, made.seccomp)


@dataclass(frozen=True)
class _Made:
    """One service's container as the Engine API takes it."""

    name: str
    config: dict[str, Any]
    host: dict[str, Any]
    folders: tuple[Path, ...]
    seccomp: Path | None


def _container(
    service: str,
    svc: dict[str, Any],
    project: str,
    directory: Path,
    volumes: dict[str, dict[str, Any]],
    depends: dict[str, str],
) -> _Made:
    """The keys every container of ours has (`_SERVICE_KEYS`), as Compose sends them."""
    image = svc.get("image")
    if (
        not isinstance(image, str)
        or not image
        or svc.get("pull_policy") not in ("never", "missing")
    ):
        raise _Refused("image")
    if "logging" in svc and svc["logging"] != _LOGGING:
        raise _Refused("logging")
    grace = _SECONDS.fullmatch(str(svc.get("stop_grace_period", "10s")))
    if grace is None:
        raise _Refused("stop_grace_period")
    security, seccomp = _security(svc.get("security_opt", []), directory)
    mounts, folders = _mounts(svc.get("volumes", []), directory, volumes, project)
    labels = {
        **_mapping(svc.get("labels", {})),
        **_compose_labels(project, directory, svc, service, depends),
    }
    config: dict[str, Any] = {
        "Image": image,
        "Env": [f"{k}={v}" for k, v in _mapping(svc.get("environment", {})).items()],
        "Labels": labels,
        "StopTimeout": int(grace.group(1)),
    }
    if service == SERVICE or "entrypoint" in svc:  # (else the image's own, as Compose)
        entrypoint = _strings(svc.get("entrypoint"))
        if not entrypoint or not entrypoint[0]:
            raise _Refused("entrypoint")
        config["Entrypoint"] = entrypoint
    if service == SERVICE or "command" in svc:
        config["Cmd"] = _strings(svc.get("command", []))  # (a string: Compose splits it)
    host: dict[str, Any] = {
        "Init": svc.get("init") is True,
        "Mounts": mounts,
        "CapDrop": _caps(svc.get("cap_drop", [])),
        "CapAdd": _caps(svc.get("cap_add", [])),
        "SecurityOpt": security,
        "RestartPolicy": {"Name": "no"},
        **_limits(svc),
    }
    if "network_mode" in svc:
        host["NetworkMode"] = svc["network_mode"]
    if "logging" in svc:
        host["LogConfig"] = {"Type": "json-file", "Config": dict(_LOG_OPTIONS)}
    for key, name in (("working_dir", "WorkingDir"), ("user", "User")):
        if key in svc:
            if not isinstance(svc[key], str):
                raise _Refused(key)
            config[name] = svc[key]
    if "runtime" in svc:
        if not isinstance(svc["runtime"], str):
            raise _Refused("runtime")
        host["Runtime"] = svc["runtime"]
    return _Made(f"{project}-{service}-1", config, host, tuple(folders), seccomp)


_MANY_KEYS = _SERVICE_KEYS - {"network_mode"} | {
    "networks",
    "dns",
    "dns_opt",
    "sysctls",
    "ulimits",
    "stop_signal",
    "ports",
    "healthcheck",
    "depends_on",
}
"""A container of a project of several: each on the project's networks (never none, never
the host's), its ports, resolvers, kernel settings, health check, and what it waits for."""
_NETWORK_KEYS = {"internal", "driver_opts", "ipam", "labels"}
_PORT = re.compile(r"(127\.0\.0\.1|0\.0\.0\.0)?:(\d{0,5}):(\d{1,5})/(tcp|udp)")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ns|us|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_NANOS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


@dataclass(frozen=True)
class DirectContainer:
    """One container of a project of several, as Compose would make it."""

    service: str
    name: str
    body: dict[str, Any]
    """Of `POST /containers/create` (on its first network, by name order, as Compose)."""
    joins: tuple[tuple[str, tuple[str, ...]], ...]
    """Its other networks (engine names), each with its aliases: joined once created."""
    after: tuple[str, ...]
    """The services started before it (`depends_on`, each `service_started`)."""


@dataclass(frozen=True)
class DirectProject:
    """How to make a project of several containers as Compose would, through the Engine
    API: its networks, its volumes, then each container, then each started once those it
    depends on are."""

    networks: tuple[dict[str, Any], ...]
    """Bodies of `POST /networks/create`."""
    volumes: dict[str, dict[str, Any]]
    containers: tuple[DirectContainer, ...]
    folders: tuple[Path, ...]
    images: tuple[str, ...]

    def waves(self) -> list[list[DirectContainer]]:
        """The containers in the order Compose starts them: each wave once the one before
        has started (those in one wave side by side)."""
        left, done, out = list(self.containers), set[str](), []
        while left:
            wave = [c for c in left if set(c.after) <= done]
            if not wave:  # (a cycle: refused when planned)
                raise ValueError("depends_on has a cycle")
            out.append(wave)
            done |= {c.service for c in wave}
            left = [c for c in left if c.service not in done]
        return out


def direct_project(compose_yaml: str, project: str, directory: Path) -> DirectProject | None:
    """How to make this project of several containers through the Engine API, or None when
    Compose must (a key or value read otherwise than Compose does, a network it does not
    make itself, a dependency other than `service_started`)."""
    if up_path() != "auto" or not compose_yaml:
        return None
    try:
        doc = _unescaped(YAML(typ="safe").load(compose_yaml))
        made = _plan_many(doc, project, directory)
        made.waves()
        return made
    except (_Refused, YAMLError, TypeError, ValueError, AttributeError, ArithmeticError):
        return None


def _plan_many(doc: Any, project: str, directory: Path) -> DirectProject:
    if not isinstance(doc, dict) or set(doc) - {*_TOP, "networks"} or doc.get("name") != project:
        raise _Refused(doc)
    services = doc.get("services")
    if not isinstance(services, dict) or len(services) < 2 or SERVICE not in services:
        raise _Refused(services)
    networks = _networks(doc.get("networks"), project)
    volumes = {**_pinned(_only(doc.get("volumes", {}), pinned=True), project)}
    volumes |= _named(_only(doc.get("volumes", {}), pinned=False), project)
    containers: list[DirectContainer] = []
    folders: list[Path] = []
    images: list[str] = []
    for service, svc in services.items():
        if not isinstance(service, str) or not isinstance(svc, dict) or set(svc) - _MANY_KEYS:
            raise _Refused(service)
        depends = _depends(svc.get("depends_on", {}), services, service)
        made = _container(service, svc, project, directory, volumes, depends)
        if made.seccomp is not None and made.seccomp.parent != directory:
            raise _Refused("seccomp")
        joined = sorted(_strings(svc.get("networks", ["default"])))
        if not joined or len(set(joined)) != len(joined) or set(joined) - set(networks):
            raise _Refused("networks")
        aliases = (made.name, service)
        config, host = made.config, made.host
        host["NetworkMode"] = networks[joined[0]]
        for key, name in (("dns", "Dns"), ("dns_opt", "DnsOptions")):
            if key in svc:
                host[name] = _strings(svc[key])
        if "sysctls" in svc:
            host["Sysctls"] = _mapping(svc["sysctls"])
        if "ulimits" in svc:
            host["Ulimits"] = _ulimits(svc["ulimits"])
        if "stop_signal" in svc:
            if not isinstance(svc["stop_signal"], str) or not svc["stop_signal"]:
                raise _Refused("stop_signal")
            config["StopSignal"] = svc["stop_signal"]
        if "ports" in svc:
            config["ExposedPorts"], host["PortBindings"] = _ports(svc["ports"])
        if "healthcheck" in svc:
            config["Healthcheck"] = _healthcheck(svc["healthcheck"])
        endpoints = {networks[joined[0]]: {"Aliases": list(aliases)}}
        body = {**config, "HostConfig": host, "NetworkingConfig": {"EndpointsConfig": endpoints}}
        joins = tuple((networks[n], aliases) for n in joined[1:])
        containers.append(DirectContainer(service, made.name, body, joins, tuple(depends)))
        folders += made.folders
        images.append(config["Image"])
    bodies = tuple(
        _network_body(key, spec, name, project)
        for key, (name, spec) in sorted(_declared(doc.get("networks"), project).items())
    )
    return DirectProject(bodies, volumes, tuple(containers), tuple(folders), tuple(images))


def _declared(value: Any, project: str) -> dict[str, tuple[str, dict[str, Any]]]:
    if not isinstance(value, dict) or "default" not in value:
        raise _Refused("networks")  # (else Compose makes `default` of its own accord)
    out = {}
    for key, spec in value.items():
        if not isinstance(key, str) or not isinstance(spec, dict) or set(spec) - _NETWORK_KEYS:
            raise _Refused(key)
        out[key] = (f"{project}_{key}", spec)
    return out


def _networks(value: Any, project: str) -> dict[str, str]:
    """Each network of the file by its key, with the engine name Compose gives it."""
    return {key: name for key, (name, _) in _declared(value, project).items()}


def _network_body(key: str, spec: dict[str, Any], name: str, project: str) -> dict[str, Any]:
    internal = spec.get("internal", False)
    if not isinstance(internal, bool):
        raise _Refused("internal")
    subnets: list[dict[str, str]] = []
    ipam = spec.get("ipam")
    if ipam is not None:
        if (
            not isinstance(ipam, dict)
            or set(ipam) != {"config"}
            or not isinstance(ipam["config"], list)
        ):
            raise _Refused(ipam)
        for entry in ipam["config"]:
            if not isinstance(entry, dict) or set(entry) != {"subnet"}:
                raise _Refused(entry)
            subnets.append({"Subnet": str(entry["subnet"])})
    labels = {
        **_mapping(spec.get("labels", {})),
        "com.docker.compose.network": key,
        "com.docker.compose.project": project,
    }
    return {
        "Name": name,
        "CheckDuplicate": True,
        "Driver": "bridge",
        "Internal": internal,
        "Attachable": False,
        "EnableIPv6": False,
        "Options": _mapping(spec.get("driver_opts", {})),
        "IPAM": {"Driver": "default", "Config": subnets, "Options": {}},
        "Labels": labels,
    }


def _only(volumes: Any, *, pinned: bool) -> dict[str, Any]:
    """The file's volumes that are pinned host folders', or the others."""
    if not isinstance(volumes, dict):
        raise _Refused(volumes)
    return {k: v for k, v in volumes.items() if (isinstance(v, dict) and "driver" in v) is pinned}


def _named(volumes: dict[str, Any], project: str) -> dict[str, dict[str, Any]]:
    """The file's plain named volumes (labels only), as the engine creates them."""
    out = {}
    for key, v in volumes.items():
        if not isinstance(v, dict) or set(v) - {"labels"}:
            raise _Refused(v)
        labels = {
            **_mapping(v.get("labels", {})),
            "com.docker.compose.project": project,
            "com.docker.compose.volume": str(key),
        }
        out[str(key)] = {"Name": f"{project}_{key}", "Driver": "local", "Labels": labels}
    return out


def _depends(value: Any, services: dict[str, Any], service: str) -> dict[str, str]:
    """What a container waits for: only services to have started (anything else: Compose
    waits for health or an exit, which it does)."""
    if not isinstance(value, dict):
        raise _Refused(value)
    out = {}
    for name, need in value.items():
        if name not in services or name == service or need != {"condition": "service_started"}:
            raise _Refused(need)
        out[str(name)] = "service_started"
    return out


def _ulimits(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, dict):
        raise _Refused(value)
    out = []
    for name, limit in sorted(value.items()):
        if not isinstance(limit, dict) or set(limit) != {"soft", "hard"}:
            raise _Refused(limit)
        soft, hard = limit["soft"], limit["hard"]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (soft, hard)):
            raise _Refused(limit)
        out.append({"Name": str(name), "Soft": soft, "Hard": hard})
    return out


def _ports(value: Any) -> tuple[dict[str, Any], dict[str, list[dict[str, str]]]]:
    """`ports` in the short form we write ("127.0.0.1::8080/tcp"), as Compose sends them."""
    exposed: dict[str, Any] = {}
    bound: dict[str, list[dict[str, str]]] = {}
    for port in _strings(value):
        found = _PORT.fullmatch(port)
        if found is None:
            raise _Refused(port)
        ip, host, inside, proto = found.groups()
        key = f"{int(inside)}/{proto}"
        exposed[key] = {}
        bound.setdefault(key, []).append({"HostIp": ip or "", "HostPort": host})
    return exposed, bound


def _nanos(value: Any) -> int:
    """A Go duration ("1m30s", "250ms") in nanoseconds, as Compose reads it."""
    text = str(value)
    if isinstance(value, bool) or _DURATION.fullmatch(text) is None:
        raise _Refused(value)
    return sum(round(float(n) * _NANOS[unit]) for n, unit in _DURATION_PART.findall(text))


def _healthcheck(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - {
        "test",
        "interval",
        "timeout",
        "retries",
        "start_period",
    }:
        raise _Refused(value)
    test = value.get("test")
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    test = _strings(test)
    if not test or test[0] not in ("CMD", "CMD-SHELL"):
        raise _Refused(test)
    out: dict[str, Any] = {"Test": test}
    for key, name in (("interval", "Interval"), ("timeout", "Timeout")):
        if key in value:
            out[name] = _nanos(value[key])
    if "start_period" in value:
        out["StartPeriod"] = _nanos(value["start_period"])
    if "retries" in value:
        retries = value["retries"]
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise _Refused(retries)
        out["Retries"] = retries
    return out


def _caps(value: Any) -> list[str]:
    """Capabilities named as Compose sends them (CAP_CHOWN for CHOWN; ALL stays), sorted."""
    return sorted(c if c == "ALL" or c.startswith("CAP_") else f"CAP_{c}" for c in _strings(value))


def _pinned(volumes: Any, project: str) -> dict[str, dict[str, Any]]:
    """The project's volumes, each a pinned host folder's, as the engine creates it under
    the name Compose would give it; any other volume leaves the project to Compose."""
    if not isinstance(volumes, dict):
        raise _Refused(volumes)
    out = {}
    for key, v in volumes.items():
        if not isinstance(v, dict) or set(v) != {"driver", "driver_opts", "labels"}:
            raise _Refused(v)
        opts = v["driver_opts"]
        if v["driver"] != "local" or not isinstance(opts, dict) or tuple(opts) != _PINNED_OPTS:
            raise _Refused(v)
        if opts["type"] != "none" or opts["o"] != "bind" or not isinstance(opts["device"], str):
            raise _Refused(v)
        labels = {
            **_mapping(v["labels"]),
            "com.docker.compose.project": project,
            "com.docker.compose.volume": str(key),
        }
        name = f"{project}_{key}"
        out[str(key)] = {"Name": name, "Driver": "local", "DriverOpts": opts, "Labels": labels}
    return out


def _security(value: Any, directory: Path) -> tuple[list[str], Path | None]:
    """`security_opt` as the engine takes it: a seccomp profile's file (ours, in the project
    folder) becomes its text, as the CLI sends it; and that file."""
    out, profile = [], None
    for opt in _strings(value):
        if opt.startswith("seccomp="):
            named = opt.removeprefix("seccomp=")
            if not named.startswith("./") or "/" in named[2:]:
                raise _Refused(opt)
            profile = directory / named[2:]
            opt = "seccomp=" + json.dumps(json.loads(profile.read_text()), separators=(",", ":"))
        out.append(opt)
    return out, profile


def _mounts(
    volumes: Any, directory: Path, pinned: dict[str, dict[str, Any]], project: str
) -> tuple[list[dict[str, Any]], list[Path]]:
    if not isinstance(volumes, list):
        raise _Refused(volumes)
    mounts, folders = [], []
    for v in volumes:
        if not isinstance(v, dict) or set(v) - _MOUNT_KEYS:
            raise _Refused(v)
        source, target = v.get("source"), v.get("target")
        if not isinstance(source, str) or not isinstance(target, str):
            raise _Refused(v)
        if v.get("type") == "volume":
            mounts.append(_volume_mount(v, source, target, pinned))
            continue
        if v.get("type") != "bind" or "volume" in v:
            raise _Refused(v)
        bind = v.get("bind", {})
        if not isinstance(bind, dict) or set(bind) - {"create_host_path"}:
            raise _Refused(bind)
        path = (directory / source[2:]) if source.startswith("./") else Path(source)
        if not path.is_absolute() or not target.startswith("/"):
            raise _Refused(v)
        if bind.get("create_host_path") is True:
            folders.append(path)
        if v.get("read_only", False) not in (True, False):
            raise _Refused(v)
        mounts.append(
            {
                "Type": "bind",
                "Source": str(path),
                "Target": target,
                "ReadOnly": v.get("read_only") is True,
            }
        )
    return mounts, folders


def _volume_mount(
    v: dict[str, Any], source: str, target: str, pinned: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """A pinned folder's volume at `target`, never filled from the image (nocopy); or a
    plain named volume (a project of several: `_named`)."""
    if source not in pinned or "bind" in v:
        raise _Refused(v)
    plain = "DriverOpts" not in pinned[source]
    if v.get("volume") != {"nocopy": True} and not (plain and "volume" not in v):
        raise _Refused(v)
    if v.get("read_only", False) not in (True, False) or not target.startswith("/"):
        raise _Refused(v)
    mount = {
        "Type": "volume",
        "Source": pinned[source]["Name"],
        "Target": target,
        "ReadOnly": v.get("read_only") is True,
    }
    if "volume" in v:
        mount["VolumeOptions"] = {"NoCopy": True}
    return mount


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def _bytes(value: Any) -> int:
    """A size as Compose and the docker CLI read it (binary units: 1k = 1024)."""
    found = _SIZE.fullmatch(str(value).strip().lower())
    if found is None or isinstance(value, bool):
        raise _Refused(value)
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def _limits(svc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in (("mem_limit", "Memory"), ("memswap_limit", "MemorySwap")):
        if key in svc:
            out[name] = _bytes(svc[key])
    if "cpus" in svc:
        if isinstance(svc["cpus"], bool):
            raise _Refused("cpus")
        out["NanoCpus"] = round(float(svc["cpus"]) * 1e9)
    if "pids_limit" in svc:
        if not isinstance(svc["pids_limit"], int) or isinstance(svc["pids_limit"], bool):
            raise _Refused("pids_limit")
        out["PidsLimit"] = svc["pids_limit"]
    if "tmpfs" in svc:
        where, _, options = str(svc["tmpfs"]).partition(":")
        if not isinstance(svc["tmpfs"], str) or not where.startswith("/"):
            raise _Refused("tmpfs")
        out["Tmpfs"] = {where: options}
    if "storage_opt" in svc:
        out["StorageOpt"] = _mapping(svc["storage_opt"])
    return out


def _compose_labels(
    project: str, directory: Path, svc: dict[str, Any], service: str, depends: dict[str, str]
) -> dict[str, str]:
    """The labels by which Compose finds a project's containers (`ps`, `logs`, `stop`,
    `kill`, `down`); it lists none without a config hash."""
    config = json.dumps(svc, sort_keys=True, default=str).encode()
    return {
        "com.docker.compose.project": project,
        "com.docker.compose.service": service,
        "com.docker.compose.container-number": "1",
        "com.docker.compose.oneoff": "False",
        "com.docker.compose.project.working_dir": str(directory),
        "com.docker.compose.project.config_files": str(directory / "compose.yaml"),
        "com.docker.compose.config-hash": hashlib.sha256(config).hexdigest(),
        "com.docker.compose.depends_on": ",".join(
            f"{name}:{condition}:false" for name, condition in sorted(depends.items())
        ),
        "com.docker.compose.image": str(svc["image"]),
    }
