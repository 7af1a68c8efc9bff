"""Snapshots of a workspace: a tar archive of the working folder and a small JSON record beside
it, in the state folder (or wherever the caller says). `spawn_runtime(env, resume=snapshot)`
unpacks one into a new environment's workspace, then runs `setup.resume_commands` instead of
`setup.commands`. A suspended environment (`Runtime.suspend`) is such a record too, with its
containers' images and, for `suspend(keep=False)`, the process that owns it.

What a runtime returns and a spawn takes, so part of the protocol; a record names the backend
that made its images, whose class (from the registry) removes them."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.paths import (
    lock_descriptor,
    make_folders,
    open_for_lock,
    read_owner,
    read_regular,
    state_dir,
    state_folder,
    write_file,
)
from orchestrator.procutil import process_start

if TYPE_CHECKING:
    from orchestrator.spec.loader import Environment

SUFFIX = ".tar"
MEMORY_SUFFIX = ".memory"
"""A checkpoint's memory image: the folder `<name>.memory` beside its record."""
IMAGE_BACKEND_BEFORE_FIELD = "docker"
"""Who made the image of a record written before records named their backend."""
log = logging.getLogger("orchestrator.snapshot")
suspend_log = logging.getLogger("orchestrator.suspend")


def snapshots_dir() -> Path:
    return state_dir() / "snapshots"


def records_folder(path: Path) -> Path:
    """The folder of an archive at `path`, ready to write in: the snapshots folder, private
    and ours (see paths.state_folder), or a folder the caller named, whose missing parts are
    made 0700."""
    if path.parent == snapshots_dir():
        return state_folder(path.parent.name)
    return make_folders(path.parent)


