"""Bring a one-container project up with one `docker run` instead of `docker compose up`.

Most environments are one sandbox with no network of its own (`network_mode: none`, the
default), no service, no port and no named volume. For those Compose only parses the file,
finds nothing to create but the one container, and makes it: about 0.15 CPU-s and 0.1 s more
per start than `docker run` of the same container, and about as much again at `down`
(`bench/results/inspect_race.md`, where environments start and end by the hundred).

`direct_run` reads the compose file we rendered (the same text Compose would get) and, when
every key in it is one it knows, says how `docker run` makes the container Compose would:
the same name, configuration, mounts and labels, plus the labels Compose itself looks for,
so `docker compose ps`, `logs`, `stop`, `kill` and `down` keep working on it. Any other key,
or a value the docker CLI would read differently from Compose, leaves the project to Compose:
what the fast path cannot make exactly, it does not make.

ORCHESTRATOR_UP_PATH=compose sends every project through Compose (auto: the fast path where
it applies)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator import settings

UP_PATH_ENV = "ORCHESTRATOR_UP_PATH"
SERVICE = "main"

_TOP = {"name", "services"}
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
}
_MOUNT_KEYS = {"type", "source", "target", "read_only", "bind"}
_NETWORK_MODES = {"none", "host"}
_SAFE_FIELD = re.compile(r"[^,\"\n\r\x00]+")
"""What a --mount field may hold: the docker CLI reads --mount as one CSV record, so a comma
or a quote would change what it mounts (Compose reads the same path as one path)."""
_SECONDS = re.compile(r"(\d{1,4})s")


def up_path() -> str:
    return settings.choice(UP_PATH_ENV, "auto", ("auto", "compose"))


@dataclass(frozen=True)
class DirectRun:
    """One `docker run -d` that makes a project's only container as Compose would."""

    argv: list[str]
    """After the docker command itself (`run`, options, image, arguments)."""
    folders: tuple[Path, ...]
    """Host folders to make first (Compose's `bind.create_host_path`)."""


class _Refused(Exception):
    """A key or value the fast path does not make exactly as Compose would."""


def direct_run(compose_yaml: str, project: str, directory: Path) -> DirectRun | None:
    """How to make this project with `docker run`, or None when Compose must."""
    if up_path() != "auto" or not compose_yaml:
        return None
    try:
        doc = _unescaped(YAML(typ="safe").load(compose_yaml))
        return _plan(doc, project, directory)
    except (_Refused, YAMLError, TypeError, ValueError, AttributeError):
        return None


def _unescaped(value: Any) -> Any:
    """The file as Compose reads it: every `$` we render is escaped as `$$`; a lone `$` is
    Compose's interpolation, which the fast path does not do."""
    if isinstance(value, str):
        if "$" in value.replace("$$", ""):
            raise _Refused(value)
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
    if not isinstance(image, str) or not image or svc.get("pull_policy", "missing") != "missing":
        raise _Refused("image")
    entrypoint = _strings(svc.get("entrypoint"))
    if not entrypoint or not entrypoint[0]:
        raise _Refused("entrypoint")
    grace = _SECONDS.fullmatch(str(svc.get("stop_grace_period", "10s")))
    if grace is None:
        raise _Refused("stop_grace_period")
    mounts, folders = _mounts(svc.get("volumes", []), directory)
    labels = {**_mapping(svc.get("labels", {})), **_compose_labels(project, directory, svc)}
    argv = ["run", "--detach", "--name", f"{project}-{SERVICE}-1", "--entrypoint", entrypoint[0]]
    if svc.get("init") is True:
        argv.append("--init")
    argv += ["--network", svc["network_mode"], "--stop-timeout", grace.group(1)]
    for key, flag in (("runtime", "--runtime"), ("working_dir", "--workdir"), ("user", "--user")):
        if key in svc:
            if not isinstance(svc[key], str):
                raise _Refused(key)
            argv += [flag, svc[key]]
    for k, v in _mapping(svc.get("environment", {})).items():
        argv += ["--env", f"{k}={v}"]  # never a bare name: that would read our own variable
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    for m in mounts:
        argv += ["--mount", m]
    for key, flag in (("cap_drop", "--cap-drop"), ("cap_add", "--cap-add")):
        for cap in _strings(svc.get(key, [])):
            argv += [flag, cap]
    for opt in _strings(svc.get("security_opt", [])):
        argv += ["--security-opt", opt]
    argv += _limits(svc)
    argv += ["--", image, *entrypoint[1:], *_strings(svc.get("command", []))]
    return DirectRun(argv, tuple(folders))


def _mounts(volumes: Any, directory: Path) -> tuple[list[str], list[Path]]:
    if not isinstance(volumes, list):
        raise _Refused(volumes)
    mounts, folders = [], []
    for v in volumes:
        if not isinstance(v, dict) or set(v) - _MOUNT_KEYS or v.get("type") != "bind":
            raise _Refused(v)
        source, target = v.get("source"), v.get("target")
        if not isinstance(source, str) or not isinstance(target, str):
            raise _Refused(v)
        bind = v.get("bind", {})
        if not isinstance(bind, dict) or set(bind) - {"create_host_path"}:
            raise _Refused(bind)
        path = (directory / source[2:]) if source.startswith("./") else Path(source)
        if not path.is_absolute() or not target.startswith("/"):
            raise _Refused(v)
        if bind.get("create_host_path") is True:
            folders.append(path)
        fields = [f"source={path}", f"target={target}"]
        if not all(_SAFE_FIELD.fullmatch(f) for f in fields):
            raise _Refused(v)
        if v.get("read_only", False) not in (True, False):
            raise _Refused(v)
        mounts.append(
            ",".join(["type=bind", *fields, *(["readonly"] if v.get("read_only") else [])])
        )
    return mounts, folders


def _limits(svc: dict[str, Any]) -> list[str]:
    argv = []
    for key, flag in (
        ("mem_limit", "--memory"),
        ("memswap_limit", "--memory-swap"),
        ("cpus", "--cpus"),
        ("pids_limit", "--pids-limit"),
        ("tmpfs", "--tmpfs"),
    ):
        if key in svc:
            value = svc[key]
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise _Refused(key)
            argv += [flag, str(value)]
    for k, v in _mapping(svc.get("storage_opt", {})).items():
        argv += ["--storage-opt", f"{k}={v}"]
    return argv


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
