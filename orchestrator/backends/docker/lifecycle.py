"""Bring one compose project up and down; a failed start removes what it created."""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from orchestrator import settings
from orchestrator.backends.container.binds import PINNED_DIR, Pins
from orchestrator.backends.container.engine import (
    TIMED_OUT,
    Engine,
    NoSuchImage,
    StorageOptUnsupported,
    SubnetOverlap,
    docker_errors,
    engine_call,
    published_ports,
    resolved_host,
    service_of,
    up_timeout,
)
from orchestrator.backends.container.guardian import ensure_guardian
from orchestrator.backends.container.identity import (
    ENGINE_FILE,
    KEPT_FILE,
    LABEL_PROJECT,
    claim_folder,
    pick_subnet,
    project_labels,
    project_name,
)
from orchestrator.backends.container.inventory import reap_soon, remove_by_label
from orchestrator.backends.container.readiness import LOG_LINES, Look, failure, late, not_ready
from orchestrator.backends.docker.binding import pin_options
from orchestrator.backends.docker.build import get_images, missing_images
from orchestrator.backends.docker.direct import DirectRun, direct_run
from orchestrator.backends.docker.network import EGRESS_NETWORK_ENV, GATEWAY, PROXY_PORT
from orchestrator.backends.docker.render import (
    GVISOR_RUNTIME_ENV,
    CompiledProject,
    CompileOptions,
    compile_project,
)
from orchestrator.errors import (
    BackendUnavailable,
    DockerError,
    HealthcheckFailed,
    OrchestratorError,
    SpecError,
    SpecIssue,
    StartupError,
    UsageError,
)
from orchestrator.paths import make_folders, projects_dir, write_file
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import PublishedPort
from orchestrator.spec.policy import raise_if
from orchestrator.spec.resolve import MAIN

if TYPE_CHECKING:
    from python_on_whales import DockerClient

STOP_TIMEOUT = 2
T = TypeVar("T")
log = logging.getLogger("orchestrator.docker")

# `sh -c TETHER`, in each extra service of a project with an owner process
TETHER = r"""
read -r word
[ "$word" = release ] && exit 0
kill -TERM 1 2>/dev/null
sleep 2 2>/dev/null
kill -KILL -1 2>/dev/null
exit 0
"""
"""Wait for the end of input; unless it brought the word `release`, stop this container
from inside: SIGTERM to its init (which passes it on), then SIGKILL to whatever else runs
as its user (the init then exits with its child: the container stops)."""
RELEASE = b"release\n"
TETHER_WAIT = 5.0
"""Longest `release` waits for the tethers to take their word and exit."""


def _end_tethers(tethers: list[subprocess.Popen[bytes]]) -> None:
    """Kill the tethers still running once their services are removed (or their removal
    failed: the guardian or a reap finishes it). A `docker exec` into a gVisor container
    that is removed never returns: left, it would outlive this process, an orphan."""
    for proc in tethers:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()


