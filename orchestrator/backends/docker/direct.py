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
    image = svc.get("image")
    if (
        not isinstance(image, str)
        or not image
        or svc.get("pull_policy") not in ("never", "missing")
    ):
        raise _Refused("image")
    entrypoint = _strings(svc.get("entrypoint"))
    if not entrypoint or not entrypoint[0]:
        raise _Refused("entrypoint")
    if "logging" in svc and svc["logging"] != _LOGGING:
        raise _Refused("logging")
    grace = _SECONDS.fullmatch(str(svc.get("stop_grace_period", "10s")))
    if grace is None:
        raise _Refused("stop_grace_period")
    volumes = _pinned(doc.get("volumes", {}), project)
    security, seccomp = _security(svc.get("security_opt", []), directory)
    mounts, folders = _mounts(svc.get("volumes", []), directory, volumes, project)
    labels = {**_mapping(svc.get("labels", {})), **_compose_labels(project, directory, svc)}
    config: dict[str, Any] = {
        "Image": image,
        "Entrypoint": entrypoint,
        "Cmd": _strings(svc.get("command", [])),
        "Env": [f"{k}={v}" for k, v in _mapping(svc.get("environment", {})).items()],
        "Labels": labels,
        "StopTimeout": int(grace.group(1)),
    }
    host: dict[str, Any] = {
        "NetworkMode": svc["network_mode"],
        "Init": svc.get("init") is True,
        "Mounts": mounts,
        "CapDrop": _caps(svc.get("cap_drop", [])),
        "CapAdd": _caps(svc.get("cap_add", [])),
        "SecurityOpt": security,
        "RestartPolicy": {"Name": "no"},
        **_limits(svc),
    }
    if "logging" in svc:
        host["LogConfig"] = {"Type": "json-file", "Config": dict(_LOG_OPTIONS)}
    files: dict[Path, str] = {}
    if svc["network_mode"] == "none" and "runtime" not in svc and os.geteuid() == 0:
        # (root's files, as the engine's are: a sandbox user whose uid is ours could
        # otherwise chmod and rewrite them)
        files = unnetworked(config, host, directory)
    for key, name in (("working_dir", "WorkingDir"), ("user", "User")):
        if key in svc:
            if not isinstance(svc[key], str):
                raise _Refused(key)
            config[name] = svc[key]
    if "runtime" in svc:
        if not isinstance(svc["runtime"], str):
            raise _Refused("runtime")
        host["Runtime"] = svc["runtime"]
    body = {**config, "HostConfig": host}
    return DirectRun(f"{project}-{SERVICE}-1", body, tuple(folders), files, volumes, seccomp)


def _caps(value: Any) -> list[str]:
    """Capabilities named as the CLI sends them (CAP_CHOWN for CHOWN; ALL stays)."""
    return [c if c == "ALL" or c.startswith("CAP_") else f"CAP_{c}" for c in _strings(value)]


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
    """A pinned folder's volume at `target`: never filled from the image (nocopy)."""
    if source not in pinned or v.get("volume") != {"nocopy": True} or "bind" in v:
        raise _Refused(v)
    if v.get("read_only", False) not in (True, False) or not target.startswith("/"):
        raise _Refused(v)
    return {
        "Type": "volume",
        "Source": pinned[source]["Name"],
        "Target": target,
        "ReadOnly": v.get("read_only") is True,
        "VolumeOptions": {"NoCopy": True},
    }


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


def _compose_labels(project: str, directory: Path, svc: dict[str, Any]) -> dict[str, str]:
    """The labels by which Compose finds a project's containers (`ps`, `logs`, `stop`,
    `kill`, `down`); it lists none without a config hash."""
    config = json.dumps(svc, sort_keys=True, default=str).encode()
    return {
        "com.docker.compose.project": project,
        "com.docker.compose.service": SERVICE,
        "com.docker.compose.container-number": "1",
        "com.docker.compose.oneoff": "False",
        "com.docker.compose.project.working_dir": str(directory),
        "com.docker.compose.project.config_files": str(directory / "compose.yaml"),
        "com.docker.compose.config-hash": hashlib.sha256(config).hexdigest(),
        "com.docker.compose.depends_on": "",
        "com.docker.compose.image": str(svc["image"]),
    }
