"""The one error hierarchy.

Every error the library raises on purpose is an :class:`OrchestratorError`. Where a built-in
exception already names the situation, the subclass inherits it too, so callers may catch
either ``except OrchestratorError`` or the familiar built-in (``TimeoutError``, ``ValueError``,
``FileNotFoundError`` ...). Errors from lower layers (python-on-whales, subprocess) are wrapped
with ``raise ... from exc`` at the boundary, keeping their exit code and stderr.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.sandbox.results import RuntimeResult


class OrchestratorError(Exception):
    """Root of every error the orchestrator raises on purpose."""

    #: Exit code the CLI uses for this error.
    exit_code: int = 1


@dataclass(frozen=True)
class SpecIssue:
    """One problem found in an environment file, located as precisely as we can. Built by
    keyword after the file: `SpecIssue(source, field=..., message=..., fix=...)`, with
    `line` and `column` where they are known."""

    file: str
    _: KW_ONLY
    field: str
    message: str
    line: int | None = None
    column: int | None = None
    fix: str = ""

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: {self.field or '<file>'}: {self.message}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


class SpecError(OrchestratorError, ValueError):
    """An environment file (or spawn option) is invalid. Carries every issue found."""

    exit_code = 2

    def __init__(self, issues: list[SpecIssue] | SpecIssue | str) -> None:
        if isinstance(issues, str):
            issues = [SpecIssue(file="<input>", line=None, column=None, field="", message=issues)]
        elif isinstance(issues, SpecIssue):
            issues = [issues]
        self.issues: list[SpecIssue] = issues
        super().__init__("\n".join(str(i) for i in issues))


class PolicyError(SpecError):
    """The environment asks for something the security policy forbids."""


class UsageError(OrchestratorError, ValueError):
    """The caller used the API or CLI wrongly (bad argument, unknown backend, ...)."""

    exit_code = 2


class NoTerminal(UsageError):
    """A terminal (`start(tty=True)`) was asked of a sandbox that cannot give one: its
    commands go by plain `docker exec` (no python3 in the image)."""

    def __init__(self) -> None:
        super().__init__(
            "a terminal (tty=True) needs the in-container executor, which runs on the "
            "image's python3: this sandbox runs commands by plain `docker exec`"
        )


class BackendUnavailable(OrchestratorError, RuntimeError):
    """The backend cannot run here (no Docker engine, no Compose plugin, ...)."""

    exit_code = 3


class DockerError(OrchestratorError, RuntimeError):
    """A Docker or Compose command failed. Keeps the command, its exit code and stderr."""

    def __init__(
        self,
        message: str,
        *,
        command: list[str] | None = None,
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.command = command or []
        self.returncode = returncode
        self.stderr = stderr
        detail = f"\n{stderr.strip()}" if stderr.strip() else ""
        super().__init__(f"{message}{detail}")


class StartupError(OrchestratorError, RuntimeError):
    """An environment failed to come up. Everything it had started was removed."""


class AdmissionTimeout(StartupError, TimeoutError):
    """A spawn waited for room on this host (the admission budget of memory and CPUs) past
    ORCHESTRATOR_ADMISSION_TIMEOUT; nothing was started."""


class SetupFailed(StartupError):
    """A setup command exited non-zero. Carries the setup output."""

    def __init__(self, message: str, *, command: str, exit_code: int, stdout: str, stderr: str):
        self.command = command
        self.result_exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        tail = (stderr or stdout).strip().splitlines()[-10:]
        super().__init__(message + ("\n" + "\n".join(tail) if tail else ""))


class HealthcheckFailed(StartupError):
    """An extra service never became ready: unhealthy, exited during the start, or (a `job`)
    exited non-zero. Names it, its exit code and its last log lines."""


class RuntimeClosed(OrchestratorError, RuntimeError):
    """The runtime was cleaned up; it takes no more calls."""


class ProcessEnded(OrchestratorError, BrokenPipeError):
    """A started process's input was written after it ended, or after its stdin was closed."""


class PoolExhausted(OrchestratorError, RuntimeError):
    """A pool made with `total` has started that many environments, and none is left to
    hand out: start one yourself (spawn_runtime)."""


class CommandFailed(OrchestratorError, RuntimeError):
    """Raised only with ``check=True`` when a command exits non-zero."""

    def __init__(self, result: RuntimeResult) -> None:
        self.result = result
        super().__init__(f"command exited with {result.exit_code}")


class CommandTimeout(OrchestratorError, TimeoutError):
    """Raised only with ``check=True`` when a command ran past its timeout."""

    def __init__(self, result: RuntimeResult, timeout: float) -> None:
        self.result = result
        super().__init__(f"command timed out after {timeout:g}s")


class SandboxFileTimeout(OrchestratorError, TimeoutError):
    """A file call (read_file, write_file, upload, download) did not end within its deadline:
    the sandbox held it (a FIFO in the path, a stopped process). Its helpers were killed."""

    def __init__(self, message: str, *, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        super().__init__(message)


class ExecutorLost(OrchestratorError, ConnectionError):
    """The in-container executor died while a command was in flight."""


class SandboxUnavailable(OrchestratorError, ConnectionError):
    """The sandbox itself is gone, stopped, paused or cannot start a process: the command did
    not run to its end. This is the environment failing, not the command, so a harness
    should not grade it as the code's result."""

    exit_code = 3  # the CLI's "backend unavailable" class, as BackendUnavailable


class SandboxPaused(SandboxUnavailable):
    """The environment is paused (`rt.pause()`, `orchestrator pause`): nothing runs in it
    until it is resumed (`rt.resume()`, `orchestrator resume ID`). Calls fail at once, a
    command in flight within about two seconds; the environment itself is intact."""


class OutputLimitExceeded(OrchestratorError, OSError):
    """A file is larger than the read limit."""


class SandboxFileNotFound(OrchestratorError, FileNotFoundError):
    """The file does not exist in the sandbox."""


class SandboxIsADirectory(OrchestratorError, IsADirectoryError):
    """The path names a folder, not a file."""


class SandboxPermissionError(OrchestratorError, PermissionError):
    """The command user may not read or write that path."""


class SandboxNotADirectory(OrchestratorError, NotADirectoryError):
    """The path names a file where a folder is needed (upload, download)."""


class SandboxUnsafeArchive(OrchestratorError, ValueError):
    """A folder downloaded from the sandbox would write outside its destination (an absolute
    name, `..`, a link pointing out, a device); such an archive is refused before anything
    of it is written."""


class ProcessNotFound(OrchestratorError, LookupError):
    """`Sandbox.process(id)` names no kept process of that environment: never started
    there, ended and forgotten, or the environment was restarted."""


class ProjectNotFound(OrchestratorError, LookupError):
    """No running environment has that id."""

    exit_code = 2


class PartialListing(OrchestratorError):
    """A backend listed its environments but for some it could not ask about (an engine
    that did not answer): `partial` is what it listed, as `Backend.running` returns it."""

    def __init__(self, message: str, partial: object) -> None:
        super().__init__(message)
        self.partial = partial
