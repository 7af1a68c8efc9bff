"""The one rule for host paths: every host path an environment names (static assets, mounts,
service mounts, build contexts and Dockerfiles, the workspace) lies under an allowed root
after resolving `..` and symlinks, and is never a socket, a FIFO or device, a folder holding
host secrets or the orchestrator's state, nor a shared temp folder.

A host path is looked at in one place, `look_up`, which never raises: a path this process
cannot resolve or stat (/proc/1/root, a symlink loop, a name too long, a NUL byte) is a
problem reported against the field that named it, never a traceback. The policy
(`spec.policy`) says which extra roots the caller allows.
"""

from __future__ import annotations

import functools
import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator import settings
from orchestrator.errors import SpecIssue
from orchestrator.paths import STATE_DIR_ENV, state_dir

ROOTS_ENV = settings.ALLOWED_MOUNT_ROOTS.name
ENGINE_SOCKETS = ("docker.sock", "containerd.sock", "podman.sock", "dockershim.sock")
SECRET_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/var/lib/docker")
"""Host folders no sandbox may see, nor any folder that contains one (such as / or /var)."""
SECRET_HOME_DIRS = (".ssh", ".docker", ".aws", ".kube", ".gnupg", ".config/gcloud")


class MountRoots(list[Path]):
    """Allowed roots (resolved), each with what made it one, for messages."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: dict[Path, str] = {}
        self.ignored: list[str] = []

    def describe(self) -> str:
        """The roots as a message states them: `label path`, and what was ignored."""
        parts = [f"{self.labels.get(r, 'root')} {r}" for r in self]
        text = "; ".join(parts) or "none"
        if self.ignored:
            text += "; ignored: " + ", ".join(self.ignored)
        return text


PATH_RULE = (
    "relative paths in an environment file resolve against the file's own folder; a host "
    "path must lie under an allowed root: that folder, the workspace the caller gives "
    "(--workspace; none when the workspace is the private one made for each run), or a folder "
    f"the caller adds ({ROOTS_ENV}=/path{os.pathsep}/other, or Policy(extra_mount_roots=...) in "
    "the library)"
)
"""The one rule for host paths, as messages state it."""


@dataclass(frozen=True)
class HostPath:
    """A host path as this process sees it, looked up without raising."""

    real: Path
    """Resolved through `~`, `..` and symlinks; made absolute lexically when that failed."""
    exists: bool
    error: str | None = None
    """Why the path cannot be resolved or looked at (permission denied, a symlink loop, a
    name too long, a NUL byte, an unknown `~user`), or None."""


def _why(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, RuntimeError) and "loop" in str(exc).lower():
        return "a symlink loop"
    if isinstance(exc, ValueError) and "null" in str(exc).lower():
        return "it holds a NUL byte"
    return str(exc)


def look_up(path: Path, base: Path | None = None, *, home: bool = False) -> HostPath:
    """`path` (a relative one against `base`; a leading `~` expanded with `home`) resolved
    and checked for existence. Never raises: whatever the host makes of a hostile path
    (EACCES, ELOOP, ENAMETOOLONG, a NUL byte, an unknown `~user`) is reported in `error`."""
    joined = path if base is None else base / path
    try:
        expanded = path.expanduser() if home else path
        joined = expanded if base is None else base / expanded
        real = joined.resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        return HostPath(Path(os.path.abspath(joined)), False, _why(exc))
    try:
        real.stat()
    except (FileNotFoundError, NotADirectoryError):
        return HostPath(real, False)
    except (OSError, ValueError) as exc:
        return HostPath(real, False, _why(exc))
    return HostPath(real, True)


UNREADABLE_FIX = (
    "name a file or folder of your project that this user can read (relative paths resolve "
    "against the environment file's folder)"
)


def secret_paths() -> tuple[Path, ...]:
    """The secret folders, as written and resolved (for this HOME and every engine's socket),
    and the state folder (every environment's project folder, private workspace and records,
    and the admission ledger: see `state_paths`)."""
    home = os.environ.get("HOME") or "/root"
    fixed = _secret_paths(home, settings.engine_sockets())
    return tuple(dict.fromkeys([*fixed, *state_paths()]))


@functools.cache
def _secret_paths(home: str, sockets: tuple[str, ...]) -> tuple[Path, ...]:
    paths = [Path(p) for p in SECRET_DIRS] + [Path(home) / d for d in SECRET_HOME_DIRS]
    paths += [Path(socket) for socket in sockets]  # every engine's, wherever it lies
    return tuple(dict.fromkeys([*paths, *(look_up(p).real for p in paths)]))


def state_paths() -> tuple[Path, ...]:
    """The state folder (ORCHESTRATOR_STATE_DIR, else the XDG one), as written and resolved:
    a secret folder like /etc. A file whose folder holds it (`./.orch-state` in a CI
    project) must not reach another environment's workspace, its records or the ledger
    through a mount, an asset, a build context or a Compose volume."""
    return _state_paths(str(state_dir()))


@functools.cache
def _state_paths(state: str) -> tuple[Path, ...]:
    return tuple(dict.fromkeys([Path(state), look_up(Path(state)).real]))


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _special_kind(path: Path) -> str | None:
    """ "a FIFO" or "a device" when `path` is one (the builder or a sandbox opening it would
    wait on a writer, or reach host hardware); None for folders, files and what is missing."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return None


def _temp_dirs() -> tuple[Path, ...]:
    return _temp_dirs_for(tempfile.gettempdir())


@functools.cache
def _temp_dirs_for(tmp: str) -> tuple[Path, ...]:
    dirs = {Path(tmp), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")}
    return tuple(dict.fromkeys([*dirs, *(look_up(d).real for d in dirs)]))


def too_broad(path: Path) -> bool:
    """A folder that is, or contains, a shared temp folder or a secret folder."""
    if path == Path(path.anchor):
        return True
    return any(t.is_relative_to(path) for t in (*_temp_dirs(), *secret_paths()))


def _secret_problem(real: Path, secret: Path) -> tuple[str, str]:
    """(message, fix) for a host path that is, holds or lies in a secret folder."""
    if secret in state_paths():
        return (
            f"{real} is, holds or lies in the orchestrator's state folder {secret} (every "
            "environment's project folder and private workspace, snapshots, the admission "
            "ledger), which no sandbox may see",
            "name a folder of your project that neither is nor holds it, and keep the state "
            f"folder out of the project ({STATE_DIR_ENV} outside the environment file's "
            "folder)",
        )
    return (
        f"{real} is or contains {secret}, which no sandbox may see",
        "name a folder of your project instead",
    )


def _secret_in(real: Path, secrets: Iterable[Path]) -> tuple[str, str] | None:
    for secret in secrets:
        if real == secret or real.is_relative_to(secret) or secret.is_relative_to(real):
            return _secret_problem(real, secret)
    return None


def _temp_in(real: Path) -> tuple[str, str] | None:
    for temp in _temp_dirs():
        if temp.is_relative_to(real):
            return (
                f"{real} is or contains the shared temp folder {temp} (other jobs' files)",
                "name a folder of your own instead",
            )
    return None


def _host_path_problem(real: Path, roots: list[Path]) -> tuple[str, str] | None:
    """(message, fix) when `real` (already resolved) may not reach a sandbox."""
    if real.name in ENGINE_SOCKETS or _is_socket(real):
        return (
            f"{real} is a socket; mounting a container engine's socket (or any host "
            "socket) is not allowed",
            "a sandbox must never control the engine or host services; remove it",
        )
    special = _special_kind(real)
    if special is not None:
        return (
            f"{real} is {special}; only folders and regular files may reach a sandbox or a build",
            "name a regular file or a folder instead",
        )
    state = state_paths()  # (said after the temp folders, which may hold it)
    found = (
        _secret_in(real, [s for s in secret_paths() if s not in state])
        or _temp_in(real)
        or _secret_in(real, state)
    )
    if found is not None:
        return found
    if not any(real == r or real.is_relative_to(r) for r in roots):
        allowed = roots.describe() if isinstance(roots, MountRoots) else ", ".join(map(str, roots))
        return (
            f"{real} is outside the allowed roots ({allowed or 'none'})",
            f"{PATH_RULE}. Move it under the file's folder, or let the caller allow it: "
            f"{ROOTS_ENV}={real}",
        )
    return None


def check_host_paths(
    source: str, paths: Iterable[tuple[str, Path]], roots: list[Path]
) -> list[SpecIssue]:
    """`paths` are (field path, host path) pairs; every one must pass the host-path rule."""
    issues = []
    for field_path, path in paths:
        found = look_up(path, home=True)
        if found.error is not None:
            problem: tuple[str, str] | None = (
                f"cannot look at {str(path)!r}: {found.error}",
                UNREADABLE_FIX,
            )
        else:
            problem = _host_path_problem(found.real, roots)
        if problem is not None:
            message, fix = problem
            issues.append(SpecIssue(source, field=field_path, message=message, fix=fix))
    return issues


def check_workspace(workspace: Path) -> list[SpecIssue]:
    """The caller's workspace is mounted read-write: it may not hold secrets or be shared."""
    found = look_up(workspace, home=True)
    if found.error is not None:
        return [
            SpecIssue(
                "<spawn>",
                field="workspace",
                message=f"cannot look at workspace {str(workspace)!r}: {found.error}",
                fix="pass a folder of its own that this user can read "
                "(or none: a private one is made)",
            )
        ]
    real = found.real
    if too_broad(real):
        return [
            SpecIssue(
                "<spawn>",
                field="workspace",
                message=f"workspace {real} is or contains a system, secret or shared temp folder",
                fix="pass a folder of its own (or none: a private one is made)",
            )
        ]
    return []