@dataclass
class Project:
    """One compose project on disk and, once up, in the engine."""

    name: str
    directory: Path
    compiled: CompiledProject
    host: str = ""
    """Its engine ("": the process's)."""
    engine: Engine = field(init=False)
    """Its engine, fixed when made (a variable changed later must not send a removal to
    another engine)."""
    _tethers: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)
    _tether_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _lingering: list[subprocess.Popen[bytes]] = field(init=False, default_factory=list)
    """Tethers released that had not exited within TETHER_WAIT (see `_end_tethers`)."""
    _direct_run: DirectRun | None = field(init=False, default=None)
    """How `up` made it, when through the Engine API (see direct.py)."""

    def __post_init__(self) -> None:
        self.engine = Engine.at(self.host)

    def _compose_client(self, seconds: float | None = None) -> DockerClient:
        return self.engine.compose_client(
            seconds,
            compose_files=[self.directory / "compose.yaml"],
            compose_project_name=self.name,
            compose_project_directory=self.directory,
        )

    @cached_property
    def client(self) -> DockerClient:
        """python-on-whales' client of the project (made on first use), every call bounded
        by ORCHESTRATOR_ENGINE_TIMEOUT."""
        return self._compose_client()

    @cached_property
    def up_client(self) -> DockerClient:
        """For `up`, which may build images: bounded by ORCHESTRATOR_UP_TIMEOUT."""
        return self._compose_client(up_timeout())

    @property
    def main_container(self) -> str:
        return self.container_of(MAIN)

    def container_of(self, service: str) -> str:
        """The container of one service (Compose names it `<project>-<service>-1`)."""
        return f"{self.name}-{service}-1"

    def exec_defaults(self, service: str) -> tuple[str, str | None]:
        """Where `docker exec` starts in that service and as whom: its WORKDIR (or /) and its
        user (None: root)."""
        container = self.container_of(service)
        got = self.inspected(container, "inspecting a service")
        if got is not None:
            config = got.get("Config")
            config = config if isinstance(config, dict) else {}
            workdir, user = str(config.get("WorkingDir") or ""), config.get("User")
        else:
            found = engine_call(
                "inspecting a service", lambda: self.client.container.inspect(container).config
            )
            workdir, user = str(found.working_dir or ""), found.user
        # unset comes back as "" or "."
        return (workdir if workdir.startswith("/") else "/"), (str(user) if user else None)

    def inspected(self, container: str, action: str) -> dict[str, Any] | None:
        """The engine's inspection of one of its containers as its API gives it (`State`,
        `Config`, ...), asked on the local socket: no CLI process, and python-on-whales is
        not loaded. None without such a socket (the caller asks through the CLI)."""
        return self.engine.inspected(container, action)

    def image_user(self, service: str) -> str:
        """The USER of the image a service's container runs ("0:0" when it names none): a
        file's `user: image`, resolved once its container exists."""
        container = self.container_of(service)

        def ask() -> str:
            image = self.client.container.inspect(container).image
            return str(self.client.image.inspect(image).config.user or "")

        return engine_call("inspecting a service's image", ask) or "0:0"

    def up(self) -> None:
        self._require_runtimes()
        get_images(self.compiled, self.name, host=self.host)  # as compiled.build says
        # not engine_call: `up` is not idempotent; start_project removes a failed start
        self._direct_run = None  # a retry compiled it again
        run = self._direct()
        if run is not None and self._create(run):
            self._direct_run = run
        else:
            with docker_errors(f"starting project {self.name}"):
                if self.compiled.late_networks:
                    self._create_and_join()
                self.up_client.compose.up(detach=True, quiet=True)
        self._verify_runtimes()
        if GATEWAY in self.compiled.infra:
            self._wait_gateway()

    def _create_and_join(self) -> None:
        """Create the containers, and join each to its shared networks with no alias before
        `up` starts them (network.py): Compose would give it its service name there, which
        a file chooses, and another environment's containers would reach it by that name."""
        for network in sorted({n for v in self.compiled.late_networks.values() for n in v}):
            self._require_network(network)
        self.up_client.compose.create()
        for service, networks in self.compiled.late_networks.items():
            container = self.container_of(service)
            for network in networks:
                action = f"joining {service} to the network {network}"
                self.engine.connect(network, container, action=action)

    def _require_network(self, network: str) -> None:
        """Refuse a shared network the engine does not have: it would take the join of a
        created container on trust, and fail only at its start, less clearly."""
        try:
            self.engine.require_network(network, action=f"inspecting the network {network}")
        except DockerError as exc:
            raise UsageError(
                f"{EGRESS_NETWORK_ENV} names the network {network!r}, which this engine does not "
                f"give ({exc}): create it (`docker network create {network}`) or unset the "
                "variable"
            ) from None

    def _direct(self) -> DirectRun | None:
        """How to make this project through the Engine API, when it is one container
        Compose would only make, on an engine on this machine's socket (see direct.py);
        None: Compose brings it up and down."""
        if self._direct_run is not None:
            return self._direct_run
        if self.engine.socket is None:
            return None
        try:  # what Compose would read (also for an attached project)
            text = (self.directory / "compose.yaml").read_text(encoding="utf-8")
        except OSError:
            return None
        return direct_run(text, self.name, self.directory)

    def _direct_or_none(self) -> DirectRun | None:
        """As `_direct`, for a removal, which must not fail on the file: Compose then."""
        try:
            return self._direct()
        except (OrchestratorError, OSError):
            return None

    def _create(self, run: DirectRun) -> bool:
        """Create and start the container; False when its image is missing (Compose pulls
        it: a registry is the CLI's business)."""
        for folder in run.folders:
            make_folders(folder)
        for path, text in run.files.items():
            make_folders(path.parent)
            write_file(path, text, 0o644)  # as the engine's: any user of the sandbox reads them
        engine, bound = self.engine, up_timeout()
        action = f"starting project {self.name}"
        if engine.kind == "podman":
            run = run.for_podman()
        for volume in run.volumes.values():  # pinned host folders, mounted at the start
            engine.create_volume(volume, seconds=bound, action=action)
        try:
            made = engine.create_container(run.name, run.body, seconds=bound, action=action)
        except NoSuchImage:
            return False
        for warning in (made or {}).get("Warnings") or []:  # e.g. a limit this kernel lacks
            log.warning("%s: the engine warns: %s", self.name, warning)
        engine.start_container(run.name, seconds=bound, action=action)
        return True

    def _delete(self, run: DirectRun) -> None:
        """Stop, then remove, as `compose down` does: SIGTERM, and SIGKILL after the
        container's grace (a command may save its work to a mounted folder meanwhile)."""
        engine, removing = self.engine, f"removing project {self.name}"
        engine.stop_container(run.name, grace=STOP_TIMEOUT, action=f"stopping project {self.name}")
        engine.delete_container(run.name, action=removing)
        for volume in run.volumes.values():
            engine.delete_volume(volume["Name"], action=removing)

    def _verify_runtimes(self) -> None:
        """After `up`, before anything runs in them: each container that needs gVisor runs
        on it, as the engine itself says. An engine (or a Compose) that ignores `runtime:`
        would otherwise start the sandbox on runc while every check before passed."""
        for service, want in self.compiled.runtime_of.items():
            got = self._runtime_of(self.container_of(service))
            if got != want:
                raise StartupError(
                    f"{self.name}: {service} should run on the engine runtime {want!r} "
                    f"(isolation: gvisor) but the engine started it on {got or 'its default'!r}:"
                    " this engine or its Compose ignores `runtime:`; use Docker with runsc "
                    "registered (docs/isolation.md)"
                )

    def _require_runtimes(self) -> None:
        """Refuse, before anything is made, a project whose runtime (gVisor's) the engine
        does not have: the engine would start no container of it, or fall back to none."""
        if not self.compiled.runtimes:
            return
        have = set(self.engine.runtimes())
        missing = [r for r in self.compiled.runtimes if r not in have]
        if missing:
            raise BackendUnavailable(
                f"{self.name}: `isolation: gvisor` needs the engine runtime "
                f"{', '.join(missing)}, which this engine does not have (it has "
                f"{', '.join(sorted(have)) or 'none'}): install gVisor's runsc and register it "
                "in the engine's daemon.json (scripts/bootstrap does both where it may; see "
                f"docs/isolation.md), or name the registered one in {GVISOR_RUNTIME_ENV}"
            )

    def _runtime_of(self, container: str) -> str | None:
        def ask() -> str | None:
            return self.client.container.inspect(container).host_config.runtime

        return engine_call("inspecting a container's runtime", ask)

    def _wait_gateway(self) -> None:
        """Wait until the egress gateway takes connections, with one exec that looks from
        inside it (a healthcheck would exec into it every interval of its whole life)."""
        deadline = up_timeout()
        argv = self.engine.exec_target(self.container_of(GATEWAY)).argv(
            ["/bin/bash", "-c", GATEWAY_READY, "ready", str(int(deadline * 10))]
        )
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=deadline + 10, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StartupError(f"{self.name}: the egress gateway did not start: {exc}") from None
        if done.returncode != 0:
            logs = self.logs(GATEWAY, tail=20).strip()
            raise StartupError(
                f"{self.name}: the egress gateway did not take connections within "
                f"{deadline:g}s (ORCHESTRATOR_UP_TIMEOUT); its last lines:\n{logs}"
            )

    def tether(self, services: Iterable[str]) -> None:
        """Tie the extra services' lives to this process, with nothing of ours left to run
        once it is gone (its guardian may be killed with it): in each, a `docker exec -i`
        of TETHER waits on an input whose only write end this process holds. When that
        input ends without the word `release` (this process died, by any signal), the
        service stops itself from inside, as the main container does through its
        executor's --owned. A service without /bin/sh is not tied: the next reaper (`ps`,
        any spawn) removes it. `release()` unties them."""
        for service in services:
            target = self.engine.exec_target(self.container_of(service))
            argv = target.argv(["/bin/sh", "-c", TETHER], stdin=True)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # a terminal's Ctrl-C to us is not our death
                )
            except OSError:  # no process slot left: the guardian and the reapers remain
                continue
            with self._tether_lock:
                self._tethers.append(proc)

    def release(self) -> None:
        """Untie the services from this process (kept, handed over, or being removed):
        each tether gets the word `release` and exits, leaving its service running. Those
        still running after TETHER_WAIT linger (see `down`)."""
        with self._tether_lock:
            tethers, self._tethers = self._tethers, []
        for proc in tethers:
            if proc.stdin is None:
                continue
            with contextlib.suppress(OSError):  # its container is gone already
                proc.stdin.write(RELEASE)
            with contextlib.suppress(OSError):
                proc.stdin.close()
        deadline = time.monotonic() + TETHER_WAIT
        for proc in tethers:
            # never killed here: that would end its input, which stops the service; a tether
            # slow to exit (a gVisor service's exec ends slowly) is waited for by a thread of
            # its own, which holds it until it ends: dropped while running, it would be a
            # zombie and a ResourceWarning
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with self._tether_lock:
                    self._lingering.append(proc)
                threading.Thread(target=proc.wait, daemon=True).start()

    def down(self, keep: bool = False) -> None:
        """Remove containers, networks and volumes (or only stop them with keep=True)."""
        self.release()
        try:
            self._down(keep)
        finally:
            if not keep:
                with self._tether_lock:
                    lingering, self._lingering = self._lingering, []
                _end_tethers(lingering)

    def _down(self, keep: bool) -> None:
        if not (self.directory / "compose.yaml").exists():  # removed from outside (`down`)
            remove_by_label(self.name, self.engine)
            shutil.rmtree(self.directory, ignore_errors=True)
            return
        if keep:
            write_file(self.directory / KEPT_FILE, b"")  # reapers and guardians leave it alone
            engine_call(
                f"stopping project {self.name}",
                lambda: self.client.compose.stop(timeout=STOP_TIMEOUT),
            )
            return
        run = self._direct_or_none()  # its one container, and nothing else
        try:
            self._remove(run)
            # Compose leaves a network or volume that another's container holds, saying so
            # only as "Resource is still in use", and exits 0
            left = run is None and self._left() is not False  # None: not known
        except DockerError as exc:
            if exc.returncode == TIMED_OUT:  # a hung engine: its bound is spent already
                raise
            # the engine can fail a removal over a race of its own ("unable to remove
            # filesystem ...: directory not empty" under load, the container left Dead)
            log.info(
                "%s: the engine failed its removal (%s); removing what is left", self.name, exc
            )
            left = True
        if left:
            remove_by_label(self.name, self.engine)  # a volume in use stays (said), for later
        shutil.rmtree(self.directory, ignore_errors=True)

    def _remove(self, run: DirectRun | None) -> None:
        """One removal of the whole project: its one container directly, or `compose down`."""
        if run is not None:
            self._delete(run)
            return
        engine_call(
            f"removing project {self.name}",
            lambda: self.client.compose.down(
                remove_orphans=True, volumes=True, timeout=STOP_TIMEOUT, quiet=True
            ),
        )

    def _left(self) -> bool | None:
        """Whether anything with this project's label is left on its engine, asked through
        the API on a local socket (None without one: `remove_by_label` lists and finds)."""
        return self.engine.labelled_left(
            f"{LABEL_PROJECT}={self.name}", action=f"listing what is left of {self.name}"
        )

    def kill(self) -> None:
        self.release()
        engine_call(f"killing project {self.name}", self.client.compose.kill)

    def keep(self) -> None:
        """Mark the project kept: reapers and guardians leave it (running) for `down`."""
        write_file(self.directory / KEPT_FILE, b"")
        self.release()

    def ports(self) -> list[PublishedPort]:
        """Published ports of every service (ephemeral ones resolved)."""
        return published_ports(engine_call("reading published ports", self.client.compose.ps))

    def service_states(self) -> list[tuple[str, Look]]:
        """(service, its state) for every container of the project."""
        containers = engine_call(
            "listing project containers", lambda: self.client.compose.ps(all=True)
        )
        return [(service_of(c.config.labels, c.name), Look.of(c.state)) for c in containers]

    def logs(self, service: str | None = None, tail: int | None = None) -> str:
        text = engine_call(
            "reading logs",
            lambda: self.client.compose.logs(
                services=[service] if service else [], tail=str(tail) if tail else None
            ),
        )
        return text if isinstance(text, str) else ""


