"""Images of container filesystems, for snapshots: `docker commit` of a main container,
labelled with the snapshot record that owns it, so that removing the snapshot removes the
image, and an image whose record is gone is reaped like any other leftover of ours."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from orchestrator.backends.container.ahead import snapshot_labels
from orchestrator.backends.container.ahead import taken as ahead_taken
from orchestrator.backends.container.engine import Engine, NoSuchImage, engine_call
from orchestrator.backends.container.identity import (
    LABEL_MANAGED,
    LABEL_SNAPSHOT_RECORD,
    LABEL_SNAPSHOT_STATE,
    LABEL_SNAPSHOT_TAG,
)
from orchestrator.errors import DockerError, OrchestratorError, UsageError
from orchestrator.paths import read_regular, state_dir
from orchestrator.sandbox.snapshot import RECORD_MOST, Snapshot, being_saved
from orchestrator.settings import may_reach

log = logging.getLogger("orchestrator.docker")
SNAPSHOT_REPO = "orchestrator-snapshot"


def commit(
    container: str, record: Path, engine: Engine | None = None, *, pause: bool = True
) -> str:
    """Save the container's filesystem (what it changed, above its image; mounts are not
    included) as an image owned by `record`; returns its tag (unique to it). The container is paused
    while it is copied (unless `pause` is False: the caller paused it), so what runs in it
    cannot change it half-way."""
    engine = engine or Engine.at()
    import uuid  # (here: `ps` lists snapshot images, and makes none)

    tag = f"{SNAPSHOT_REPO}:{uuid.uuid4().hex[:12]}"
    labels = {
        LABEL_MANAGED: "1",
        LABEL_SNAPSHOT_RECORD: str(record),
        LABEL_SNAPSHOT_STATE: str(state_dir().resolve()),
        LABEL_SNAPSHOT_TAG: tag,
    }
    if engine.kind == "podman":  # its `commit` cannot decode the CLI's empty body (4.3)
        repo, _, name = tag.partition(":")
        changes = [f"LABEL {k}={_podman_word(v)}" for k, v in labels.items()]
        engine.commit_api(container, repo, name, pause=pause, changes=changes)
        return tag
    label = "LABEL " + " ".join(f"{k}={_word(v)}" for k, v in labels.items())
    engine.commit_cli(container, tag, pause=pause, changes=[label])
    return tag


def _word(value: str) -> str:
    """`value` as one word of a Dockerfile instruction that Docker's parser reads back as
    itself: double-quoted, with the three characters special there (`"`, `\\`, and `$`,
    which would expand a variable) escaped; any other character, non-ASCII too, as itself."""
    _check_label(value)
    return '"' + re.sub(r'(["\\$])', r"\\\1", value) + '"'


def _podman_word(value: str) -> str:
    """`value` as Podman's commit reads a label back as itself (4.3): between double
    quotes, which it strips, every character as it is (it unescapes nothing and expands
    nothing; a double quote inside stays one)."""
    _check_label(value)
    return f'"{value}"'


def _check_label(value: str) -> None:
    """A line break or NUL cannot be written in an instruction, and a path that is not
    UTF-8 cannot be a label (it would read back as another path, owned by no one, and never
    be reaped): refused before anything is made."""
    if any(c in value for c in "\n\r\0"):
        raise UsageError(f"a snapshot label cannot hold a line break or NUL: {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise UsageError(
            f"a snapshot label must be UTF-8, and this path is not: {value!r}"
        ) from None


def remove(image: str, engine: Engine | None = None) -> None:
    """Remove a snapshot image (gone already is fine)."""
    with contextlib.suppress(NoSuchImage):
        (engine or Engine.at()).remove_image(image, action="removing a snapshot image")


def remove_owned(image: str, record: Path, engine: Engine | None = None) -> bool:
    """Remove a snapshot image only when its labels say it is `record`'s and was made with
    our state folder: a record names any image it likes (it is a file anyone with access to
    it can write), the labels were set when we committed it. False when it is not (left
    alone) or gone already."""
    engine = engine or Engine.at()
    if not owned(image, record, engine):
        return False
    remove(image, engine)  # the name it was found by: an image tagged elsewhere too stays
    return True


def owned(image: str, record: Path, engine: Engine | None = None) -> bool:
    """Whether image `image` exists and its labels say it is `record`'s, made with our state
    folder: only then may a resume run it (or a removal remove it). A record names any
    image it likes; the labels were set when we committed it."""
    engine = engine or Engine.at()
    if not image or image.startswith("-"):  # never an option of the docker command
        return False
    found = _inspected(image, engine)
    if found is None:
        return False
    labels = found[1]
    mine = labels.get(LABEL_SNAPSHOT_STATE) == str(state_dir().resolve())
    labelled = labels.get(LABEL_SNAPSHOT_RECORD, "")
    tag = labels.get(LABEL_SNAPSHOT_TAG, "")
    if tag and not _named_by(tag, found[0], engine):  # made from ours, not ours (below)
        return False
    return mine and bool(labelled) and _real(labelled) == _real(str(record))


def _real(path: str) -> str:
    return str(Path(path).resolve())


def exists(image: str, engine: Engine | None = None) -> bool:
    engine = engine or Engine.at()
    if not image or image.startswith("-"):  # never an option of the docker command
        return False
    return _inspected(image, engine) is not None


def reap_orphans(engine: Engine | None = None) -> list[str]:
    """Remove the snapshot images of ours whose record is gone or names another (after the
    records of suspended environments whose owner is gone: see sandbox/snapshot.py);
    returns their names (`orphaned`)."""
    from orchestrator.sandbox.snapshot import reap_suspended

    reap_suspended()
    engine = engine or Engine.at()
    gone = []
    for ident, name in _orphans(engine):
        try:  # by the id judged: its tag may have been moved to another image meanwhile
            remove(ident, engine)
        except DockerError:  # in use (next time), named elsewhere too, or another's parent
            if not _named_by(name, ident, engine):
                continue
            try:  # its own tag alone: it goes with the image that holds it (refused in use)
                remove(name, engine)
            except DockerError:
                continue
        gone.append(name)
    return gone


def orphaned(engine: Engine | None = None) -> list[str]:
    """The names of `_orphans`, each image by its own tag."""
    return sorted({name for _, name in _orphans(engine)})


def _orphans(engine: Engine | None = None) -> list[tuple[str, str]]:
    """(id, tag) of the snapshot images made with our state folder whose record is gone,
    or names another image now. An image made from one of ours (a user's
    `docker commit` of a resumed container, or a `FROM` of it) inherits every label,
    the tag too, but the tag does not name it: it is not ours and is never listed; nor is
    one of ours whose tag went while an image made from it holds it (it goes with that
    one). One made before snapshots carried their tag is not judged either: its labels
    cannot tell it from a user's image made from it (it goes with its snapshot). Only
    those are listed (the engine filters by the state folder's label) and looked at: the
    images of another state folder are neither touched nor inspected, so a reap (every
    `ps` makes one) costs nothing for what other processes' snapshots leave on the engine.
    The listing is the one `ps` asked ahead (ahead.py), where there is one. Each image is
    inspected on its own: another process may remove one between the listing and the
    look, and one gone meanwhile is simply not there."""
    engine = engine or Engine.at()
    ours = str(state_dir().resolve())
    wanted = snapshot_labels()
    ids = ahead_taken(engine.address, wanted)
    if ids is None:
        ids = engine.image_ids(labels=wanted, action="listing snapshot images")
    found = []
    for ident in ids:
        image = _inspected(ident, engine)
        if image is None:
            continue
        try:
            if _orphan(image[0], image[1], ours, engine):
                found.append((image[0], image[1][LABEL_SNAPSHOT_TAG]))
        except (OSError, ValueError) as exc:  # (a path the kernel refuses: not ours)
            log.debug("snapshot image %s: not judged: %s", ident, exc)
    return found


def _orphan(ident: str, labels: Mapping[str, str], ours: str, engine: Engine) -> bool:
    """Whether image `ident` is a snapshot image of ours (`_orphans`) whose record is gone
    or names another. Any image's labels are anyone's to set (a file's build, a pulled
    image): only a record path and a tag of the forms `commit` writes are looked at."""
    record, tag = labels.get(LABEL_SNAPSHOT_RECORD, ""), labels.get(LABEL_SNAPSHOT_TAG, "")
    if labels.get(LABEL_SNAPSHOT_STATE) != ours or not _record_label(record):
        return False
    if not TAG_FORM.fullmatch(tag) or being_saved(record):
        return False
    if Path(record).exists() and not _replaced(labels, Path(record)):
        return False
    # last, as it asks the engine (only of an orphan): made from one of ours, or not ours
    return _named_by(tag, ident, engine)


TAG_FORM = re.compile(re.escape(SNAPSHOT_REPO) + r":[0-9a-f]{12}")
"""A snapshot image's tag, as `commit` makes it."""


def _record_label(record: str) -> bool:
    """Whether a record label is a path `commit` could have written: absolute, a `.json`
    name, no NUL, within the kernel's longest path."""
    return (
        record.startswith("/")
        and record.endswith(".json")
        and "\0" not in record
        and len(record.encode(errors="replace")) < 4096
    )


def _named_by(tag: str, ident: str, engine: Engine) -> bool:
    """Whether `tag` names the image `ident` now."""
    named = _inspected(tag, engine)
    return named is not None and named[0] == ident


def _replaced(labels: Mapping[str, str], record: Path) -> bool:
    """Whether the record an image names has been saved over and names it no more (it could
    not go then: a container resumed from it ran). An image made before it carried its tag,
    or a record that cannot be read, is not judged."""
    import json

    tag = labels.get(LABEL_SNAPSHOT_TAG, "")
    text = read_regular(record, RECORD_MOST) if tag else None
    try:
        data = json.loads(text) if text and len(text) <= RECORD_MOST else None
    except (ValueError, RecursionError):  # (a record anyone with it may write: any nesting)
        return False
    if not isinstance(data, dict):
        return False
    services = data.get("services")
    values = [data.get("image"), *(services.values() if isinstance(services, dict) else ())]
    return tag not in {v for v in values if isinstance(v, str)}  # a list is no name


def _inspected(image: str, engine: Engine) -> tuple[str, dict[str, str]] | None:
    """(id, labels) of one image, None when there is none by that name or id. By the
    docker CLI alone: python-on-whales costs a process a third of a second of CPU to
    import, and a reap inside `ps` must not pay it."""
    try:
        return engine.image_labels(image)
    except NoSuchImage:
        return None


def commit_all(
    containers: Mapping[str, str], record: Path, engine: Engine | None = None
) -> dict[str, str]:
    """Save the filesystem of every container (by service) as images owned by `record`,
    side by side: each running one is paused by the engine while it is committed, and
    unpaused by the engine too (so a caller killed meanwhile leaves nothing frozen; the
    containers are paused nearly together, not at one instant). A container with a volume
    (an image's VOLUME: a database's data, typically) is refused first, with its path: a
    commit never holds a volume, and its files would be silently lost. Returns the tags by
    service; on any failure the images made are removed and the error raised."""
    engine = engine or Engine.at()
    seen = {s: _looked_at(c, engine) for s, c in containers.items()}
    for service, (volumes, _) in seen.items():
        if volumes:
            raise UsageError(
                f"cannot suspend: service {service!r} keeps {', '.join(volumes)} in a volume "
                "(its image declares VOLUME), which an image of its filesystem does not hold, "
                "so its files would be lost; snapshot the workspace instead, or use an image "
                "that keeps its data in its own filesystem"
            )
    states = {s: state for s, (_, state) in seen.items()}
    made: dict[str, str] = {}
    from concurrent.futures import ThreadPoolExecutor  # (here: `ps` makes no image)

    try:
        with ThreadPoolExecutor(max_workers=min(4, len(containers)) or 1) as pool:
            futures = {
                s: pool.submit(commit, c, record, engine, pause=states[s] == "running")
                for s, c in containers.items()
            }
            errors = []
            for service, future in futures.items():
                try:
                    made[service] = future.result()
                except DockerError as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]
    except BaseException:
        for image in made.values():
            with contextlib.suppress(DockerError):
                remove_owned(image, record, engine)
        raise
    return made


