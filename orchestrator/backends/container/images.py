"""Images of container filesystems, for snapshots: `docker commit` of a main container,
labelled with the snapshot record that owns it, so that removing the snapshot removes the
image, and an image whose record is gone is reaped like any other leftover of ours."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

from python_on_whales import DockerClient
from python_on_whales.utils import run

from orchestrator.backends.container.engine import NoSuchImage, docker_client, engine_call
from orchestrator.backends.container.identity import LABEL_MANAGED, L
from orchestrator.errors import DockerError
from orchestrator.paths import state_dir

SNAPSHOT_REPO = "orchestrator-snapshot"
LABEL_RECORD = L + "snapshot.record"
"""On a snapshot image: the path of the snapshot record that owns it."""
LABEL_STATE = L + "snapshot.state"
"""On a snapshot image: the state folder of the process that made it (whose reapers alone
may remove it)."""


def commit(container: str, record: Path, client: DockerClient | None = None) -> str:
    """Save the container's filesystem (what it changed, above its image; mounts are not
    included) as an image owned by `record`; returns its tag (unique to it). The container is paused
    while it is copied, so what runs in it cannot change it half-way."""
    client = client or docker_client()
    tag = f"{SNAPSHOT_REPO}:{uuid.uuid4().hex[:12]}"
    argv = [*client.client_config.docker_cmd, "commit", "--pause"]
    label = f"LABEL {LABEL_MANAGED}=1 {LABEL_RECORD}={json.dumps(str(record))} "
    label += f"{LABEL_STATE}={json.dumps(str(state_dir().resolve()))}"
    argv += ["--change", label, container, tag]
    engine_call(f"committing {container}", lambda: run(argv), retry=False)
    return tag


def remove(image: str, client: DockerClient | None = None) -> None:
    """Remove a snapshot image (gone already is fine)."""
    client = client or docker_client()
    with contextlib.suppress(NoSuchImage):
        engine_call("removing a snapshot image", lambda: client.image.remove(image))


def remove_owned(image: str, record: Path, client: DockerClient | None = None) -> bool:
    """Remove a snapshot image only when its labels say it is `record`'s and was made with
    our state folder: a record names any image it likes (it is a file anyone with access to
    it can write), the labels were set when we committed it. False when it is not (left
    alone) or gone already."""
    client = client or docker_client()
    try:
        found = engine_call("inspecting a snapshot image", lambda: client.image.inspect(image))
    except NoSuchImage:
        return False
    labels = found.config.labels or {}
    mine = labels.get(LABEL_STATE) == str(state_dir().resolve())
    labelled = labels.get(LABEL_RECORD, "")
    if not mine or not labelled or _real(labelled) != _real(str(record)):
        return False
    remove(image, client)  # the name it was found by: an image tagged elsewhere too stays
    return True


def _real(path: str) -> str:
    return str(Path(path).resolve())


def exists(image: str, client: DockerClient | None = None) -> bool:
    client = client or docker_client()
    return bool(engine_call("looking for an image", lambda: client.image.exists(image)))


def reap_orphans(client: DockerClient | None = None) -> list[str]:
    """Remove the snapshot images of ours whose record is gone; returns their ids."""
    gone = []
    for image in orphaned(client):
        try:
            remove(image, client)
        except DockerError:  # a container still runs from it: next time
            continue
        gone.append(image)
    return gone


def orphaned(client: DockerClient | None = None) -> list[str]:
    """Ids of the snapshot images made with our state folder whose record is gone (those
    of another state folder are never touched)."""
    client = client or docker_client()
    ours = str(state_dir().resolve())
    listed = engine_call(
        "listing snapshot images", lambda: client.image.list(filters=[("label", LABEL_RECORD)])
    )
    found = []
    for image in listed:
        labels = image.config.labels or {}
        record = labels.get(LABEL_RECORD, "")
        if labels.get(LABEL_STATE) == ours and record and not Path(record).exists():
            found.append(image.id)
    return sorted(set(found))
