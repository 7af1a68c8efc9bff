"""The class half of the backend interface: what the registry, the services and the CLI ask
of a backend's class, no environment started (`Backend`, the base of `Runtime`), and what an
environment asks of the host (`Amounts`, which admission counts).

Every hook is public and documented here, with the default a backend keeps when it has
nothing to say; a backend overrides what it answers otherwise."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator._resources import templates_version
from orchestrator._version import __version__
from orchestrator.errors import UsageError
from orchestrator.sandbox.keeping import Keeping
from orchestrator.spec.limits import Limits
from orchestrator.spec.loader import Environment, require_main_image
from orchestrator.spec.lockfile import Lock
from orchestrator.spec.policy import Policy

if TYPE_CHECKING:  # (types only: these modules build on this one)
    from orchestrator.sandbox.base import Runtime
    from orchestrator.sandbox.options import BuildChoice, SpawnOptions
    from orchestrator.sandbox.snapshot import Snapshot

log = logging.getLogger("orchestrator")
GiB = 1024**3
EPSILON = 1e-9


@dataclass(frozen=True)
class Amounts:
    """What an environment takes of its host: the sum of its containers' limits."""

    memory: int
    """Bytes."""
    cpus: float

    def fits(self, used: Amounts, budget: Amounts) -> bool:
        return (
            used.memory + self.memory <= budget.memory
            and used.cpus + self.cpus <= budget.cpus + EPSILON
        )

    def words(self) -> str:
        return f"{gib(self.memory)} GiB of memory and {self.cpus:g} CPUs"

    @classmethod
    def total(cls, limits: Iterable[Limits]) -> Amounts:
        """What containers held to `limits` take together."""
        each = list(limits)
        return cls(sum(x.memory for x in each), sum(x.cpus for x in each))


def gib(n: int) -> str:
    return f"{n / GiB:.3g}"


def request(env: Environment) -> Amounts:
    """What the file's containers (its main sandbox and its services) are held to, each at
    its own limits or the caller's defaults: what a backend that runs nothing of its own
    asks for (`Runtime.requested`; the Docker backend adds its gateway and forwarder)."""
    spec = env.spec
    return Amounts.total(
        Limits.of(r) for r in [spec.resources, *(s.resources for s in spec.services.values())]
    )


class Backend(Keeping):
    """A backend, as its class: its name, what it cannot do, its checks, and the environments
    it left running (its hooks: keeping.py). `Runtime` (sandbox/base.py) derives from it,
    and is its one subclass: a backend derives from Runtime."""

    #: Registered backend name.
    name: ClassVar[str] = ""
    #: Conformance rules this backend deliberately does not keep: rule id -> reason.
    deviations: ClassVar[Mapping[str, str]] = {}
    #: The main sandbox runs an image: the file must give exactly one of `image` or `build`.
    needs_image: ClassVar[bool] = False
    #: Commands run isolated from this host. A backend that says False (local) runs only when
    #: the caller chooses it or its policy allows a file to (`Policy.allow_unisolated`).
    isolated: ClassVar[bool] = True

    # ----- what the registry and the CLI ask of a backend class (no engine is touched) -----
    @classmethod
    def check(cls, env: Environment, policy: Policy, *, workspace: Path | None = None) -> list[str]:
        """Check `env` for this backend under `policy` without starting anything: raise
        SpecError (PolicyError) listing what it refuses, return warnings worth printing.
        `workspace`: the host folder it would get (None: a scratch one). Used by `orchestrator
        validate` and `render`. The default checks `needs_image`; a backend that compiles the
        file to a project of its own checks that compilation too."""
        if cls.needs_image:
            require_main_image(env)
        return []

    @classmethod
    def prepare(cls, env: Environment, policy: Policy, *, build: BuildChoice = "auto") -> None:
        """Work done once before many spawns of `env` (building its images, say), after the
        same checks as `check`; `build` says how images are got (see BuildChoice). The
        default only checks."""
        cls.check(env, policy)

    @classmethod
    def requested(cls, env: Environment, options: SpawnOptions | None) -> Amounts:
        """What `env` takes of this host once up, as admission counts it (`options`: the
        spawn's, None: a spawn with none): the memory and CPU limits this backend applies to
        each of its containers, the file's or the caller's defaults. The default: the file's
        main sandbox and services; a backend that adds containers of its own counts them."""
        return request(env)

    @classmethod
    def doctor(cls, env: Environment | None = None) -> list[tuple[str, str]]:
        """What `orchestrator doctor` should say about this backend on this machine (its
        engine, what it needs there), or with `env`, of what that file needs here (its
        images), as (pass | warn | fail, message) lines. The default: nothing."""
        return []

    @classmethod
    def render(cls, env: Environment, workspace: Path | None, policy: Policy) -> dict[str, str]:
        """The native project `env` compiles to for `workspace`, as {relative path: text},
        the main file first (`orchestrator render`); `workspace` None: the private one a
        spawn without a workspace makes, shown by a stand-in that the rendering says is one.
        The default: this backend has none."""
        raise UsageError(
            f"the {cls.name or cls.__name__} backend has no project file to render: it runs "
            "the environment directly; `orchestrator validate` checks the file"
        )

    @classmethod
    def make_lock(cls, env: Environment, policy: Policy) -> Lock:
        """The lock of `env` (spec/lockfile.py): the ids of the images it runs and what its
        builds are made of, as this backend resolves them now. The default: a backend that
        runs no images locks nothing but the versions."""
        return Lock(
            file=Path(env.source).name, orchestrator=__version__, templates=templates_version()
        )

    @classmethod
    def from_record(
        cls, ident: str, env: Environment, options: SpawnOptions, folder: Path, state: Any
    ) -> Runtime:
        """A runtime for environment `ident`, running already, from the record this backend
        left in `folder` (its `state`; see sandbox/record.py), for `orchestrator.attach`.
        The default: this backend cannot."""
        raise UsageError(f"the {cls.name} backend cannot attach to a running environment")

    @classmethod
    def reap_folder(cls, folder: Path) -> None:
        """Remove what an abandoned project folder of this backend stands for (its owner
        process is gone), then the folder; raise OrchestratorError when that cannot be done
        now (the next reap tries again). Asked by the reapers for a folder that names this
        backend. The default: a backend that leaves nothing running has nothing to remove."""

    @classmethod
    def remove_snapshot_image(cls, snap: Snapshot) -> None:
        """Remove the image a snapshot of this backend holds (`snap.image`), only if it is
        that snapshot's own. The default: a backend that makes no images leaves it."""
        log.warning(
            "snapshot %s names image %s, but the %s backend makes none: left alone",
            snap.name,
            snap.image,
            cls.name,
        )