def _looked_at(container: str, engine: Engine) -> tuple[list[str], str]:
    """Where a container has a volume (named or anonymous) mounted, not a pinned host
    folder's (binds.py: a host folder, as a bind is); and its state (running, paused,
    exited...: a paused container is also running to the engine). One inspection, through
    the API on a local socket (no CLI process, python-on-whales not loaded)."""
    from orchestrator.backends.container.binds import is_pinned_volume

    action = "inspecting a container"
    got = engine.inspected(container, action)
    if got is None:  # (no local socket)
        whales = engine.whales
        found = engine_call(action, lambda: whales.container.inspect(container))
        mounts = [(str(m.type), str(m.name or ""), str(m.destination)) for m in found.mounts or []]
        state = "paused" if found.state.paused else str(found.state.status)
    else:
        if not isinstance(got.get("State"), dict):  # never taken for "no volume, not paused"
            raise DockerError(f"{action} {container}: the engine's answer holds no state")
        mounts = [
            (str(m.get("Type")), str(m.get("Name") or ""), str(m.get("Destination")))
            for m in got.get("Mounts") or []
            if isinstance(m, dict)
        ]
        status = got.get("State") or {}
        state = "paused" if status.get("Paused") else str(status.get("Status", ""))
    volumes = sorted(d for t, n, d in mounts if t == "volume" and not is_pinned_volume(n))
    return volumes, state


