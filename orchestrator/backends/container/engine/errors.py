"""Engine failures typed once: what the engine said, read in this one module and turned into
an error type (as python-on-whales does in `utils.run`), which callers catch; no other module
tests engine text."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Union, cast

from orchestrator.backends.container.engine.bounds import KILLED, TIMED_OUT, bound_of
from orchestrator.errors import BackendUnavailable, DockerError, OrchestratorError

if TYPE_CHECKING:
    from python_on_whales.exceptions import DockerException

DAEMON_DOWN = (
    "cannot connect to the docker daemon",
    "failed to connect to the docker api",
    "is the docker daemon running",
)


class CallFailed(Exception):
    """A docker CLI call that exited non-zero (or timed out: TIMED_OUT), with what it
    printed; the same fields as python-on-whales' DockerException, without importing it."""

    def __init__(
        self,
        argv: Sequence[str | Path],
        return_code: int,
        stdout: bytes | str | None = None,
        stderr: bytes | str | None = None,
    ) -> None:
        self.docker_command = [str(a) for a in argv]
        self.return_code = return_code
        self.stdout = _text(stdout)
        self.stderr = _text(stderr)
        super().__init__(
            f"`{shlex.join(self.docker_command)}` exited {return_code}: {self.stderr or ''}"
        )


def _text(data: bytes | str | None) -> str | None:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


Failure = Union["DockerException", CallFailed]
"""A failed engine call, as python-on-whales' API or our `run` reports it."""


class NoSuchContainer(DockerError):
    """The engine has no such container (removed, or never made)."""


class ContainerNotRunning(DockerError):
    """The container exists but is stopped (exited, killed, never started)."""


class ContainerPaused(DockerError):
    """The container is paused: nothing can be run in it until it is unpaused."""


class NoSuchImage(DockerError):
    """The engine has no such image."""


class NoSuchNetwork(DockerError):
    """The engine has no such network."""


class NoSuchVolume(DockerError):
    """The engine has no such volume."""


class RemovalInProgress(DockerError):
    """Another process is removing the container already (a reaper, a guardian, a `down`):
    it is going, only not by us."""


class NetworkInUse(DockerError):
    """A network cannot be removed while a container still uses it."""


class SubnetOverlap(DockerError):
    """The subnet asked for a network overlaps one the engine already has."""


class NetworkAmbiguous(DockerError):
    """Two networks of one name: a loaded engine can make a network twice when Compose asks
    for it again before the first is listed (`create`, then `up`)."""


class NotSwarmManager(DockerError):
    """The engine is not a Swarm manager (no swarm, or a worker)."""


class VolumeInUse(DockerError):
    """A volume a container still mounts (on a shared engine: possibly someone else's)."""


class StorageOptUnsupported(DockerError):
    """The engine's storage driver cannot limit a container's disk (--storage-opt size)."""


class StackEmpty(DockerError):
    """The stack has no task (yet: just deployed; or it is gone)."""


class FreezerBusy(DockerError):
    """The cgroup freezer gave up on a pause (processes forking as it froze them)."""


# The engine's own words for each kind, lower-cased. Order matters: a message may quote
# another ("Cannot kill container: X: No such container: X" is NoSuchContainer), so the
# first kind whose words are found wins. This is the one place engine text is read.
KINDS: tuple[tuple[type[DockerError], tuple[str, ...]], ...] = (
    (NoSuchContainer, ("no such container", "no such object")),
    (ContainerPaused, ("is paused, unpause", "cannot exec in a paused")),  # (then runc's)
    (ContainerNotRunning, ("is not running",)),
    (NoSuchImage, ("no such image", "image not known")),  # (the second: Podman's)
    (RemovalInProgress, ("removal of container",)),  # "... X is already in progress"
    (NoSuchNetwork, ("no such network", "network not found")),
    (NoSuchVolume, ("no such volume", "no volume with name")),  # (the second: Podman's)
    (NetworkInUse, ("has active endpoints",)),
    (VolumeInUse, ("volume is in use", "volume is being used")),  # (the second: Podman's)
    (SubnetOverlap, ("pool overlaps", "overlapping ipv4", "overlaps with other")),
    (NetworkAmbiguous, ("is ambiguous (",)),  # "network X is ambiguous (2 matches found ..."
    (NotSwarmManager, ("not a swarm manager", "this node is not a swarm")),
    (StorageOptUnsupported, ("storage-opt",)),
    (StackEmpty, ("nothing found in stack",)),
    (FreezerBusy, ("unable to freeze",)),
)
UNKNOWN_USER = re.compile(
    r"unable to find (?:user|group) [^\n]*|(?:uid|gid) \d+ is out of range[^\n]*"
    r"|uids and gids must be in range[^\n]*",
    re.IGNORECASE,
)
"""What runc says, as a command's own stderr (exit 126), when the exec's user is not in the
image's passwd or group file, or an id there is out of its range; or the executor, when an
id there is out of range."""


_NAMED_NOT_FOUND = re.compile(r"\bnetwork \S+ not found")
"""The engine's other words for a missing network ("network NAME not found")."""


