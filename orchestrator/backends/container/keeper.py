"""What every container backend answers `orchestrator.environments`, `remove_environment`,
`reap` and `running_logs` with (the hooks of sandbox/backend.py): one inventory, by label,
for all of them (inventory.py). Apart from ContainerRuntime, which takes them from here, so
that a listing asks a built-in backend without loading it (`orchestrator ps` in tens of
milliseconds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.sandbox.keeping import Keeping, RunningLogs

if TYPE_CHECKING:
    from orchestrator.sandbox.results import EnvironmentStatus


class ContainerInventory(Keeping):
    """The environments left running on the container backends."""

    @classmethod
    def running(cls, *, usage: bool = False) -> tuple[list[EnvironmentStatus], list[str]]:
        from orchestrator.backends.container import ahead

        ahead.snapshot_images()  # (the engine lists them while the rest loads)
        from orchestrator.backends.container.inventory import running_environments

        return running_environments(usage=usage)

    @classmethod
    def running_ids(cls) -> list[str]:
        from orchestrator.backends.container.inventory import running_ids

        return running_ids()

    @classmethod
    def remove_running(cls, ident: str, *, force: bool = False) -> str | None:
        from orchestrator.backends.container.inventory import remove_by_id

        return remove_by_id(ident, force=force)

    @classmethod
    def reap(cls, *, everything: bool = False, include_kept: bool = False) -> list[str]:
        from orchestrator.backends.container.inventory import reap_all

        return reap_all(everything=everything, include_kept=include_kept)

    @classmethod
    def running_logs(
        cls, ident: str, service: str | None, *, tail: int | None, follow: bool
    ) -> RunningLogs | None:
        from orchestrator.backends.container.inventory import logs_of

        return logs_of(ident, service, tail=tail, follow=follow)