GATEWAY_READY = (
    'for _ in $(seq "$1"); do (exec 3<>/dev/tcp/127.0.0.1/' + str(PROXY_PORT) + ") 2>/dev/null"
    " && exit 0; sleep 0.1; done; exit 1"
)
"""Run in the gateway: exit 0 once its proxy port takes a connection (tenths of a second
to wait given as $1)."""


def _retry_subnet(attempt: Callable[[int], T], tries: int = 8) -> T:
    """Run attempt(0), attempt(1), ... while the engine says our subnet overlaps another."""
    for i in range(tries):
        try:
            return attempt(i)
        except SubnetOverlap:
            if i == tries - 1:
                raise
    raise AssertionError("unreachable")


NO_LIMITS_ENV = settings.ROOTLESS_WITHOUT_LIMITS.name


def start_project(
    env: Environment,
    make_options: Callable[[str, dict[str, str], str | None], CompileOptions],
    *,
    detached: bool = False,
    extra_files: dict[str, bytes] | None = None,
    host: str = "",
) -> Project:
    """Compile, write and bring up a project (on engine `host`, else the process's); on any
    failure remove everything it created."""
    name = project_name(env.name)
    directory = projects_dir() / name
    engine = resolved_host(host)
    _claim(directory, engine)
    labels = project_labels(env, name, directory, detached)
    pins = Pins(directory / PINNED_DIR)  # held until the engine has mounted them

    def options(subnet: str | None) -> CompileOptions:
        return pin_options(make_options(name, labels, subnet), pins, host)

    # Spec, policy and engine errors surface here, before anything runs. The subnet is only
    # used when the project has a network of its own; a retry recompiles with a fresh one.
    try:
        compiled = compile_project(env, options(pick_subnet()))
        project = Project(name, directory, compiled, host)
        # (a retry changes no network and no folder)
        require_engine(compiled, name, project.engine, directory)
        raise_if([], missing_images(compiled, host=host))  # nothing is pulled, or made
    except BaseException:
        pins.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    reap_soon()  # leftovers of crashed runs, in the background
    if not detached:
        ensure_guardian()  # removes this process's projects if it dies without cleaning up

    def attempt(retry: int) -> Project:
        if retry:  # the subnet was taken meanwhile: compile again with another
            _claim(directory, engine)  # the failed attempt removed it
            project.compiled = compile_project(env, options(pick_subnet()))
        project.compiled.write(directory)
        for rel, data in (extra_files or {}).items():  # the executor: any user reads it
            make_folders((directory / rel).parent, 0o755)
            write_file(directory / rel, data, 0o644)
        try:
            project.up()
        except DockerError as exc:
            err = _diagnose(project, exc, env)
            _remove_quietly(project)
            if err is exc:
                raise
            raise err from exc
        except StartupError:  # its egress gateway never took connections
            _remove_quietly(project)
            raise
        return project

    try:
        try:
            _retry_subnet(attempt)
        finally:
            pins.close()  # every container is made and started: the engine holds its mounts
        if not detached:  # its services stop when this process dies, guardian or not
            project.tether(  # jobs ended already
                [*(n for n, s in env.spec.services.items() if not s.job), *project.compiled.infra]
            )
        return project
    except (DockerError, StartupError):
        raise  # attempt() already removed what it made
    except BaseException:  # interrupted mid-start: remove whatever exists
        _remove_quietly(project)
        raise


