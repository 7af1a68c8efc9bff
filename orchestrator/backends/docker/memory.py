"""Checkpoints with memory: a gVisor sandbox's processes, memory and in-sandbox files (its
tmpfs) saved by the engine's checkpoint API, kept with a suspend record, and restored into
copies (`checkpoint(memory=True)`, `fork`, `wake`; docs/fork.md).

What works here, and so what this takes:
- gVisor saves a sandbox only without the host's network (`runsc --network=host`, which a
  networked gVisor container needs on these machines, is refused: "checkpoint not supported
  when using hostinet"), and this runsc cannot give a container its own network stack. So
  only a sandbox with no network at all is saved: one container with `network_mode: none`,
  on the runtime runsc with `--network=none` is registered under (`runsc-sealed`,
  scripts/bootstrap-gvisor), made through the Engine API (direct.py).
- The engine's checkpoint API exists in its experimental mode only.
- Docker starts a container from a checkpoint only from its own folder for that container
  (`docker start --checkpoint-dir` answers "custom checkpointdir is not supported"). So a
  copy's image is put there, under the engine's data root, which only root may write: this
  is done only by root, for an engine on this machine's socket.

Why by hand: neither python-on-whales nor the docker CLI moves a checkpoint between
containers. Every file read is opened without following links and must be a regular file;
a record's image is checked against the digests its record holds before it is used, and
its size is bounded (ORCHESTRATOR_CHECKPOINT_LIMIT)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import settings
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.engine.bounds import up_timeout
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.sandbox.snapshot import remove_files

if TYPE_CHECKING:
    from orchestrator.backends.docker.lifecycle import Project

SEALED_ENV = settings.GVISOR_SEALED_RUNTIME.name
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ID = re.compile(r"[0-9a-f]{64}")
MAX_FILES = 16
RESTORED = "restored-from-checkpoint"
"""A file in the project's folder: its sandbox was started from a checkpoint (see refusal)."""
CHUNK = 1 << 20


def sealed_runtime() -> str:
    return settings.GVISOR_SEALED_RUNTIME.get()


def limit() -> int:
    return settings.CHECKPOINT_LIMIT.get()


def refusal(project: Project) -> str | None:
    """Why this environment's memory cannot be saved here (None: it can)."""
    engine = project.engine
    if engine.kind != "docker":
        return f"the engine is {engine.kind}'s, and only Docker's restores a gVisor checkpoint"
    if project._direct() is None:  # (one container, network_mode: none)
        return (
            "only a gVisor sandbox with no network is saved with its memory here: one "
            "container (isolation: gvisor, network.egress: none, no service, no published "
            "port); this runsc keeps no network in a checkpoint"
        )
    got = project.runtime_of_main()
    if got != sealed_runtime():
        return (
            f"its sandbox runs on the engine runtime {got or 'runc'!r}, not on gVisor's "
            f"{sealed_runtime()!r} (runsc with --network=none, which scripts/bootstrap-gvisor "
            f"registers; {SEALED_ENV})"
        )
    if (project.directory / RESTORED).exists():
        return (
            "it was itself started from a checkpoint, and this engine cannot checkpoint such "
            "a sandbox again (its containerd keeps the task: 'id already in use'); save a "
            "record once (checkpoint(memory=True)) and wake it as often as needed"
        )
    return engine_refusal(engine)


def engine_refusal(engine: Engine) -> str | None:
    """Why this engine cannot restore a checkpoint made here (None: it can)."""
    if engine.socket is None:
        return "the engine is not on this machine's socket"
    if os.geteuid() != 0:
        return (
            "a copy starts from the engine's own folder for it (Docker starts a container "
            "from no other), which only root writes: run as root"
        )
    info = engine.described(action="asking the engine for its checkpoint support")
    if info.get("ExperimentalBuild") is not True:
        return "the engine's checkpoint API needs its experimental mode (dockerd --experimental)"
    root = str(info.get("DockerRootDir") or "")
    if not root.startswith("/") or not os.path.isdir(os.path.join(root, "containers")):
        return f"the engine's data root ({root or 'unsaid'}) is not on this machine"
    return None


