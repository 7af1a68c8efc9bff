"""A Harbor environment: `harbor run -p TASKS -e
orchestrator.integrations.harbor:OrchestratorEnvironment` runs each trial in an environment
of ours (install `orchestrator[harbor]`; Harbor needs Python >= 3.12).

A trial's environment is its task's `environment/` folder as Harbor reads it: a `Dockerfile`,
a `docker-compose.yaml` whose agent service is `main` (built from the folder unless it names
an image or build of its own), or `[environment].docker_image`. What `task.toml` says of
it is applied as Harbor's own Docker environment applies it: `cpus` and `memory_mb` as the
main container's limits unless the Compose file sets them, `workdir` as where commands start,
`env` on every command. Harbor's network policies become egress: `public` is `all`,
`no-network` is `none`, `allowlist` is our allowlist of its hosts (names and `*.` names on
ports 80 and 443, IPv4 addresses and ranges on any port). When the agent's or the verifier's
policy differs from the environment's, the sandbox reaches outside only through its egress
gateway from the start, and each phase's policy is applied there (`set_egress`) before the
phase runs. The caller's own settings (ORCHESTRATOR_EGRESS, ORCHESTRATOR_ISOLATION, ...)
bound all of it, as they bound any file.

Options (`--ek KEY=VALUE`): `isolation=gvisor` (at least the caller's ORCHESTRATOR_ISOLATION)
and `build=auto|always|never` (how images are got; `--force-build` is `always`).

Commands run through the in-container executor (`aio`): Harbor's env, cwd, user (a name or
an id) and timeout (the whole process tree is killed), stdout and stderr apart, output
streamed to Harbor's callback when it asks for it; a trial cancelled while a command runs
kills it. Files move as tar streams (`upload`, `download`): a download refuses entries that
would land outside its folder, links that lead out, devices and FIFOs. `stop(delete=False)`
leaves the environment running, found by `orchestrator ps`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import re
import tempfile
import tomllib
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from pydantic import Field
from ruamel.yaml import YAML

from orchestrator import (
    BuildChoice,
    Policy,
    RuntimeResult,
    StreamEvent,
    aio,
    load_environment_text,
    settings,
)
from orchestrator.aio import AsyncRuntime, AsyncSandbox
from orchestrator.errors import UsageError
from orchestrator.paths import read_regular
from orchestrator.spec.compose import looks_compose
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import EnvironmentV1

COMPOSE = "docker-compose.yaml"
DOCKERFILE = "Dockerfile"
HARBOR_MAIN = "main"
"""The agent service of Harbor's Compose tasks."""
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$", re.IGNORECASE)


CANCEL_GRACE = 30.0
"""Seconds a start cancelled by Harbor (its build_timeout_sec) waits, by default, for the
environment it was making, to remove it before Harbor goes on: a Harbor that exits at once
(a container's first process) would take the guardian that removes it with it."""


class OrchestratorOptions(EnvironmentOptions):
    """What `--ek` may set for this environment (anything else is refused by Harbor)."""

    isolation: Literal["runc", "gvisor"] | None = None
    """The isolation of the trial's containers, as a file's `isolation` asks for it (the
    caller's ORCHESTRATOR_ISOLATION still raises it, never lowers it). None: the file's."""
    build: Literal["auto", "always", "never"] = "auto"
    """How the images a task builds are got (`--force-build`: always)."""
    cancel_grace: float = Field(default=CANCEL_GRACE, ge=0, le=600)
    """Seconds a start Harbor cancelled waits for the environment it was making, to remove
    it before Harbor goes on (see CANCEL_GRACE)."""


def egress_of(policy: NetworkPolicy) -> str | list[str]:
    """Harbor's network policy as an egress setting."""
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return "none"
    if policy.network_mode == NetworkMode.PUBLIC:
        return "all"
    return list(policy.allowed_hosts) or "none"


