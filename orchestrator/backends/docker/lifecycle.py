"""One Compose project on disk and in the engine: made (through Compose, or directly through
the Engine API when it is one container), checked (its runtimes, its gateway), inspected,
and taken down. Bringing one up, with the removal of a failed start, is start.py's."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from orchestrator import procutil
from orchestrator.backends.container.binds import Pins
from orchestrator.backends.container.engine import (
    TIMED_OUT,
    UP_TIMEOUT_ENV,
    Engine,
    NoSuchImage,
    docker_errors,
    engine_call,
    published_ports,
    service_of,
    up_timeout,
)
from orchestrator.backends.container.engine.containers import (
    COMPOSE_PROJECT,
    COMPOSE_SERVICE,
    api_published_ports,
)
from orchestrator.backends.container.identity import KEPT_FILE, LABEL_PROJECT
from orchestrator.backends.container.inventory import remove_by_label
from orchestrator.backends.container.readiness import Look, listening, runs_here
from orchestrator.backends.container.removal import (
    LEAVE_WITHIN,
    UP,
    leave_networks,
    leave_project_networks,
)
from orchestrator.backends.docker.build import get_images
from orchestrator.backends.docker.contexts import gvisor_runtime
from orchestrator.backends.docker.direct import DirectRun, direct_project, direct_run
from orchestrator.backends.docker.memory import sealed_runtime
from orchestrator.backends.docker.needs import require_runtimes
from orchestrator.backends.docker.network import (
    EGRESS_NETWORK_ENV,
    FRONT_PORT,
    GATEWAY,
    PROXY_PORT,
)
from orchestrator.backends.docker.render import CompiledProject
from orchestrator.backends.docker.tether import Tethers
from orchestrator.errors import DockerError, OrchestratorError, StartupError, UsageError
from orchestrator.paths import make_folders, write_file
from orchestrator.spec.models import PublishedPort
from orchestrator.spec.resolve import MAIN

if TYPE_CHECKING:
    from python_on_whales import DockerClient

STOP_TIMEOUT = 2
T = TypeVar("T")
SIDE_BY_SIDE = 8
"""Threads one removal takes at most (its containers, its networks)."""
log = logging.getLogger("orchestrator.docker")


def _labels(container: dict[str, Any]) -> dict[str, Any]:
    """A container's labels, as the API lists it ({} when it says none)."""
    labels = container.get("Labels")
    return labels if isinstance(labels, dict) else {}