def _claim(directory: Path, engine: str) -> None:
    """Make the project folder, with its owner and its engine's address: whoever reaps it,
    working with whichever engine, asks that one whether it is still someone's."""
    claim_folder(directory)
    if engine:  # (none: a context the CLI resolves itself; the folder stays the default's)
        write_file(directory / ENGINE_FILE, engine + "\n")


def _remove_quietly(project: Project) -> None:
    try:
        project.down()
    except OrchestratorError:
        # if the engine is gone too, `orchestrator cleanup` finds the rest by label later
        with contextlib.suppress(OrchestratorError):
            remove_by_label(project.name, project.engine)
    shutil.rmtree(project.directory, ignore_errors=True)


def _diagnose(project: Project, exc: DockerError, env: Environment) -> OrchestratorError:
    """A failed `up` because a service never became healthy, died, or (a job) exited
    non-zero becomes an error that names the service, its exit code and its last log
    lines; a disk limit the engine cannot enforce becomes a spec error naming the field."""
    if isinstance(exc, StorageOptUnsupported):
        return SpecError(
            SpecIssue(
                env.source,
                field="resources.disk",
                message="this engine cannot limit a container's disk (its storage driver needs "
                "overlay2 on xfs with pquota, btrfs or zfs for that)",
                fix="remove resources.disk here, or bound /tmp with resources.tmp",
            )
        )
    try:
        states = project.service_states()
    except OrchestratorError:
        return exc
    jobs = {name: svc.job for name, svc in env.spec.services.items()}
    bad = [
        (svc, look)
        for svc, look in states
        if svc in jobs
        and (look.health == "unhealthy" or (look.ended and not (jobs[svc] and look.exit_code == 0)))
    ]

    def tail(svc: str) -> str:
        try:
            return project.logs(svc, tail=LOG_LINES)
        except OrchestratorError:
            return ""

    parts = [failure(project.name, svc, jobs[svc], look, tail(svc)) for svc, look in bad]
    if not parts and exc.returncode == TIMED_OUT:  # Compose waited on a job or a healthcheck
        parts = [
            late(project.name, svc, jobs[svc], look, tail(svc), up_timeout())
            for svc, look in states
            if svc in jobs and not_ready(look, jobs[svc])
        ]
    return HealthcheckFailed("\n".join(parts)) if parts else exc


