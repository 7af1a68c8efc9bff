"""The environments a backend left running: what `orchestrator.environments`,
`remove_environment` and `reap` ask of each backend class (services/inventory.py). A backend
whose environments never outlive their process keeps these defaults; backends sharing one
implementation (the container ones: backends/container/keeper.py) are asked once. Apart
from the rest of a backend's class (backend.py), so that a listing (`orchestrator ps`)
asks the built-in backends without loading them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.sandbox.results import EnvironmentStatus

RunningLogs = tuple[list[str], Callable[[str], Iterator[bytes]]]
"""The logs of an environment read from outside its owner: the services they come from, in
the order `orchestrator logs` prints them (the main sandbox first), and each one's log, as
it comes, by name."""


class Keeping:
    """A backend's hooks for its environments left running; the defaults keep none."""

    @classmethod
    def running(cls, *, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
        """Its environments left running, after removing those whose owner is gone (their
        ids, second); with `usage`, each one's `EnvironmentStatus.usage` read too."""
        return [], []

    @classmethod
    def running_ids(cls) -> list[str]:
        """The ids of its environments left running (a listing that removes nothing), which
        `remove_environment` matches a caller's ref against, over every backend at once."""
        return []

    @classmethod
    def remove_running(cls, ident: str, *, force: bool = False) -> str | None:
        """Remove its environment `ident` (an exact id) and return it; None when it has none
        so named. UsageError when its owner process still uses it, unless `force` or it was
        kept on purpose."""
        return None

    @classmethod
    def reap(cls, *, everything: bool = False, include_kept: bool = False) -> list[str]:
        """Remove what is left of environments whose owner is gone (all with `everything`;
        kept ones only with `include_kept`): what was removed, one line each."""
        return []

    @classmethod
    def running_logs(
        cls, ident: str, service: str | None, *, tail: int | None, follow: bool
    ) -> RunningLogs | None:
        """The logs of its environment `ident` (an exact id; `service`'s alone, else every
        one's; the last `tail` lines; `follow`: as they come, until the reader stops), read
        without attaching to it; None where it cannot so (attach, and read `Runtime.logs`:
        what fails, fails there, said as it should be)."""
        return None
