"""Backend registry. Built-in backends are named by import path and imported only when
used; third-party backends register with `register_runtime` or the entry-point group
`orchestrator.runtimes`. A file's `backend:` is checked here, against every registered name,
and what is particular to a backend is asked of its class (`check`, `prepare`, `render`)."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from orchestrator.errors import PolicyError, SpecError, SpecIssue, UsageError
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.options import BUILD_CHOICES, BuildChoice, SpawnOptions
from orchestrator.sandbox.snapshot import Snapshot
from orchestrator.spec.loader import (
    Environment,
    check_backend,
    load_environment,
    require_main_image,
)
from orchestrator.spec.models import Mount, PortMap
from orchestrator.spec.policy import UNISOLATED_ENV, Policy

ENTRY_POINT_GROUP = "orchestrator.runtimes"
_BUILTIN = {
    "local": "orchestrator.backends.local:LocalRuntime",
    "docker": "orchestrator.backends.docker.runtime:ComposeRuntime",
    "swarm": "orchestrator.backends.swarm.runtime:SwarmRuntime",
}
_registered: dict[str, type[Runtime]] = {}

R = TypeVar("R", bound=type[Runtime])


def register_runtime(name: str) -> Callable[[R], R]:
    """Class decorator: make a Runtime subclass available as backend `name`. A class that
    already has a name of its own (registering an alias) keeps it: the alias is a subclass
    named `name`, so runtimes spawned through either name report the name they were asked by."""

    def deco(cls: R) -> R:
        _register(name, cls, f"register_runtime({name!r})")
        return cls

    return deco


def _register(name: str, cls: object, what: str) -> type[Runtime]:
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise UsageError(f"{what} is not a Runtime subclass")
    own = cls.__dict__.get("name")
    if not own:
        cls.name = name  # the class's own name (not one inherited), given by its registration
    elif own != name:
        module = cls.__module__
        cls = types.new_class(
            cls.__name__, (cls,), exec_body=lambda ns: ns.update(name=name, __module__=module)
        )
    _registered[name] = cls
    return cls


def _entry_points() -> dict[str, str]:
    """The plugin backends installed where this process imports from. Scanning every
    installed distribution's metadata costs about 4 ms, paid on each spawn until cached;
    the cache is keyed by sys.path and each folder's mtime, so a plugin folder added to the
    path, or a plugin installed into one (a new dist-info folder), scans again."""
    return _scan(tuple((p, _mtime(p)) for p in sys.path))


def _mtime(path: str) -> int:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return 0


@functools.lru_cache(maxsize=4)
def _scan(path: tuple[tuple[str, int], ...]) -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def runtime_names() -> list[str]:
    """Every backend that can be asked for by name."""
    return sorted({*_BUILTIN, *_registered, *_entry_points()})


def get_runtime_class(name: str) -> type[Runtime]:
    if name in _registered:
        return _registered[name]
    target = _BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        raise UsageError(f"unknown backend {name!r}; known backends: {', '.join(runtime_names())}")
    module, _, attr = target.partition(":")
    return _register(
        name, getattr(importlib.import_module(module), attr), f"backend {name!r} ({target})"
    )


def backend_class(
    env: Environment, backend: str | None = None, *, policy: Policy | None = None
) -> type[Runtime]:
    """The Runtime class that runs `env`: `backend` (a caller's choice: UsageError when
    unknown) or the file's own `backend:` (SpecError at that field when unknown). A file may
    choose a backend that isolates nothing (local) only when the caller's `policy` (else
    ORCHESTRATOR_ALLOW_UNISOLATED) allows it: PolicyError at the field otherwise."""
    if backend:
        return get_runtime_class(backend)
    check_backend(env, runtime_names())
    cls = get_runtime_class(env.backend)
    if not cls.isolated and not (policy or Policy.from_env()).allow_unisolated:
        line, col = env.where("backend")
        raise PolicyError(
            SpecIssue(
                env.source,
                line=line,
                column=col,
                field="backend",
                message=f"backend {env.backend!r} runs the file's commands on this host, "
                "unisolated; a file may not choose that alone",
                fix=f"choose it as the caller (spawn_runtime(..., backend={env.backend!r}), "
                f"`orchestrator run --on {env.backend}`), or allow files to with "
                f"Policy(allow_unisolated=True) / {UNISOLATED_ENV}=1",
            )
        )
    return cls


def _load(env: Environment | str | Path) -> Environment:
    return env if isinstance(env, Environment) else load_environment(env, backends=runtime_names)


def _as_mount(m: Mount | Mapping[str, object] | str) -> Mount:
    if isinstance(m, Mount):
        return m
    try:
        return _parse_mount(m)
    except (ValidationError, IndexError) as exc:
        raise SpecError(f"spawn mount {m!r} is invalid: {exc}") from None


def _parse_mount(m: Mapping[str, object] | str) -> Mount:
    if isinstance(m, str):  # "src:dst[:ro]"
        parts = m.split(":")
        return Mount(source=parts[0], target=parts[1], read_only=parts[2:] == ["ro"])
    return Mount.model_validate(m)


def _as_port(p: PortMap | Mapping[str, object] | int) -> PortMap:
    if isinstance(p, PortMap):
        return p
    try:
        return PortMap(container=p) if isinstance(p, int) else PortMap.model_validate(p)
    except ValidationError as exc:
        raise SpecError(f"spawn port {p!r} is invalid: {exc}") from None


def spawn_runtime(
    env: Environment | str | Path,
    workspace: str | Path | None = None,
    mounts: Sequence[Mount | Mapping[str, object] | str] | None = None,
    ports: Sequence[PortMap | Mapping[str, object] | int] | None = None,
    env_vars: Mapping[str, str] | None = None,
    is_evaluation: bool = False,
    disable_setup: bool = False,
    *,
    is_resume: bool = False,
    resume: Snapshot | str | Path | None = None,
    backend: str | None = None,
    policy: Policy | None = None,
    detached: bool = False,
    host: str | None = None,
    build: BuildChoice = "auto",
) -> Runtime:
    """Bring an environment up on its backend (or `backend`), run its setup, return the live
    runtime. Use it as a context manager so it is always cleaned up. `resume`: a snapshot (or
    its path or name) whose workspace is restored first; setup then runs
    `setup.resume_commands` instead of `setup.commands`. `host`: the engine to start it on
    (any `docker --host` address; for swarm, the manager), instead of the process's.
    `build`: how the images the file builds are got: "auto" (built when what they are built
    from changed), "always" (rebuilt through the engine's cache), "never" (UsageError when
    one is missing)."""
    env = _load(env)
    _check_build(build)
    cls = backend_class(env, backend, policy=policy)
    if cls.needs_image:
        require_main_image(env)
    options = SpawnOptions(
        workspace=Path(workspace).resolve() if workspace is not None else None,
        mounts=tuple(_as_mount(m) for m in mounts or ()),
        ports=tuple(_as_port(p) for p in ports or ()),
        env_vars=dict(env_vars or {}),
        is_evaluation=is_evaluation,
        is_resume=is_resume or resume is not None,
        resume=Snapshot.find(resume) if isinstance(resume, str | Path) else resume,
        disable_setup=disable_setup,
        policy=policy or Policy.from_env(),
        detached=detached,
        host=host or None,
        build=build,
    )
    try:
        return cls.spawn(env, options)
    except SpecError as exc:  # a backend's or the policy's refusal, by field: placed in the file
        raise env.located(exc) from None


def _takes(fn: Callable[..., object], name: str) -> bool:
    """Whether `fn` takes a keyword `name` (by name or through **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _check_build(build: str) -> None:
    if build not in BUILD_CHOICES:
        raise UsageError(f"build must be one of {', '.join(BUILD_CHOICES)}, got {build!r}")


def prepare(
    env: Environment | str | Path,
    policy: Policy | None = None,
    *,
    backend: str | None = None,
    build: BuildChoice = "auto",
) -> Environment:
    """Check an environment once before many spawns: the file, the caller's policy and what
    its backend does ahead of time (`Runtime.prepare`: a Docker backend builds its images now,
    so that spawns starting together do not each build them; `build` as in spawn_runtime)."""
    env = _load(env)
    _check_build(build)
    policy = policy or Policy.from_env()
    try:
        cls = backend_class(env, backend, policy=policy)
        if build == "auto":  # as a backend written before `build` existed takes it
            cls.prepare(env, policy)
        elif _takes(cls.prepare, "build"):
            cls.prepare(env, policy, build=build)
        else:
            raise UsageError(f"the {cls.name} backend takes no build choice ({build!r})")
    except SpecError as exc:  # placed in the file, as spawn_runtime does
        raise env.located(exc) from None
    return env