def build_images(env: Environment, compiled: CompiledProject, *, host: str = "") -> list[str]:
    """Get the images the environment builds as `compiled.build` says (see build.py), on
    engine `host` (else the process's): spawns starting together build each once. Returns
    the tags built."""
    require_engine(compiled, env.name, Engine.at(host))
    return get_images(compiled, env.name, host=host)


PODMAN_UNMOUNTABLE = frozenset('",\n\r')
"""What Podman's API cannot take in a mount's source or target: it reads each mount back as
a CSV line of options (`"` breaks the parse, and `,` starts another option: a target
`/m,src=/etc` would mount the host's /etc)."""


def _mount_paths(compose_yaml: str, directory: Path | None) -> list[str]:
    """Every path a mount of the project names (the project folder, whose files the
    relative sources are; each volume's source and target, each tmpfs), for the check
    above. A file that cannot be read gives every string in it: nothing is let through
    unread."""
    paths = [str(directory)] if directory else []
    try:
        doc = YAML(typ="safe").load(compose_yaml) or {}
        services = doc.get("services") or {}
        for svc in services.values():
            for volume in svc.get("volumes") or []:
                if isinstance(volume, dict):
                    paths += [str(volume.get(k, "")) for k in ("source", "target")]
                else:
                    paths.append(str(volume))
            tmpfs = svc.get("tmpfs") or []
            paths += [str(t) for t in ([tmpfs] if isinstance(tmpfs, str) else tmpfs)]
    except (YAMLError, AttributeError, TypeError):
        paths.append(compose_yaml)
    return paths