def side_by_side(do: Callable[[T], None], items: Sequence[T]) -> None:
    """`do` of each item, each in a thread of its own (engine calls: each bounded), all
    ended before it returns; the first failure is raised once all have ended."""
    if len(items) <= 1:
        for item in items:
            do(item)
        return
    with ThreadPoolExecutor(max_workers=min(len(items), SIDE_BY_SIDE)) as pool:
        futures = [pool.submit(do, item) for item in items]
    for future in futures:
        future.result()


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
    tethers: Tethers = field(init=False, default_factory=Tethers)
    """Its extra services' ties to this process (see tether.py)."""
    _direct_run: DirectRun | None = field(init=False, default=None)
    """How `up` made it, when through the Engine API (see direct.py)."""
    pins: Pins | None = field(init=False, default=None)
    """The descriptors of its pinned host folders, held while it lives in this process
    when it may be started again (a sealed gVisor sandbox, started again from its memory:
    memory.py); None: let go once it started (or made by another process)."""
    first_start: Callable[[Project, DirectRun], bool] | None = field(init=False, default=None)
    """Starts the one container `up` makes through the Engine API in place of a plain start
    (a copy with memory, from its image: ComposeRuntime._from_memory); False when it did
    not, and the container is started plainly."""

    @property
    def sealed(self) -> bool:
        """Made through the Engine API on the sealed runtime (memory.py)."""
        return self._direct_run is not None and self._direct_run.runtime == sealed_runtime()

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
        have = require_runtimes(self.compiled, self.name, self.engine)
        get_images(self.compiled, self.name, host=self.host)  # as compiled.build says
        # not engine_call: `up` is not idempotent; start_project removes a failed start
        self._direct_run = None  # a retry compiled it again
        run = self._direct()
        # (a runtime by that name that keeps a network stack is not taken for it)
        if run is not None and "--network=none" in have.get(sealed_runtime(), ()):
            run = self._direct_run = run.sealed(gvisor_runtime(), sealed_runtime())
        if run is not None and self._create(run):
            self._direct_run = run
        elif run is None and self._create_many():
            pass
        else:
            with docker_errors(f"starting project {self.name}"):
                if self.compiled.late_networks:
                    self._create_and_join()
                self.up_client.compose.up(detach=True, quiet=True)
        self._verify_runtimes()
        if GATEWAY in self.compiled.infra:
            self.wait_gateway()

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

    def _require_network(self, network: str, engine: Engine | None = None) -> None:
        """Refuse a shared network the engine does not have: it would take the join of a
        created container on trust, and fail only at its start, less clearly."""
        try:
            (engine or self.engine).require_network(
                network, action=f"inspecting the network {network}"
            )
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
        if self.first_start is None or not self.first_start(self, run):
            engine.start_container(run.name, seconds=bound, action=action)
        return True

    def _create_many(self) -> bool:
        """Make a project of several containers through the Engine API, as Compose would
        (direct.py's `direct_project`): its networks, volumes and containers one after the
        other (an interrupted start then leaves nothing made after its removal listed what
        there was), each joined to its other networks, then started, each wave of them
        side by side once those they depend on have started. False, having made nothing,
        where Compose must: another engine than Docker on this machine's socket, a file
        the fast path does not read exactly as Compose, an image the engine lacks (Compose
        pulls it, where the caller allows)."""
        if not self._by_api:
            return False
        try:
            text = (self.directory / "compose.yaml").read_text(encoding="utf-8")
        except OSError:
            return False
        plan = direct_project(text, self.name, self.directory)
        action = f"starting project {self.name}"
        deadline = time.monotonic() + up_timeout()  # (the whole start, as Compose's was)
        if plan is None:
            return False
        if not all(self._until(deadline, action).has_image(i) for i in set(plan.images)):
            return False  # (Compose pulls it, where the caller allows)

        def engine() -> Engine:
            return self._until(deadline, action, f" (give it more time: {UP_TIMEOUT_ENV})")

        def bound() -> float:
            return engine().bound

        for network in sorted({n for v in self.compiled.late_networks.values() for n in v}):
            self._require_network(network, engine())
        for folder in plan.folders:
            make_folders(folder)
        for volume in plan.volumes.values():
            engine().create_volume(volume, seconds=bound(), action=action)
        for body in plan.networks:
            engine().create_network(body, seconds=bound(), action=action)
        for made in plan.containers:
            answer = engine().create_container(made.name, made.body, seconds=bound(), action=action)
            for warning in (answer or {}).get("Warnings") or []:
                log.warning("%s: the engine warns: %s", self.name, warning)
            for network, aliases in made.joins:
                engine().connect(network, made.name, action=action, aliases=aliases)
            for network in self.compiled.late_networks.get(made.service, ()):
                joining = f"joining {made.service} to {network}"
                engine().connect(network, made.name, action=joining)
        for wave in plan.waves():
            side_by_side(
                lambda c: engine().start_container(c.name, seconds=bound(), action=action), wave
            )
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
            if got != want and not (service == "main" and self.sealed and got == sealed_runtime()):
                raise StartupError(
                    f"{self.name}: {service} should run on the engine runtime {want!r} "
                    f"(isolation: gvisor) but the engine started it on {got or 'its default'!r}:"
                    " this engine or its Compose ignores `runtime:`; use Docker with runsc "
                    "registered (docs/isolation.md)"
                )

    def runtime_of_main(self) -> str | None:
        """The engine runtime the main container runs on, as the engine says."""
        return self._runtime_of(self.main_container)

    def _runtime_of(self, container: str) -> str | None:
        """A container's engine runtime, as the engine says (on its local socket where it
        has one: no CLI process)."""
        got = self.inspected(container, "inspecting a container's runtime")
        if got is not None:
            runtime = (got.get("HostConfig") or {}).get("Runtime")
            return str(runtime) if runtime else None

        def ask() -> str | None:
            return self.client.container.inspect(container).host_config.runtime

        return engine_call("inspecting a container's runtime", ask)

    def wait_gateway(self) -> None:
        """Wait until the egress gateway takes connections: seen from this machine's kernel
        where it can be (`_gateway_heard`), else with one exec that looks from inside it
        (a healthcheck would exec into it every interval of its whole life)."""
        deadline = up_timeout()
        ends = time.monotonic() + deadline
        heard = self._gateway_heard(ends)
        if heard is True:
            return
        left = ends - time.monotonic()  # (one bound for both ways of looking)
        if heard is False or left <= 0:
            self._gateway_failed(deadline)
        argv = self.engine.exec_target(self.container_of(GATEWAY)).argv(
            ["/bin/bash", "-c", GATEWAY_READY, "ready", str(max(1, int(left * 10)))]
        )
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=left + 10,
                check=False,
                env=procutil.marked_environ(),  # ended by our guardian if we die first
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StartupError(f"{self.name}: the egress gateway did not start: {exc}") from None
        if done.returncode != 0:
            self._gateway_failed(deadline)

    def _gateway_failed(self, deadline: float) -> NoReturn:
        logs = self.logs(GATEWAY, tail=20).strip()
        raise StartupError(
            f"{self.name}: the egress gateway did not take connections within "
            f"{deadline:g}s (ORCHESTRATOR_UP_TIMEOUT); its last lines:\n{logs}"
        )

    def _gateway_heard(self, ends: float) -> bool | None:
        """Whether the gateway's proxy and plain-HTTP front listen by `ends` (monotonic),
        as this machine's kernel lists the sockets of its network namespace (an exec costs
        a tenth of a second; this, a read every 10 ms). None where that cannot be seen: an
        engine elsewhere, a runtime with a network stack of its own (gVisor's: the kernel
        lists none of its sockets), a gateway not running (or gone meanwhile): the exec
        then says."""
        action, container = "waiting for the egress gateway", self.container_of(GATEWAY)
        got = self.engine.inspected(container, action)
        runtime = ((got or {}).get("HostConfig") or {}).get("Runtime")
        if runtime not in KERNEL_NETWORK_RUNTIMES or not runs_here(got):
            return None
        pid = (got or {})["State"]["Pid"]
        while not (heard := listening(pid, {PROXY_PORT, FRONT_PORT})):
            if heard is None:
                return None
            if time.monotonic() >= ends:
                return False
            time.sleep(0.01)
        again = self.engine.inspected(container, action)  # (still that process: no pid reused)
        return True if runs_here(again) and (again or {})["State"]["Pid"] == pid else None

    def tether(self, services: Iterable[str]) -> None:
        """Tie the extra services' lives to this process, with nothing of ours left to run
        once it is gone (its guardian may be killed with it); `release()` unties them."""
        self.tethers.tie(self.engine.exec_target(self.container_of(s)) for s in services)

    def release(self) -> None:
        """Untie the services from this process (kept, handed over, or being removed)."""
        self.tethers.release()

    def let_go(self) -> None:
        """Close the pinned folders' descriptors it still holds (see `pins`)."""
        pins, self.pins = self.pins, None
        if pins is not None:
            pins.close()

    def down(self, keep: bool = False, before_gateway: Callable[[], None] | None = None) -> None:
        """Remove containers, networks and volumes (or only stop them with keep=True).
        `before_gateway`: called once every other container is gone and before the
        environment's own go (its egress counted at last: nothing can begin after it), where
        the removal goes through the engine's API; never where it goes otherwise (Compose
        takes every container at once; a kept one is stopped whole), where no such moment
        is had; its failure is logged, never raised."""
        self.release()
        try:
            self._down(keep, before_gateway)
        finally:
            self.let_go()
            if not keep:
                self.tethers.end_lingering()

    def _down(self, keep: bool, before_gateway: Callable[[], None] | None = None) -> None:
        if not (self.directory / "compose.yaml").exists():  # removed from outside (`down`)
            remove_by_label(self.name, self.engine)
            shutil.rmtree(self.directory, ignore_errors=True)
            return
        if keep:
            write_file(self.directory / KEPT_FILE, b"")  # reapers and guardians leave it alone
            if not self.stop_one_by_one():  # (on its networks, to start again: removal.py)
                engine_call(
                    f"stopping project {self.name}",
                    lambda: self.client.compose.stop(timeout=STOP_TIMEOUT),
                )
            return
        run = self._direct_or_none()  # its one container, and nothing else
        try:
            self._remove(run, before_gateway)
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

    def _remove(self, run: DirectRun | None, before_gateway: Callable[[], None] | None) -> None:
        """One removal of the whole project: its one container directly, its containers
        through the engine's API on this machine's socket, or `compose down`."""
        if run is not None:
            self._delete(run)
            return
        if self._by_api:
            try:
                self._remove_by_api(before_gateway)
            except DockerError:
                raise
            except Exception as exc:  # (no thread to be had, an answer of an odd shape)
                raise DockerError(f"removing project {self.name} failed: {exc!r}") from exc
            return
        engine_call(
            f"removing project {self.name}",
            lambda: self.client.compose.down(
                remove_orphans=True, volumes=True, timeout=STOP_TIMEOUT, quiet=True
            ),
        )

    def _remove_by_api(self, before_gateway: Callable[[], None] | None = None) -> None:
        """What `compose down` does, through the API, without a Compose process (about a
        second of its own, more on a busy machine): every container of the project stopped
        side by side, the sandbox and the file's services with their grace (a command may
        save its work to a mounted folder meanwhile), the environment's own (gateway,
        forwarder: nothing to save) at once; each removed; then its volumes and networks.
        A failure (a race of the engine's) is raised, and `_down` removes what is left by
        label. All of it within one engine bound (as `compose down` was), each step's calls
        bounded by what is left of it."""
        removing = f"removing project {self.name}"
        deadline = time.monotonic() + self.engine.bound

        def engine() -> Engine:
            return self._until(deadline, removing)

        found = engine().labelled(f"{LABEL_PROJECT}={self.name}", action=removing)
        own = set(self.compiled.infra)
        left = deadline - time.monotonic()
        leave_networks(self.engine, found["containers"], removing, min(LEAVE_WITHIN, left / 2))

        def end(container: dict[str, Any]) -> None:
            ident, service = str(container.get("Id", "")), _labels(container).get(COMPOSE_SERVICE)
            if service not in own:
                engine().stop_container(ident, grace=STOP_TIMEOUT, action=removing)
            engine().delete_container(ident, action=removing)

        containers = found["containers"]
        if before_gateway is None:
            side_by_side(end, containers)
        else:  # the environment's own last, `before_gateway` between
            side_by_side(end, [c for c in containers if _labels(c).get(COMPOSE_SERVICE) not in own])
            try:
                before_gateway()
            except Exception as exc:  # (what it reads is the caller's; the removal goes on)
                log.info("%s: before its gateway went: %s", self.name, exc)
            side_by_side(end, [c for c in containers if _labels(c).get(COMPOSE_SERVICE) in own])
        side_by_side(
            lambda v: engine().delete_volume(str(v.get("Name", "")), action=removing),
            found["volumes"],
        )
        side_by_side(
            lambda n: engine().delete_network(str(n.get("Id", "")), action=removing),
            found["networks"],
        )

    def _until(self, deadline: float, action: str, fix: str = "") -> Engine:
        """Its engine, each call bounded by what is left until `deadline` (whole seconds:
        one engine each); a DockerError (timed out, then `fix`) once it has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise DockerError(f"{action} timed out{fix}", returncode=TIMED_OUT)
        return self.engine.within(max(1, int(left)))

    def stop_one_by_one(self) -> bool:
        """Stop its containers as `compose stop` does, but one after the other: each leaves
        its networks as it stops, never beside another (see removal.leave_networks); those
        still running after LEAVE_WITHIN (a file's many services, each using its grace)
        together. False, having done nothing, on an engine not on this machine's socket or
        not Docker's (`compose stop` then)."""
        if self.engine.socket is None or self.engine.kind != "docker":
            return False
        stopping = f"stopping project {self.name}"
        found = self.engine.labelled(f"{LABEL_PROJECT}={self.name}", action=stopping)
        up = [  # (what `compose stop` would stop: not a container that wears our label alone)
            c
            for c in found["containers"]
            if c.get("State") in UP and _labels(c).get(COMPOSE_PROJECT) == self.name
        ]
        deadline = time.monotonic() + LEAVE_WITHIN

        def stop(container: dict[str, Any]) -> None:
            ident = str(container.get("Id", ""))
            self.engine.stop_container(ident, grace=STOP_TIMEOUT, action=stopping)

        while up and time.monotonic() < deadline:
            stop(up.pop(0))
        side_by_side(stop, up)  # (past LEAVE_WITHIN, a file's many services: the rest at once)
        return True

    def _left(self) -> bool | None:
        """Whether anything with this project's label is left on its engine, asked through
        the API on a local socket (None without one: `remove_by_label` lists and finds)."""
        return self.engine.labelled_left(
            f"{LABEL_PROJECT}={self.name}", action=f"listing what is left of {self.name}"
        )

    def kill(self) -> None:
        self.release()
        engine_call(f"killing project {self.name}", self.client.compose.kill)

    def leave_networks(self) -> None:
        """Take all but one of its containers off each network they share, one at a time,
        before they go down together (see removal.leave_networks); nothing to do for a
        container made with networking disabled (direct.py)."""
        if self._direct_run is None:
            leave_project_networks(self.engine, self.name, f"stopping project {self.name}")

    def keep(self) -> None:
        """Mark the project kept: reapers and guardians leave it (running) for `down`."""
        write_file(self.directory / KEPT_FILE, b"")
        self.release()

    @property
    def _by_api(self) -> bool:
        """Whether its engine is Docker on this machine's socket: its API is asked directly
        (no Compose process) for what Compose would do or tell."""
        return self.engine.socket is not None and self.engine.kind == "docker"

    def ports(self) -> list[PublishedPort]:
        """Published ports of every service (ephemeral ones resolved): in one listing through
        the engine's API where it is on this machine's socket (`compose ps` is a Compose
        process and an inspection of each container: about 0.1 s), else by Compose."""
        action = "reading published ports"
        if self._by_api:
            label = f"{LABEL_PROJECT}={self.name}"
            return api_published_ports(self.engine.labelled_containers(label, action=action))
        return published_ports(engine_call(action, self.client.compose.ps))

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


KERNEL_NETWORK_RUNTIMES = frozenset({"runc", "crun", "io.containerd.runc.v2"})
"""Engine runtimes whose containers' sockets are this machine's kernel's (listed in /proc):
the gateway's readiness is read there. Any other (gVisor's, a VM's) is asked from inside."""

GATEWAY_READY = (
    'for _ in $(seq "$1"); do (exec 3<>/dev/tcp/127.0.0.1/' + str(PROXY_PORT) + ") 2>/dev/null"
    " && (exec 3<>/dev/tcp/127.0.0.1/" + str(FRONT_PORT) + ") 2>/dev/null"
    " && exit 0; sleep 0.1; done; exit 1"
)
"""Run in the gateway: exit 0 once its proxy port and its plain-HTTP front take a
connection (tenths of a second to wait given as $1)."""