def _own_folder(engine: Engine, container: str) -> Path:
    """The engine's folder of `container`'s checkpoints (its id checked: 64 hex digits)."""
    info = engine.described(action="asking the engine for its data root")
    got = engine.inspected(container, "inspecting the sandbox") or {}
    cid = str(got.get("Id") or "")
    if not _ID.fullmatch(cid):
        raise OrchestratorError(f"the engine gave {container} an unexpected id {cid!r}")
    return Path(str(info["DockerRootDir"]), "containers", cid, "checkpoints")


@contextlib.contextmanager
def held(engine: Engine, container: str, folder: Path) -> Iterator[dict[str, str]]:
    """Save `container`'s processes and memory into `folder` (made here, private) and stop
    it; yield the digest of each file saved, by name, while it stands still (what the block
    saves of its files is of this one instant); then start it again from that checkpoint:
    it runs on as it was."""
    name = f"orch-{uuid.uuid4().hex[:16]}"
    action = f"checkpointing {container}"
    try:
        engine.checkpoint_container(container, name, seconds=up_timeout(), action=action)
        yield _copy(_own_folder(engine, container) / name, folder, None)
    finally:
        try:  # (a checkpoint that failed, or timed out, may have stopped it all the same)
            engine.start_container(
                container, checkpoint=name, seconds=up_timeout(), action=f"restarting {container}"
            )
        finally:
            with contextlib.suppress(OrchestratorError):
                engine.delete_checkpoint(container, name, action=action)


def restore(engine: Engine, container: str, folder: Path, digests: dict[str, str]) -> None:
    """Start `container` (stopped first) from the memory image in `folder`, each file
    checked against `digests` as it is copied into the engine's own folder: a file changed
    since it was saved is refused (UsageError) before anything starts from it."""
    if not digests or len(digests) > MAX_FILES or not all(map(_FILE.fullmatch, digests)):
        raise UsageError(f"{folder}: the record's memory image is not one this made")
    own = _own_folder(engine, container)
    name = f"orch-{uuid.uuid4().hex[:16]}"
    action = f"restoring {container} from its checkpoint"
    engine.stop_container(container, grace=0, action=action)
    own.mkdir(mode=0o700, exist_ok=True)
    try:
        _copy(folder, own / name, digests)
        engine.start_container(container, checkpoint=name, seconds=up_timeout(), action=action)
    finally:
        with contextlib.suppress(OrchestratorError):
            engine.delete_checkpoint(container, name, action=action)
        remove_files(own / name)


def _copy(source: Path, dest: Path, want: dict[str, str] | None) -> dict[str, str]:
    """Copy the regular files of `source` into the new private folder `dest` (never through
    a link), at most limit() bytes in all; their digests. `want`: the files and digests
    they must have (anything else, or a mismatch: UsageError)."""
    names = sorted(want) if want is not None else sorted(os.listdir(source))
    if len(names) > MAX_FILES or not all(map(_FILE.fullmatch, names)):
        raise OrchestratorError(f"{source}: not a checkpoint this made ({len(names)} files)")
    dest.mkdir(mode=0o700)
    done: dict[str, str] = {}
    left = limit()
    try:
        for name in names:
            digest, left = _copy_file(source / name, dest / name, left)
            if want is not None and want[name] != digest:
                raise UsageError(
                    f"{source}: its memory image was changed since it was saved ({name}): refused"
                )
            done[name] = digest
    except BaseException:
        remove_files(dest)
        raise
    return done


def _copy_file(source: Path, dest: Path, left: int) -> tuple[str, int]:
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read the memory image {source}: {exc.strerror}") from None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{source} is not a regular file: refused")
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(out, "wb") as dst:
            while chunk := src.read(CHUNK):
                left -= len(chunk)
                if left < 0:
                    raise UsageError(
                        f"a checkpoint's memory image is over {limit()} bytes "
                        f"({settings.CHECKPOINT_LIMIT.name}): refused"
                    )
                digest.update(chunk)
                dst.write(chunk)
    return digest.hexdigest(), left
