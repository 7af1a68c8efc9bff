"""What one Compose service brings into its container's filesystem: its build (context,
Dockerfile, args), env files, volumes and bind mounts, and tmpfs; each key mapped onto the
service's v1 target, refused with its reason and fix, or ignored with its reason."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.spec.compose.model import MAX_ENV_FILES
from orchestrator.spec.compose.target import Target
from orchestrator.spec.compose.values import env_pairs, is_host_path, size
from orchestrator.spec.compose.variables import Loc, beside


def build(t: Target, value: Any) -> None:
    """`build`: its context, Dockerfile and args; a remote context, an inline Dockerfile and
    the options that give a build more than its context are refused."""
    if isinstance(value, str):
        value = {"context": value}
    if not isinstance(value, dict):
        t.put(("build",), value, ("build",))
        return
    out: dict[str, Any] = {}
    for key, v in value.items():
        if key == "context" and re.match(r"^[a-z][a-z0-9+.-]*://|^git@", str(v)):
            t.refuse(
                ("build", key),
                f"a remote build context ({v}) is fetched from the network",
                "build from a folder beside the Compose file",
            )
            continue
        if key in ("context", "dockerfile"):
            out[key] = v
            t.m.where[(*t.target, "build", key)] = (*t.src, "build", key)
            t.fate(("build", key), "mapped")
        elif key == "args":
            args, passed = env_pairs(v)
            out["args"] = {k: ("" if a is None else a) for k, a in args.items()}
            for k in passed:
                out["args"][k] = ""
            t.m.where[(*t.target, "build", "args")] = (*t.src, "build", "args")
            t.fate(("build", "args"), "mapped")
        elif key == "dockerfile_inline":
            t.refuse(
                ("build", key),
                "an inline Dockerfile is not built",
                "write it to a file and name it in `dockerfile`",
            )
        elif key in ("network", "privileged", "entitlements", "allow", "ssh", "secrets"):
            t.refuse(
                ("build", key),
                f"`build.{key}` gives the build more than its context",
                "remove it",
            )
        else:
            t.fate(
                ("build", key),
                "ignored",
                "the build uses its context, Dockerfile and args only",
            )
    t.m.where[(*t.target, "build")] = (*t.src, "build")
    node = t.out.setdefault("build", {})
    node.update(out)


def env_file(t: Target, value: Any) -> None:
    """`env_file`: each file read beside the Compose file (bounded), its values under those
    of `environment`, as in Compose."""
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_ENV_FILES:
        t.refuse(("env_file",), f"more than {MAX_ENV_FILES} files", "merge them")
        return
    merged: dict[str, str] = {}
    for i, item in enumerate(items):
        key: Loc = ("env_file",) if not isinstance(value, list) else ("env_file", i)
        path = item.get("path") if isinstance(item, dict) else item
        required = item.get("required", True) if isinstance(item, dict) else True
        if not isinstance(path, str):
            t.refuse(key, "not a path", "name a file beside the Compose file")
            continue
        try:
            merged.update(t.m.env_file(beside(path, t.base_dir)))
        except FileNotFoundError:
            if required:
                t.refuse(key, f"{path} does not exist", "create it, or mark it `required: false`")
        except (OSError, ValueError) as exc:
            t.refuse(key, str(exc), "give a small KEY=VALUE file beside the Compose file")
    env = t.out.setdefault("env", {})
    for k, v in merged.items():
        env.setdefault(k, v)  # `environment` wins, as in Compose
    t.m.where.setdefault((*t.target, "env"), (*t.src, "env_file"))
    t.fate(("env_file",), "mapped")


def volumes(t: Target, value: Any) -> None:
    """`volumes`: bind mounts, and the environment's own named volumes (one with a driver or
    external is refused); an anonymous volume is the container's own filesystem here."""
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    for i, item in enumerate(value or []):
        key: Loc = ("volumes", i)
        if isinstance(item, dict):
            kind = item.get("type", "volume")
            source, target = str(item.get("source", "")), item.get("target")
            read_only = bool(item.get("read_only", False))
            for extra in sorted(set(item) - {"type", "source", "target", "read_only"}):
                t.fate((*key, extra), "ignored", "mounts take no options here")
        else:
            parts = str(item).split(":")
            if len(parts) == 1:
                kind, source, target, read_only = "volume", "", parts[0], False
            else:
                source, target = parts[0], parts[1]
                read_only = "ro" in (parts[2].split(",") if len(parts) > 2 else [])
                kind = "bind" if is_host_path(source) else "volume"
        if kind == "bind":
            t.m.where[(*t.target, "mounts", len(mounts))] = (*t.src, *key)
            mounts.append({"source": source, "target": target, "read_only": read_only})
            t.fate(key, "mapped")
        elif kind == "tmpfs" and target == "/tmp":
            t.fate(key, "mapped", "/tmp is a private tmpfs already")
        elif kind == "volume" and source:
            if source in t.m.unusable:
                t.refuse(
                    key,
                    f"volume {source}: {t.m.unusable[source]}",
                    "declare it with no driver, driver_opts or external",
                )
                continue
            t.m.where[(*t.target, "volumes", len(volumes))] = (*t.src, *key)
            volumes.append({"volume": source, "target": target, "read_only": read_only})
            t.fate(key, "mapped", "the environment's own volume, removed with it")
        else:
            t.fate(
                key,
                "ignored",
                f"{kind} {source or '(anonymous)'} at {target}: the container's own "
                "filesystem holds it here, as an anonymous volume is its own",
            )
    if mounts:
        t.out.setdefault("mounts", []).extend(mounts)
    if volumes:
        t.out.setdefault("volumes", []).extend(volumes)


def tmpfs(t: Target, value: Any) -> None:
    """`tmpfs`: /tmp only, which is a private tmpfs already (its size kept)."""
    for i, item in enumerate(value if isinstance(value, list) else [value]):
        key: Loc = ("tmpfs", i) if isinstance(value, list) else ("tmpfs",)
        path, _, opts = str(item).partition(":")
        if path == "/tmp":
            found = re.search(r"size=([0-9a-zA-Z.]+)", opts)
            if found:
                t.put(("resources", "tmp"), size(found.group(1)), key)
            t.fate(key, "mapped", "/tmp is a private tmpfs")
        else:
            t.fate(key, "ignored", f"only /tmp is a tmpfs here, not {path}")