def classify(stderr: str) -> type[DockerError]:
    """The error type the engine's message stands for (DockerError when none fits)."""
    lowered = stderr.lower()
    for kind, words in KINDS:
        if any(word in lowered for word in words):
            return kind
    if _NAMED_NOT_FOUND.search(lowered):
        return NoSuchNetwork
    return DockerError


_CHDIR = re.compile(  # runc's words, then runsc's
    rb'(?:chdir to cwd \("(.*)"\) set in config\.json failed'
    rb'|failed to find initial working directory "(.*)"): ([a-z ]+)'
)


def exec_refusal(said: bytes, code: int) -> tuple[int, bytes]:
    """The exit code and stderr of a command the engine would not start, from what the
    docker CLI printed (on its stdout): a missing or non-folder cwd is 2 and the words the
    executor uses, as a shell would say it; the rest keep the engine's words."""
    found = _CHDIR.search(said)
    if found is not None and found.group(3) in (b"no such file or directory", b"not a directory"):
        why = found.group(3).decode().capitalize()
        where = found.group(1) or found.group(2)
        return 2, b"cannot change directory to %s: %s\n" % (where, why.encode())
    return code, said.replace(b"\r\n", b"\n")


_NO_PROCESS = re.compile(
    rb"can't fork|cannot fork|resource temporarily unavailable|cannot allocate memory"
    # runc, when the process it clones for an exec dies at once (a full pids limit: one
    # exec in about twenty, the rest get the shell's "can't fork")
    rb"|read init-p: connection reset by peer",
    re.IGNORECASE,
)


def no_process(said: bytes) -> bool:
    """Whether an exec's output (the engine's or the shell's words) says the sandbox could
    not start a process (its pids or memory limit is reached)."""
    return _NO_PROCESS.search(said) is not None


_DYING = re.compile(
    rb"cannot exec in a (?:stopped|deleted) (?:container|state)"
    rb"|error executing setns process|write init-p: broken pipe",
    re.IGNORECASE,
)


def exec_refused_as_it_died(said: bytes) -> bool:
    """Whether the engine's refusal of an exec (runc's words, exit 126) is what it says of
    a container stopping as the exec starts: the engine may still read it as running."""
    return _DYING.search(said) is not None


_NO_EXEC = (NoSuchContainer, ContainerPaused, ContainerNotRunning, RemovalInProgress)


def exec_impossible(said: bytes) -> bool:
    """Whether an exec's output says no exec can run in the container now, however often it
    is tried: it is gone, paused or stopped, or the engine is not reachable. (Other failures,
    such as runc's "read init-p: connection reset by peer" when the pids limit is reached as
    it starts the process, may pass on a retry.)"""
    text = said.decode(errors="replace")
    lowered = text.lower()
    return any(sign in lowered for sign in DAEMON_DOWN) or classify(text) in _NO_EXEC


def unknown_user(stderr: str) -> str | None:
    """The engine's words when an exec failed because its user is not in the image."""
    found = UNKNOWN_USER.search(stderr)
    return found.group(0) if found else None


def wrap(action: str, exc: Failure) -> OrchestratorError:
    """A failed engine call as ours, keeping exit code and stderr, typed by what the
    engine said (see `classify`)."""
    stderr = (exc.stderr or "") if isinstance(exc.stderr, str) else ""
    text = stderr + (exc.stdout or "" if isinstance(exc.stdout, str) else "")
    lowered = text.lower()
    if any(sign in lowered for sign in DAEMON_DOWN):
        return BackendUnavailable(
            "the Docker engine is not reachable: start it (Docker Desktop, "
            "or `dockerd`; on our machines run scripts/bootstrap-docker)"
        )
    command = [str(c) for c in exc.docker_command]
    code = exc.return_code
    if code in KILLED and bound_of(command) is not None:  # `timeout` had to KILL it
        code = TIMED_OUT
    if code == TIMED_OUT:
        action += " timed out (the engine did not answer in time; see ORCHESTRATOR_*_TIMEOUT)"
    else:
        action += f" failed (exit {code})"
    return classify(text)(action, command=command, returncode=code, stderr=stderr)


@contextmanager
def docker_errors(action: str) -> Iterator[None]:
    try:
        yield
    except CallFailed as exc:
        raise wrap(action, exc) from exc
    except FileNotFoundError as exc:
        raise BackendUnavailable(
            "the docker CLI is not installed (see `orchestrator doctor`)"
        ) from exc
    except UnicodeDecodeError as exc:  # python-on-whales decodes what the CLI said strictly
        raise DockerError(f"{action} failed: the engine's answer is not UTF-8 ({exc})") from exc
    except Exception as exc:
        if not is_whales_error(exc):
            raise
        raise wrap(action, cast("DockerException", exc)) from exc


def is_whales_error(exc: BaseException) -> bool:
    """Whether `exc` is python-on-whales' DockerException (none can be before it is
    imported: it is not imported here for this)."""
    module = sys.modules.get("python_on_whales.exceptions")
    return module is not None and isinstance(exc, module.DockerException)