def require_engine(
    compiled: CompiledProject, name: str, engine: Engine, directory: Path | None = None
) -> None:
    """Refuse, before anything is built or made, what Podman's Docker-compatible API does
    not do as Docker does (docs/isolation.md): it runs a sandbox without a network. The
    environment's networks would hold no egress rule there: Podman ignores `internal`, runs
    no healthcheck of its own and, beside Docker, has its bridges' traffic dropped; and it
    ignores `runtime:`. Rootless on cgroup v1 it ignores every resource limit: refused
    unless the caller accepts that (ORCHESTRATOR_ROOTLESS_WITHOUT_LIMITS=1). A mount whose
    source or target Podman would misread (the project folder `directory`, the workspace,
    the workdir, each mount and static asset) is refused by name."""
    facts = engine.facts()
    if facts.kind != "podman":
        return
    for path in _mount_paths(compiled.compose_yaml, directory):
        if PODMAN_UNMOUNTABLE & set(path):
            raise BackendUnavailable(
                f"{name}: Podman cannot mount {path!r}: its API reads a mount as a list split "
                "at commas (a comma in a path would add options, or name another host "
                "folder), and a double quote or a line break breaks it. Use paths without "
                "those characters (mounts, workdir, static assets, the state folder: "
                "ORCHESTRATOR_STATE_DIR), or run it on Docker"
            )
    networked = (
        compiled.network_mode != "none"
        or compiled.has_network
        or compiled.published
        or bool(compiled.infra)
    )
    unlimited = facts.rootless and facts.cgroup_v1 and not settings.ROOTLESS_WITHOUT_LIMITS.get()
    needs = [
        what
        for what, needed in (
            ("a network (services, published ports, or egress other than none)", networked),
            ("`isolation: gvisor` (Podman's API ignores `runtime:`)", bool(compiled.runtimes)),
            (
                "its resource limits (memory, cpus, pids), which rootless Podman on cgroup v1 "
                f"ignores without a word ({NO_LIMITS_ENV}=1 runs it without them)",
                unlimited,
            ),
        )
        if needed
    ]
    if needs:
        where = (
            " (on Podman a sandbox runs without network: network: {mode: none}, or the "
            "default egress none with no ports and no services)"
            if networked
            else ""
        )
        raise BackendUnavailable(
            f"{name}: this file needs {' and '.join(needs)}, which the Podman engine does "
            f"not give here{where}. Run it on Docker (see docs/isolation.md)"
        )
