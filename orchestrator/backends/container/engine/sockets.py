"""What the container backends ask of an engine through its API on this machine's socket
(no docker CLI process, no python-on-whales), as typed operations, with the CLI's or
python-on-whales' way where the engine has no such socket. Each call is bounded and its
failure typed as the CLI's would be."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, BinaryIO

from orchestrator.backends.container.engine.cli import engine_call
from orchestrator.backends.container.engine.core import EngineCore
from orchestrator.backends.container.engine.errors import (
    ContainerNotRunning,
    NoSuchContainer,
    NoSuchImage,
    NoSuchNetwork,
    NoSuchVolume,
)


class SocketOps(EngineCore):
    # ----- containers ------------------------------------------------------------------------
    def inspected(self, container: str, action: str) -> dict[str, Any] | None:
        """The engine's inspection of a container as its API gives it (`State`, `Config`,
        `Id`, ...): no CLI process, and python-on-whales is not loaded. None without a
        local socket (the caller asks through python-on-whales)."""
        if self.socket is None:
            return None
        got = engine_call(
            action, lambda: self.api("GET", f"/containers/{container}/json", action=action)
        )
        return got if isinstance(got, dict) else {}

    def create_container(
        self, name: str, body: dict[str, Any], *, seconds: float, action: str
    ) -> Any:
        """Create container `name` from an API body: the engine's answer (its `Warnings`)."""
        return self.api(
            "POST",
            "/containers/create",
            body=body,
            query={"name": name},
            action=action,
            seconds=seconds,
        )

    def start_container(
        self, name: str, *, seconds: float, action: str, checkpoint: str | None = None
    ) -> None:
        """Start a container; from its own checkpoint `checkpoint` (memory.py) when given."""
        query = {"checkpoint": checkpoint} if checkpoint else None
        self.api("POST", f"/containers/{name}/start", query=query, action=action, seconds=seconds)

    def put_archive(
        self, container: str, path: str, tar: BinaryIO, *, seconds: float, action: str
    ) -> None:
        """Unpack the tar file `tar` at `path` in `container` (one not started too: the
        engine unpacks it into the container's own view of its files and mounts, chrooted
        there, as for `docker cp`)."""
        query = {"path": path}
        url = f"/containers/{container}/archive"
        self.api("PUT", url, query=query, upload=tar, action=action, seconds=seconds)

    def delete_checkpoint(self, name: str, checkpoint: str, *, action: str) -> None:
        """Remove a container's checkpoint (gone, or the container: fine)."""
        with contextlib.suppress(NoSuchContainer):
            self.api("DELETE", f"/containers/{name}/checkpoints/{checkpoint}", action=action)

    def described(self, *, action: str) -> dict[str, Any]:
        """The engine's own description (`GET /info`: its data root, experimental mode...)."""
        got = self.api("GET", "/info", action=action)
        return got if isinstance(got, dict) else {}

    def stop_container(self, name: str, *, grace: int, action: str) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (gone or stopped already: fine)."""
        with contextlib.suppress(NoSuchContainer, ContainerNotRunning):
            self.api("POST", f"/containers/{name}/stop", query={"t": str(grace)}, action=action)

    def delete_container(self, name: str, *, action: str) -> None:
        """Remove a container, running or not, with its anonymous volumes (gone: fine)."""
        with contextlib.suppress(NoSuchContainer):
            self.api("DELETE", f"/containers/{name}", query={"force": "1", "v": "1"}, action=action)

    # ----- volumes and networks --------------------------------------------------------------
    def create_volume(self, body: dict[str, Any], *, seconds: float, action: str) -> None:
        self.api("POST", "/volumes/create", body=body, action=action, seconds=seconds)

    def delete_volume(self, name: str, *, action: str) -> None:
        """Remove a volume (gone: fine)."""
        with contextlib.suppress(NoSuchVolume):
            self.api("DELETE", f"/volumes/{name}", action=action)

    def create_network(self, body: dict[str, Any], *, seconds: float, action: str) -> None:
        self.api("POST", "/networks/create", body=body, action=action, seconds=seconds)

    def connect(
        self, network: str, container: str, *, action: str, aliases: Sequence[str] = ()
    ) -> None:
        """Join `container` to `network`, with `aliases` (none by default: the CLI gives
        none unless told to; given only on a local socket)."""
        if self.socket is None:
            if aliases:
                raise ValueError("aliases are given through the engine's local socket only")
            engine_call(action, lambda: self.whales.network.connect(network, container))
            return
        endpoint = {"Aliases": list(aliases)} if aliases else {}
        self.api(
            "POST",
            f"/networks/{network}/connect",
            body={"Container": container, "EndpointConfig": endpoint},
            action=action,
        )

    def leave(self, network: str, container: str, *, action: str, seconds: float) -> None:
        """Take `container` off `network` (local socket only; gone or not joined: fine)."""
        with contextlib.suppress(NoSuchContainer, NoSuchNetwork):
            self.api(
                "POST",
                f"/networks/{network}/disconnect",
                body={"Container": container, "Force": True},
                action=action,
                seconds=seconds,
            )

    def require_network(self, network: str, *, action: str) -> None:
        """A DockerError when the engine has no network `network`."""
        if self.socket is None:
            engine_call(action, lambda: self.whales.network.inspect(network), retry=False)
        else:
            self.api("GET", f"/networks/{network}", action=action)

    # ----- listings --------------------------------------------------------------------------
    def labelled_containers(self, label: str, *, action: str) -> list[dict[str, Any]]:
        """The containers, running or not, that carry `label`, as the API lists them (each
        with its `Id`, `State`, `Labels` and `NetworkSettings`). Only on a local socket."""
        gone = (NoSuchContainer, NoSuchNetwork)
        query = {"all": "1"}
        return self.listed(
            "/containers/json", label, action=action, gone=gone, retry=False, query=query
        )

    def labelled(self, label: str, *, action: str) -> dict[str, list[dict[str, Any]]]:
        """What carries `label`, as the API lists it: "containers" (running or not: each with
        its `Id` and `Labels`), "networks" and "volumes". Only on a local socket."""
        gone = (NoSuchContainer, NoSuchNetwork)
        return {
            "containers": self.labelled_containers(label, action=action),
            **{
                kind: self.listed(url, label, action=action, gone=gone, retry=False)
                for kind, url in (("networks", "/networks"), ("volumes", "/volumes"))
            },
        }

    def delete_network(self, network: str, *, action: str) -> None:
        """Remove a network (gone: fine)."""
        with contextlib.suppress(NoSuchNetwork):
            self.api("DELETE", f"/networks/{network}", action=action)

    def labelled_left(self, label: str, *, action: str) -> bool | None:
        """Whether any container, network or volume carries `label` (None without a local
        socket: not asked)."""
        if self.socket is None:
            return None
        return any(self.labelled(label, action=action).values())

    # ----- images ----------------------------------------------------------------------------
    def has_image(self, tag: str) -> bool:
        """Whether the engine has the image: asked on its local socket where it has one (no
        CLI process), else through python-on-whales."""
        action = "looking for an image"
        if not tag or tag.startswith("-"):  # never an option of the docker command
            return False
        if self.socket is None:
            return bool(engine_call(action, lambda: self.whales.image.exists(tag)))
        try:
            self.api("GET", f"/images/{tag}/json", action=action)
        except NoSuchImage:
            return False
        return True

    def image_id(self, name: str) -> str | None:
        """The id (sha256:...) of the image `name` (a name, tag or id), None when the engine
        has none."""
        action = "looking for an image"
        if not name or name.startswith("-"):  # never an option of the docker command
            return None
        if self.socket is None:
            if not engine_call(action, lambda: self.whales.image.exists(name)):
                return None
            return str(engine_call(action, lambda: self.whales.image.inspect(name).id))
        try:
            got = self.api("GET", f"/images/{name}/json", action=action)
        except NoSuchImage:
            return None
        found = got.get("Id") if isinstance(got, dict) else None
        return found if isinstance(found, str) else None

    def commit_api(
        self, container: str, repo: str, tag: str, *, pause: bool, changes: Sequence[str]
    ) -> None:
        """The API's commit (Podman's: its CLI-compatible commit cannot decode the CLI's
        empty body, 4.3), with Dockerfile instructions `changes`."""
        query = [("container", container), ("repo", repo), ("tag", tag)]
        query += [("pause", str(pause).lower())]
        query += [("changes", change) for change in changes]
        self.api("POST", "/commit", body={}, query=query, action=f"committing {container}")