class OrchestratorEnvironment(BaseEnvironment):
    """A Harbor trial's environment, run by orchestrator (see the module's text)."""

    options_model = OrchestratorOptions
    options: OrchestratorOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._rt: AsyncRuntime | None = None
        self._ids: dict[str, str] = {}  # user names resolved in the sandbox
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "orchestrator"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            dynamic_network_policy=True,
            docker_compose=True,
        )

    def _validate_definition(self) -> None:
        require_agent_environment_definition(
            self.environment_dir, docker_image=self.task_env_config.docker_image
        )
        if self.extra_docker_compose_paths:
            raise ValueError(
                "the orchestrator environment takes the task's own environment/ only: drop "
                "--extra-docker-compose (put the services in environment/docker-compose.yaml)"
            )
        if self._host_mounts:
            raise ValueError(
                "the orchestrator environment mounts no host folder a trial names: drop "
                "--mounts (files reach the sandbox through Harbor's uploads)"
            )

    # -- the environment -------------------------------------------------------------------

    def _policies(self) -> list[NetworkPolicy]:
        return [self.network_policy, *(self._phase_network_policies or ())]

    def _compose(self) -> tuple[str, str]:
        """The task's environment as Compose text, and the name of the file it came from."""
        folder = self.environment_dir
        yaml = YAML()  # round trip: the task's own lines stay where they were
        source = folder / COMPOSE
        if os.path.lexists(source):
            data = yaml.load(_task_file(source))
        else:
            source = folder / DOCKERFILE if not self.task_env_config.docker_image else source
            data = {"services": {HARBOR_MAIN: {}}}
        services = data.get("services") if isinstance(data, dict) else None
        if not isinstance(services, dict) or not looks_compose(data):
            raise UsageError(f"{source}: a Compose file with `services` is expected")
        main = services.setdefault(HARBOR_MAIN, {})
        if not isinstance(main, dict):
            raise UsageError(f"{source}: services.{HARBOR_MAIN} must be a mapping")
        if "image" not in main and "build" not in main:
            if self.task_env_config.docker_image:
                main["image"] = self.task_env_config.docker_image
            else:
                main["build"] = {"context": "."}
        config = self.task_env_config
        if config.cpus and "cpus" not in main:
            main["cpus"] = config.cpus
        if config.memory_mb and "mem_limit" not in main:
            main["mem_limit"] = f"{int(config.memory_mb)}m"
        if config.workdir and "working_dir" not in main:
            main["working_dir"] = config.workdir
        if config.storage_mb:
            self.logger.warning("orchestrator: storage_mb is not enforced (no disk quota)")
        for name, svc in services.items():
            if not isinstance(svc, dict):
                continue
            if name != HARBOR_MAIN:  # `main` is the sandbox, whatever else says so
                svc.pop("x-default", None)
            if svc.pop("ports", None) is not None:  # Harbor reaches nothing by a host port
                self.logger.warning(
                    "orchestrator: services.%s.ports dropped: a trial publishes no port", name
                )
        main["x-default"] = True
        out = io.StringIO()
        yaml.dump(data, out)
        return out.getvalue(), str(source)

    def _environment(self) -> Environment:
        # (checked here, as the trial starts: a refusal is that trial's exception, where one
        # raised when Harbor makes the environment would end the whole job)
        _inside_its_task(self.environment_dir)
        _host_variables_allowed(self.environment_dir.parent / "task.toml", self.task_env_config.env)
        text, source = self._compose()
        env = load_environment_text(
            text, source=source, base_dir=self.environment_dir, variables=self._variables()
        )
        data = env.spec.model_dump(mode="json", exclude_unset=True)
        data["name"] = _name(self.environment_name)
        if self.options.isolation is not None:  # (ORCHESTRATOR_ISOLATION still raises it)
            data["isolation"] = self.options.isolation
        egress = egress_of(self.network_policy)
        data.setdefault("network", {})["egress"] = egress
        data["network"].pop("allow_internet", None)
        phases = [egress_of(p) for p in self._policies()]
        other = next((e for e in phases if e != egress), None)
        if other is not None:
            # A policy that changes by phase is applied at the egress gateway, which a file
            # asks for by giving setup an egress of its own. No setup commands run here: the
            # sandbox starts under `egress`, and each phase's comes by set_egress.
            data.setdefault("setup", {})["egress"] = other
        # The task's other services are held to the sandbox's policy, or to none when that
        # changes by phase (the gateway's rules are the sandbox's alone): a sidecar must not
        # be the agent's way around its policy
        for svc in data.get("services", {}).values():
            svc["egress"] = egress if other is None else "none"
        spec = EnvironmentV1.model_validate(data)
        return dataclasses.replace(env, spec=spec)

    def _variables(self) -> dict[str, str]:
        """The variables Harbor's Docker environment gives a task's Compose file."""
        config = self.task_env_config
        out = {"CONTEXT_DIR": str(self.environment_dir)}
        if config.cpus:
            out["CPUS"] = str(config.cpus)
        if config.memory_mb:
            out["MEMORY"] = f"{int(config.memory_mb)}M"
        if config.docker_image:
            out["PREBUILT_IMAGE_NAME"] = config.docker_image
        return out

    async def start(self, force_build: bool) -> None:
        env = await aio.in_thread(self._environment)
        build: BuildChoice = "always" if force_build else self.options.build
        spawn = asyncio.ensure_future(aio.spawn(env, policy=Policy.from_env(), build=build))
        try:
            self._rt = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            await _removed_after(spawn, self.options.cancel_grace)
            raise
        for warning in self._rt.sync.warnings:
            self.logger.warning("orchestrator: %s", warning)
        made = await self.ensure_dirs(self._mount_targets(writable_only=True))
        if made is not None and made.return_code != 0:
            raise RuntimeError(
                f"cannot make Harbor's folders in the sandbox (exit {made.return_code}): "
                f"{(made.stderr or made.stdout or '').strip()[-500:]}"
            )
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        rt, self._rt = self._rt, None
        if rt is None:
            return
        if delete:
            await rt.cleanup()
        else:
            await rt.detach()
            self.logger.info("orchestrator: environment %s left running", rt.info().id)

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        holds = await self._runtime().set_egress(egress_of(network_policy))
        self.logger.debug("orchestrator: egress now %s", holds)

    def _runtime(self) -> AsyncRuntime:
        if self._rt is None:
            raise RuntimeError("the orchestrator environment is not started")
        return self._rt

    def _sandbox(self, service: str | None) -> AsyncSandbox:
        rt = self._runtime()
        return rt if self.is_main_service(service) else rt.service(str(service))

    # -- commands --------------------------------------------------------------------------

    async def _user(self, box: AsyncSandbox, service: str, user: str | int | None) -> str | None:
        """Harbor's user (a name, an id, or None: the image's) as ours, "uid:gid", with the
        group the sandbox's passwd gives it (0 for an id it does not know, as Docker). Without
        supplementary groups: the executor runs every command with none."""
        if user is None:
            return None
        text = str(user)
        if text == "root":
            return text
        numeric = text.isascii() and text.isdigit()
        if not numeric and not _USER_NAME.match(text):
            raise ValueError(f"not a user name or id: {text!r}")
        key = f"{service}:{text}"
        if key not in self._ids:
            ids = []
            for flag in ("-u", "-g"):  # the sandbox's own answer: checked to be a number
                found = await box.execute(["id", flag, text], user="root", timeout=30)
                number = found.stdout.strip()
                if found.exit_code == 0 and number.isascii() and number.isdigit():
                    ids.append(number)
                elif numeric:  # an id the sandbox's passwd does not name
                    ids.append(text if flag == "-u" else "0")
                else:
                    raise ValueError(f"no user {text!r} in the sandbox")
            self._ids[key] = ":".join(ids)
        return self._ids[key]

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        return await self._run(
            HARBOR_MAIN,
            command,
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env),
            timeout_sec=timeout_sec,
            user=self._resolve_user(user),
            shell="bash",
        )

    async def service_exec(
        self,
        command: str,
        *,
        service: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self.is_main_service(service):
            return await self.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        return await self._run(
            str(service),
            command,
            cwd=cwd,
            env=env,
            timeout_sec=timeout_sec,
            user=user,
            shell="sh",  # a sidecar's image may have no bash (as Harbor's Docker does)
        )

    async def _run(
        self,
        service: str,
        command: str,
        *,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_sec: int | None,
        user: str | int | None,
        shell: str,
    ) -> ExecResult:
        argv = [shell, "-c", command]
        box = self._sandbox(service)
        as_user = await self._user(box, service, user)
        timeout = float(timeout_sec) if timeout_sec else None
        callback = self._output_callback()
        if callback is None:
            result = await box.execute(argv, cwd=cwd, env=env, user=as_user, timeout=timeout)
        else:
            result = await _streamed(
                box.stream(argv, cwd=cwd, env=env, user=as_user, timeout=timeout), callback
            )
        if result.timed_out:  # as Harbor's Docker environment says it
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        stderr = result.stderr
        if result.truncated:
            note = (
                "[orchestrator: the command's output passed ORCHESTRATOR_OUTPUT_LIMIT; "
                "its last part is kept]"
            )
            self.logger.warning("orchestrator: %s: %s", command[:80], note)
            stderr = f"{stderr}\n{note}" if stderr else note
        return ExecResult(
            stdout=result.stdout or None, stderr=stderr or None, return_code=result.exit_code
        )

    # -- files -----------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        data = await aio.in_thread(source.read_bytes)
        rt = self._runtime()
        await rt.write_file(target_path, data, user="root")
        if os.stat(source).st_mode & 0o111:  # an executable stays one, as `docker cp` keeps it
            await rt.execute(["chmod", "+x", "--", _absolute(target_path)], user="root")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._runtime().upload(Path(source_dir), _absolute(target_dir), user="root")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self.service_download_file(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self.service_download_dir(source_dir, target_dir)

    async def service_download_file(
        self, source_path: str, target_path: Path | str, *, service: str | None = None
    ) -> None:
        data = await self._sandbox(service).read_file(
            _absolute(source_path), text=False, user="root"
        )
        await aio.in_thread(lambda: _write_here(Path(target_path), data))

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        await self._sandbox(service).download(_absolute(source_dir), Path(target_dir), user="root")


async def _streamed(
    events: AsyncGenerator[StreamEvent, None],
    callback: Callable[[str, Literal["stdout", "stderr"]], Awaitable[None]],
) -> RuntimeResult:
    """A streamed command's result, its output handed to Harbor's callback as it comes (a
    callback that raises ends the stream, which kills the command, at once)."""
    async with contextlib.aclosing(events):
        async for event in events:
            if event.kind == "finished" and event.result is not None:
                return event.result
            if event.kind != "finished" and event.text:
                await callback(event.text, event.kind)
    raise RuntimeError("the command's stream ended without its result")


def _absolute(path: str) -> str:
    """A sandbox path Harbor names, normalized; it must be absolute (Harbor's always are)."""
    p = PurePosixPath(path)
    if not p.is_absolute():
        raise ValueError(f"a sandbox path must be absolute, got {path!r}")
    return os.path.normpath(str(p))


async def _removed_after(spawn: asyncio.Future[AsyncRuntime], grace: float) -> None:
    """The environment a cancelled start was making, removed: waited for `grace` seconds at
    most, then left to aio's own removal in the background (and the guardian)."""
    done, _ = await asyncio.wait({spawn}, timeout=grace)
    if not done:
        spawn.cancel()  # aio removes what it makes once it is up
        return
    if not spawn.cancelled() and spawn.exception() is None:
        await spawn.result().cleanup()


def _inside_its_task(folder: Path) -> None:
    """The task's environment folder, as a dataset's task could plant it: a link (to any of
    this host's folders, which would be built from or uploaded) is refused."""
    if folder.is_symlink() or folder.resolve() != folder.parent.resolve() / folder.name:
        raise ValueError(
            f"{folder}: the task's environment folder must be a folder of the task, not a link"
        )


_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-[^}]*)?\}")
"""Harbor's `${NAME}` and `${NAME:-default}` in a task's env values (filled from its own
variables)."""


