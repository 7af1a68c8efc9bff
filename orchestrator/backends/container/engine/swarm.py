"""What the swarm backend asks of a Swarm manager's engine, as typed operations: deploy,
list and remove a stack, inspect its tasks, and find the engine of a node (another Engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.backends.container.engine.bounds import up_timeout
from orchestrator.backends.container.engine.core import EngineCore


class SwarmOps(EngineCore):
    def stack_deploy(self, name: str, stack_file: Path) -> None:
        """Deploy (or update) stack `name` from its file; images are never resolved against
        a registry. Not retried (NotSwarmManager: this engine is no manager)."""
        self.run(
            *("stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), name),
            action=f"deploying stack {name}",
            seconds=up_timeout(),
        )

    def stack_tasks(self, name: str) -> dict[str, str]:
        """The stack's tasks: id -> name (`<stack>_<service>.<slot>`); StackEmpty when it has
        none (yet)."""
        listed = self.run(
            *("stack", "ps", "--no-trunc", "--format", "{{.ID}} {{.Name}}", name),
            action="listing stack tasks",
            retry=True,
        )
        return {
            ident: task
            for ident, _, task in (line.partition(" ") for line in listed.splitlines())
            if ident
        }

    def inspect_tasks(self, ids: list[str]) -> list[dict[str, Any]]:
        """The engine's inspection of each task (one call)."""
        raw = self.run(
            "inspect", "--type", "task", "--", *ids, action="inspecting stack tasks", retry=True
        )
        found = json.loads(raw or "[]")
        return [t for t in found if isinstance(t, dict)] if isinstance(found, list) else []

    def node(self, node: str) -> tuple[str, str]:
        """A node's Swarm address and hostname, as this manager knows them."""
        fmt = "{{.Status.Addr}} {{.Description.Hostname}}"
        said = self.run(
            "node", "inspect", "--format", fmt, node, action="inspecting a node", retry=True
        )
        addr, _, hostname = said.strip().partition(" ")
        return addr, hostname

    def node_id(self) -> str:
        """This engine's own node in its Swarm."""
        return self.run(
            "info",
            "--format",
            "{{.Swarm.NodeID}}",
            action="asking the manager who it is",
            retry=True,
        ).strip()

    def stack_remove(self, name: str) -> None:
        self.run("stack", "rm", name, action=f"removing stack {name}", retry=True)

    def stack_left(self, *, label: str, name: str) -> bool:
        """Whether a service or a network carrying `label` (KEY=VALUE) is left (of stack
        `name`)."""
        action = f"listing what is left of stack {name}"
        flt = ("--filter", f"label={label}")
        services = self.run("service", "ls", "-q", *flt, action=action, retry=True)
        networks = self.run("network", "ls", "-q", *flt, action=action, retry=True)
        return bool(services.strip() or networks.strip())