@dataclass(frozen=True)
class Snapshot:
    """A saved workspace."""

    path: Path
    """The archive (`<name>.tar`); its record is `<name>.json` beside it."""
    env: str
    """Name of the environment it was taken from."""
    digest: str
    """That environment file's digest (a resume into another one is allowed, and warned)."""
    created: str
    size: int
    """Bytes of the archive."""
    image: str = ""
    """On Docker, with filesystem=True: the image holding the main container's filesystem
    (its changes above the image it ran), which a resume runs instead of the file's image."""
    host: str = ""
    """The engine holding the images: the one named at spawn, else the process's
    (ORCHESTRATOR_ENGINE and the rest); "": the docker CLI's default."""
    backend: str = ""
    """The registered backend that made `image`, and whose class removes it."""
    services: dict[str, str] = field(default_factory=dict)
    """A suspended environment (`Runtime.suspend`): each service's filesystem image, by
    service name, which `wake` runs instead of the file's image (as `image` for main)."""
    source: str = ""
    """A suspended environment: the environment file it was started from (`wake` loads it,
    and refuses it when its digest is no longer `digest`)."""
    suspended: bool = False
    """Made by `Runtime.suspend`: a whole environment, to `wake`."""
    owner: dict[str, str] = field(default_factory=dict)
    """A suspended environment made with `suspend(keep=False)`: the process that made it
    (pid, start, host); once that process is gone, the record and its images are removed.
    Empty: kept until woken or removed."""
    memory: dict[str, str] = field(default_factory=dict)
    """A checkpoint with memory (`checkpoint(memory=True)`): the files of its memory image,
    in the folder `memory_folder`, each with its sha256 digest, checked before a wake uses
    it. Empty: its files only."""

    @property
    def images(self) -> dict[str, str]:
        """Every filesystem image of the record, by service ("main" too)."""
        return {**self.services, **({"main": self.image} if self.image else {})}

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(SUFFIX)

    @property
    def image_backend(self) -> str:
        """The backend whose class resumes and removes `image` (a record older than the
        `backend` field: the one backend that made images then)."""
        return self.backend or IMAGE_BACKEND_BEFORE_FIELD

    @property
    def record(self) -> Path:
        return self.path.with_suffix(".json")

    @property
    def memory_folder(self) -> Path:
        return self.path.with_suffix(MEMORY_SUFFIX)

    def remove(self, *, memory: bool = True) -> None:
        """Remove the archive, its record, its memory image (unless `memory` is False: a
        failed save's, which the sandbox is started again from first) and its image. The
        image goes through the class
        of the backend that made it (`Runtime.remove_snapshot_image`), which removes it
        only when the image itself says it is this record's (a record is a file: it may
        name any image and any backend; what is not its own is left alone, with a
        warning)."""
        self.remove_images()
        self.path.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)
        if memory:
            remove_files(self.memory_folder)

    def remove_images(self) -> None:
        """Remove its images alone, as `remove` does."""
        if not self.images:
            return
        # (the registry is loaded here only: what lists snapshots loads no backend)
        from orchestrator.sandbox.registry import get_runtime_class

        try:
            backend = get_runtime_class(self.image_backend)
        except UsageError as exc:
            log.warning(
                "snapshot %s: its images %s are left alone: %s",
                self.name,
                ", ".join(self.images.values()),
                exc,
            )
        else:
            backend.remove_snapshot_image(self)

    def archive(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read snapshot {self.path}: {exc.strerror}") from None

    @classmethod
    def find(cls, ref: str | Path) -> Snapshot:
        """A snapshot by its archive's path, or by name in the snapshots folder."""
        path = Path(ref)
        named = snapshots_dir() / f"{ref}{SUFFIX}"  # (a name, dots and all)
        if "/" not in str(ref) and (named.with_suffix(".json").exists() or not path.suffix):
            path = named  # a name is looked for in the snapshots folder first (a plain one,
            # only there: never a record that the current folder holds)
        snap = _load(path)
        if snap is None:
            known = ", ".join(s.name for s in list_snapshots()) or "none"
            raise UsageError(f"no snapshot {str(ref)!r} (known: {known})")
        return snap

    @classmethod
    def named(cls, name: str) -> Snapshot:
        """A snapshot of the snapshots folder by its name alone, for removing it: a name
        with a path separator, or `.`/`..`, or whose files resolve (through links) out of
        that folder, is refused, so nothing outside it is ever touched."""
        folder = snapshots_dir()
        bad = not name or name in (".", "..") or "/" in name or "\0" in name
        path, record = folder / f"{name}{SUFFIX}", folder / f"{name}.json"
        if not bad:
            inside = str(folder.resolve())
            bad = any(os.path.dirname(os.path.realpath(p)) != inside for p in (path, record))
        if bad:
            raise UsageError(
                f"{name!r} is not a snapshot name: give the name of one in {folder} (see "
                "`orchestrator snapshot --list`); one saved elsewhere goes by deleting its "
                ".tar and .json"
            )
        snap = _load(path)
        if snap is None:
            known = ", ".join(s.name for s in list_snapshots()) or "none"
            raise UsageError(f"no snapshot {name!r} (known: {known})")
        return snap


RECORD_MOST = 1 << 20
"""Bytes of a record read at the most (ours are a few hundred)."""


def _load(path: Path) -> Snapshot | None:
    """The snapshot whose record is beside `path`; None when there is none, or it is not
    one (a record is a file its owner, or a sandbox whose workspace holds it, may write:
    read bounded, never through a link, and any JSON judged without failing)."""
    text = read_regular(path.with_suffix(".json"), RECORD_MOST)
    if text is None or len(text) > RECORD_MOST:
        return None
    try:
        data = json.loads(text)
        fields: dict[str, Any] = {k: data[k] for k in ("env", "digest", "created", "size")}
        fields |= {k: str(data.get(k, "")) for k in ("image", "host", "backend", "source")}
        fields |= {k: _strings(data.get(k, {})) for k in ("services", "owner", "memory")}
        return Snapshot(path=path, suspended=data.get("suspended") is True, **fields)
    except (ValueError, KeyError, TypeError, RecursionError):  # (RecursionError: nesting)
        return None


def _strings(value: object) -> dict[str, str]:
    """A record's mapping of names to names (older records have none: empty); TypeError when
    it is not one (the record is then not usable)."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError("not a mapping of strings")
    return dict(value)


def archive_path(env: str, dest: str | Path | None = None) -> Path:
    """Where a snapshot goes: the path `dest`, the name `dest` in the snapshots folder, or
    a fresh name there."""
    if dest is None or not (Path(dest).suffix or "/" in str(dest)):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        name = str(dest) if dest else f"{env}-{stamp}-{uuid.uuid4().hex[:6]}"
        return snapshots_dir() / f"{name}{SUFFIX}"
    return Path(dest).absolute()


def replaced(path: Path) -> Snapshot | None:
    """The snapshot a new one saved at `path` takes the place of (None: none is there). A
    suspended environment or a checkpoint is refused (UsageError): its record would go and
    its images, memory image and owner with it, unreaped (the images name that record)."""
    old = _load(path)
    if old is not None and (old.suspended or old.services or old.memory or old.owner):
        raise UsageError(
            f"{old.name!r} is a suspended environment or a checkpoint, which a snapshot does "
            "not replace: choose another name, or remove it first (`orchestrator snapshot "
            f"--rm {old.name}`)"
        )
    return old


def save(
    archive: bytes | Path,
    env: str,
    digest: str,
    path: Path,
    image: str = "",
    host: str = "",
    backend: str = "",
    *,
    services: dict[str, str] | None = None,
    source: str = "",
    suspended: bool = False,
    owner: dict[str, str] | None = None,
    memory: dict[str, str] | None = None,
) -> Snapshot:
    """Write an archive (at `path`, from archive_path) and its record (`backend`: the one
    that made `image` and `services`; `source`, `owner`: see Snapshot). `archive`: its
    bytes, or a file already written beside `path` (hostpack), moved into place."""
    records_folder(path)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    snap = Snapshot(
        path,
        env,
        digest,
        created,
        archive.stat().st_size if isinstance(archive, Path) else len(archive),
        image,
        host if image or services else "",
        backend if image or services or suspended else "",
        dict(services or {}),
        source,
        suspended,
        dict(owner or {}),
        dict(memory or {}),
    )
    if isinstance(archive, Path):
        os.replace(archive, path)
    else:
        write_file(path, archive)  # 0600, as the record: the workspace may hold secrets
    fresh = ("services", "source", "suspended", "owner", "memory")  # an older record: none
    record = {k: v for k, v in asdict(snap).items() if k != "path" and (v or k not in fresh)}
    write_file(snap.record, json.dumps(record, indent=1))
    return snap


def remove_files(folder: Path) -> None:
    """Remove a folder of plain files (a memory image), never through a link: a link in its
    place is removed itself; a folder in it is left, and then the folder too."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError:  # a link or a file in its place: that goes, never what it names
        with contextlib.suppress(OSError):
            os.unlink(folder)
        return
    try:
        unlink_files(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def unlink_files(fd: int) -> None:
    """Unlink every entry but folders of the open folder `fd` (links themselves, never what
    they name)."""
    for entry in os.scandir(fd):
        if not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.name, dir_fd=fd)


def list_snapshots() -> list[Snapshot]:
    """The snapshots in the snapshots folder, oldest first (a record's fields are shown as
    they are, as text: one whose `created` is no string sorts by its text, never fails the
    listing and so every reap)."""
    found = [_load(record.with_suffix(SUFFIX)) for record in snapshots_dir().glob("*.json")]
    return sorted((s for s in found if s is not None), key=lambda s: (str(s.created), s.name))


NAME_LIMIT = 200
"""Longest name of a suspended environment, in bytes (its files add a suffix, and a file
name holds 255)."""


def record_path(env: str, name: str | None) -> Path:
    """Where a suspended environment goes: `name` (or a fresh one) in the snapshots folder.
    A name that is a path, or one taken already, is refused."""
    if name is not None and (
        not name
        or name in (".", "..")
        or any(c in name for c in "/\\\0")
        or name.startswith("-")
        or len(name.encode("utf-8", "surrogateescape")) > NAME_LIMIT
    ):
        raise UsageError(
            f"{name!r} is not a name for a suspended environment: give a plain name (no "
            f"path, at most {NAME_LIMIT} bytes); it is saved in {snapshots_dir()}"
        )
    # (a name with a dot is a name too: archive_path would take `v1.2` for a path here)
    path = archive_path(env, None) if name is None else snapshots_dir() / f"{name}{SUFFIX}"
    _refuse_taken(path)  # (and again once the save holds the name: `saving(fresh=True)`)
    return path


def _refuse_taken(path: Path) -> None:
    if any(path.with_suffix(x).exists() for x in (SUFFIX, ".json", MEMORY_SUFFIX)):
        raise UsageError(
            f"there is a snapshot named {path.name.removesuffix(SUFFIX)!r} already: choose "
            "another name, or remove that one (`orchestrator snapshot --rm NAME`)"
        )


def source_of(env: Environment) -> str:
    """The file an environment was loaded from, as an absolute path ("" for one loaded
    from text: its record then needs the file given to wake it)."""
    path = Path(env.source)
    if not path.is_file():
        return ""
    return str(path.absolute())


PENDING_SUFFIX = ".pending"
"""Beside a record being saved: the process saving it (see `saving`)."""


CLAIM_WAIT = 2.0
"""Seconds a save waits for its name while another holds it (a reap holds one for
milliseconds; a save, for as long as it saves: that one is refused)."""


@contextlib.contextmanager
def saving(record: Path, *, fresh: bool = False) -> Iterator[None]:
    """While this process saves `record` (`<name>.json`, in a folder made already): a file
    beside it, locked by this process (flock) and naming it. A save commits its images first
    and writes the record last, once the workspace is packed (minutes, for a large one):
    meanwhile a reap (any `ps`, a guardian's) took those images, whose record is missing,
    for orphans and removed them, and the record then named images that were gone
    (`being_saved`). One save of a name at a time: another is refused (UsageError). The
    lock is the kernel's: it goes with this process whatever ends it, and a reap acts on a
    name only while it holds that lock itself (`_held`). `fresh`: a record of that name
    must not be there (UsageError, before anything is made)."""
    pending = record.with_suffix(PENDING_SUFFIX)
    with _held(pending, wait=CLAIM_WAIT) as fd:
        if fd is None:
            raise UsageError(
                f"{pending.stem!r} is being saved by another process now: choose another name"
            )
        if fresh:  # (asked again with the name held: a save just before may have taken it)
            _refuse_taken(record.with_suffix(SUFFIX))
        os.ftruncate(fd, 0)  # (the process's name, for a reader on another machine)
        os.pwrite(
            fd, f"{os.getpid()} {process_start(os.getpid())} {socket.gethostname()}\n".encode(), 0
        )
        yield


@contextlib.contextmanager
def _held(pending: Path, *, wait: float) -> Iterator[int | None]:
    """`pending` (made if missing, 0600, never through a link) locked by this process
    alone while the block runs, and removed at its end; None in the block when another
    process holds it past `wait` seconds (nothing is made or removed then). The lock is
    taken on the file still at that name: one its last holder removed meanwhile is opened
    again. A child forked meanwhile holds no copy of it, and removes nothing
    (`paths.lock_descriptor`)."""
    deadline = time.monotonic() + wait
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    owner = os.getpid()
    while True:
        try:
            opened = open_for_lock(pending, flags)
        except OSError as exc:  # a link, a folder or worse where it goes: not a save's
            raise UsageError(f"{pending} is not a file a save made: {exc.strerror}") from None
        with lock_descriptor(opened) as fd:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UsageError(f"{pending} is not a file a save made")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
            except BlockingIOError:
                taken = False
            if taken and _same(fd, pending):
                try:
                    yield fd
                finally:
                    if os.getpid() == owner and _same(fd, pending):  # (nobody else removes it)
                        with contextlib.suppress(OSError):
                            os.unlink(pending)
                return
        if not taken and time.monotonic() >= deadline:
            yield None
            return
        if not taken:  # (taken but no longer at its name, its holder removed it: again)
            time.sleep(0.05)


def _same(fd: int, path: Path) -> bool:
    try:
        here = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def being_saved(record: str | Path) -> bool:
    """Whether a process that still runs saves `record` now (`saving`): the images made for
    it are not orphans yet."""
    return _alive(Path(record).with_suffix(PENDING_SUFFIX))


def _alive(pending: Path) -> bool:
    """Whether a save holds `pending` (its lock), or it names a process on another machine
    (a state folder shared between machines: not ours to judge)."""
    try:
        fd = os.open(pending, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    found = read_owner(pending)
    return found is not None and found[2] != socket.gethostname()


def this_process() -> dict[str, str]:
    """The owner a `suspend(keep=False)` record names: this process."""
    pid = os.getpid()
    return {"pid": str(pid), "start": process_start(pid), "host": socket.gethostname()}


def owner_alive(owner: Mapping[str, str]) -> bool:
    """Whether a record's owner process still runs (one of another machine, or unreadable,
    counts as alive: it is not ours to judge)."""
    if owner.get("host") != socket.gethostname():
        return True
    try:
        pid = int(owner.get("pid", ""))
        if pid <= 0:
            return True
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    start = owner.get("start", "")
    return not start or process_start(pid) in ("", start)


def reap_suspended(owner: Mapping[str, str] | None = None) -> list[str]:
    """Remove the suspended environments whose owner (see `suspend(keep=False)`) is gone
    (or is exactly `owner`: its guardian, once it died), with the images each record owns;
    return their names. Records without an owner are kept. What a save cut short by a crash
    made before its record (a memory image, an archive) goes too."""
    gone = []
    for snap in list_snapshots():
        if not snap.owner:
            continue
        mine = owner is not None and all(snap.owner.get(k) == owner.get(k) for k in owner)
        if mine or (owner is None and not owner_alive(snap.owner)):
            try:
                snap.remove()
            except (OSError, OrchestratorError) as exc:  # an image in use: the next reap
                suspend_log.warning("suspended %s is left for the next reap: %s", snap.name, exc)
                continue
            gone.append(f"{snap.name} (suspended; its owner is gone)")
    folder = snapshots_dir()
    # what a save cut short by a crash made before its record (its memory image, its
    # archive), and a memory folder with no record: each only while this process holds
    # its name (a save holds it from before it makes anything until after its record)
    kinds = (PENDING_SUFFIX, MEMORY_SUFFIX, SUFFIX)
    stems = {str(p)[: -len(x)] for x in kinds for p in folder.glob("*" + x)}
    for stem in sorted(stems):  # (joined, never with_suffix: a name may hold a dot)
        pending = Path(stem + PENDING_SUFFIX)
        if Path(stem + ".json").exists() and not pending.exists():
            continue  # a whole record, no save of it under way: nothing to take (nor lock)
        if _alive(pending):
            continue
        with contextlib.suppress(OSError, OrchestratorError), _held(pending, wait=0) as fd:
            if fd is not None and not Path(stem + ".json").exists():
                remove_files(Path(stem + MEMORY_SUFFIX))
                Path(stem + SUFFIX).unlink(missing_ok=True)
    return gone
