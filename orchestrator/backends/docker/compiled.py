"""What compiling a Compose project takes and gives: the caller's options (`CompileOptions`)
and the compiled project (`CompiledProject`): its compose.yaml and files, written into its
folder, and what the start checks and counts before and after `up`."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.backends.container.binds import Pins
from orchestrator.backends.container.layout import SANDBOX_DIR
from orchestrator.backends.container.mounts import ResolvedMount
from orchestrator.backends.docker.buildplan import ImageBuild
from orchestrator.backends.docker.network import RULES_DIR, egress_dns, egress_network
from orchestrator.backends.docker.relay import Secrets
from orchestrator.paths import make_folders, write_file
from orchestrator.sandbox.options import BuildChoice
from orchestrator.spec.limits import Limits
from orchestrator.spec.models import Mount, PortMap
from orchestrator.spec.policy import Policy


@dataclass(frozen=True)
class CompileOptions:
    project: str
    workspace: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    extra_mounts: Sequence[Mount] = ()
    extra_ports: Sequence[PortMap] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)
    subnet: str | None = None
    host_env: Mapping[str, str] | None = None
    platform: str = sys.platform
    policy: Policy = field(default_factory=Policy.from_env)
    main_image: str = ""
    """Run this image for the main sandbox instead of the file's image or build (a snapshot
    of a container's filesystem being resumed)."""
    service_images: Mapping[str, str] = field(default_factory=dict)
    """Run these images (by service) instead of the file's image or build (a suspended
    environment being woken); services not named run as the file says."""
    private_workspace: bool = False
    """`workspace` is the private one made for this run (or a stand-in for it), not the
    caller's: no file can name it, so it is no allowed root for host paths."""
    remote: bool = False
    """The engine may be another machine: nothing of this one is bind-mounted (the executor
    and the static assets are copied in once the containers run; the workspace lives in the
    main container), and a mount of a host folder is a spec error."""
    build: BuildChoice = "auto"
    """How the images the file builds are got (see `build_images`): "auto" builds one whose
    tag is missing, "always" builds through the engine's cache, "never" builds none."""
    leave_by: str = field(default_factory=egress_network)
    """An existing network egress leaves by (ORCHESTRATOR_EGRESS_NETWORK; empty: one made
    for each environment that needs it)."""
    resolvers: tuple[str, ...] = field(default_factory=egress_dns)
    """Resolvers of the gateway and of `all` containers (ORCHESTRATOR_EGRESS_DNS; empty:
    the engine's)."""
    pins: Pins | None = None
    """A start's pins (binding.py): host folders and files mounted as checked. None: their
    paths are rendered (`render`, `validate`, or a caller that accepted unpinned mounts)."""
    pin_refused: str = ""
    """Why this start cannot pin on its engine; every host mount is then a problem."""
    unpinned_warning: str = ""
    """Said when this start mounts host paths unpinned (the caller accepted it)."""


@dataclass(frozen=True)
class CompiledProject:
    project: str
    compose_yaml: str
    files: dict[str, str]
    """Extra files, relative to the project folder (the sandbox entry script)."""
    warnings: tuple[str, ...]
    mounts: tuple[ResolvedMount, ...]
    env: dict[str, str]
    user: str
    network_mode: str
    """bridge | host | none: how the main sandbox is networked after the rules applied."""
    has_network: bool
    """Whether the project defines its own network (needs an address pool)."""
    published: bool
    """Whether any port is published on the host."""
    folders: tuple[str, ...] = ()
    """Empty folders, relative to the project folder: each container's own transfer folder
    (IO_DIR/<service>, bind-mounted into that container alone)."""
    builds: tuple[ImageBuild, ...] = ()
    """The images it builds (the main one not when `main_image` replaces it)."""
    build: BuildChoice = "auto"
    """CompileOptions.build: how to get them before `up`."""
    infra: tuple[str, ...] = ()
    """The environment's own containers (egress gateway, port forwarder), by service."""
    runtimes: tuple[str, ...] = ()
    """Engine runtimes it needs beyond the default (gVisor's), which `up` checks first."""
    runtime_of: dict[str, str] = field(default_factory=dict)
    """Each container that needs one of `runtimes`, by service: `up` checks after that the
    engine did run it there (an engine that ignores `runtime:` must not pass for gVisor)."""
    egress: dict[str, str] = field(default_factory=dict)
    """Each networked container's egress after the caller's policy (none, all, entries)."""
    proxied: tuple[str, ...] = ()
    """The containers that reach outside through the egress gateway (by service): what a
    change of the gateway's rules (`set_egress`, a phase) applies to."""
    defuse: tuple[Path, ...] = ()
    """Host folders to make harmless after the run besides the workspace (binding.py)."""
    writable: tuple[Path, ...] = ()
    """Every host folder a container writes (a download never follows a link there)."""
    images: tuple[tuple[str, str], ...] = ()
    """(field, image) of each image it runs and does not build, for the check that the
    engine has them before anything starts (build.missing_images)."""
    pull: bool = False
    """The caller lets the engine pull missing images (Policy.allow_pull)."""
    source: str = ""
    """The environment file (for errors found after compiling)."""
    late_networks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Networks a service's container joins after it is created, before it starts, with no
    alias (a shared egress network: see network.py), by their engine names."""
    limits: dict[str, Limits] = field(default_factory=dict)
    """What each container is held to, by service (the environment's own too): what
    admission counts (`Runtime.requested`)."""

    secrets: Secrets | None = field(default=None, repr=False)
    """The environment's secrets with their values (relay.py): written beside the gateway's
    rules, never into `files` (what `render` shows)."""

    def write(self, directory: Path) -> Path:
        """Write the project into `directory` (created, private); return compose.yaml's path.
        Every folder is 0700 and compose.yaml 0600, whatever the umask, but what containers
        read through a bind mount (SANDBOX_DIR, the gateway's rules): readable by any user
        of the container, behind the project folder that only we may enter."""
        make_folders(directory)
        make_folders(directory / SANDBOX_DIR, 0o755)
        if any(rel.startswith(f"{RULES_DIR}/") for rel in self.files):
            make_folders((directory / RULES_DIR).parent)  # (gateway/: private)
            make_folders(directory / RULES_DIR, 0o755)  # (Squid reads it as its own user)
        for rel in self.folders:  # private: only root (the executor) passes in a container
            make_folders(directory / rel)
        for rel, text in self.files.items():
            make_folders((directory / rel).parent)
            write_file(directory / rel, text, 0o644)
        if self.secrets is not None:
            self.secrets.write(directory, self.project)
        compose = directory / "compose.yaml"
        write_file(compose, self.compose_yaml)
        return compose