def _host_variables_allowed(task_toml: Path, env: dict[str, str]) -> None:
    """The host variables a task's env values name (`[environment].env`, and from
    `task.toml`, `[verifier].env` and `[solution].env`, which Harbor fills from its own
    variables before a command runs) must be ones the caller passes into sandboxes
    (ORCHESTRATOR_ALLOW_ENV), as a file's `env_passthrough` must."""
    values = list(env.values())
    try:
        table = tomllib.loads(_task_file(task_toml))
    except (UsageError, tomllib.TOMLDecodeError, ValueError):
        table = {}  # Harbor read it already: what it could not, it refused
    for section in ("verifier", "solution", "environment"):
        part = table.get(section)
        found = part.get("env") if isinstance(part, dict) else None
        if isinstance(found, dict):
            values += [str(v) for v in found.values()]
    policy = Policy.from_env()
    named = sorted({m.group(1) for v in values for m in _TEMPLATE.finditer(v)})
    refused = [n for n in named if not policy.allows_env(n)]
    if refused:
        raise ValueError(
            f"{task_toml}: the task reads this host's variables {', '.join(refused)} into the "
            "sandbox; a caller who means to pass them sets ORCHESTRATOR_ALLOW_ENV="
            f"{','.join(refused)}"
        )


def _task_file(path: Path) -> str:
    """A task's own file, read as a task from a dataset may hold it: a regular file, not a
    link (which could lead to one of this host's), of at most ORCHESTRATOR_MAX_SPEC_BYTES."""
    limit = settings.MAX_SPEC_BYTES.get()
    data = read_regular(path, limit)
    if data is None:
        raise UsageError(
            f"{path}: cannot be read as the task's file: it must be a regular file, not a link"
        )
    if len(data) > limit:
        raise UsageError(f"{path}: larger than {limit} bytes (ORCHESTRATOR_MAX_SPEC_BYTES)")
    return data.decode("utf-8", errors="replace")


def _write_here(target: Path, data: bytes) -> None:
    """Write a downloaded file at `target` on this host: into a new file beside it, renamed
    over it, so a link already at `target` is replaced, never written through."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:  # 0600, as the library's downloads are
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _name(text: str) -> str:
    """Harbor's environment name as ours: lower-case letters, digits, '_', '.', '-'."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-_.")[:40].rstrip("-_.")
    return name or "harbor"


__all__ = ["OrchestratorEnvironment", "OrchestratorOptions", "egress_of"]