# ----- a snapshot's images, for the backends that made them -------------------------------
def check_resumable(snap: Snapshot, engine: Engine, *, on_its_engine: bool) -> None:
    """UsageError unless every image the record names is on `engine` and is the record's
    own (its labels say so): a record is a file, and may name any image. `on_its_engine`:
    `engine` is the one the snapshot was made on (else the error names that one)."""
    for service, image in snap.images.items():
        if owned(image, snap.record, engine):
            continue
        what = f"snapshot {snap.name} ({service}): its filesystem image {image}"
        if not exists(image, engine) and not on_its_engine:
            where = f"the engine at {snap.host}" if snap.host else "the docker CLI's default"
            raise UsageError(
                f"{what} is on {where}; resume it there (spawn_runtime(..., host=...))"
            )
        if not exists(image, engine):
            raise UsageError(f"{what} is gone (removed outside orchestrator); it cannot be resumed")
        raise UsageError(
            f"{what} is not that record's (its labels do not name {snap.record} and this "
            "state folder): refused; a record moved or copied by hand cannot be resumed"
        )


def release_woken(snap: Snapshot, engine: Engine) -> None:
    """Remove the images of a record that waking consumed (they were its own); one another
    environment still runs is left to the reaper."""
    for image in snap.images.values():
        try:
            remove_owned(image, snap.record, engine)
        except OrchestratorError as exc:
            # another copy of the record still runs it (a fork's copies share it): the last
            # of them removes it, or the reaper; anything else is news
            said = log.debug if "is using its referenced image" in str(exc) else log.warning
            said("snapshot image %s is left to the reaper: %s", image, exc)


def remove_snapshot(snap: Snapshot) -> None:
    """Remove the images a snapshot owns, on its engine; those it names but does not own
    are left alone (said), as are those on an engine this process does not name."""
    if snap.host and not may_reach(snap.host):
        log.warning(
            "snapshot %s: its images are on the engine at %r, which this process does "
            "not name: left there, for a reap on that engine to remove",
            snap.name,
            snap.host,
        )
        return
    engine = Engine.at(snap.host)
    for image in snap.images.values():
        if not remove_owned(image, snap.record, engine) and exists(image, engine):
            log.warning(
                "snapshot %s names image %s, which is not its own: left alone",
                snap.name,
                image,
            )
