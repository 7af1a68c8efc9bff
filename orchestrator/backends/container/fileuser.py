"""The file's `user` in a container, checked once the image is there: numeric ids held to
the engine's range (an image's USER may be anything), and a name, which exists only in the
image, looked up once at spawn, so a typo fails there, naming the field, and not as 126 on
every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from orchestrator import procutil
from orchestrator.backends.container.engine import unknown_user
from orchestrator.errors import SpecError, SpecIssue


class Ran(Protocol):
    """What `check_named` needs of a command's result."""

    @property
    def exit_code(self) -> int: ...
    @property
    def stderr(self) -> str: ...


def user_error(source: str, message: str, fix: str) -> SpecError:
    """A spec error on the file's `user`, found only once the image is there."""
    return SpecError(SpecIssue(source, field="user", message=message, fix=fix))


def check_ids(source: str, user: str, what: str) -> tuple[int, int] | None:
    """`user`'s ids if it is numeric (None for a name); SpecError naming `user` when they
    are out of the engine's range."""
    try:
        return procutil.numeric_ids(user)
    except procutil.UnknownUser as exc:
        fix = "give `user:` a uid[:gid] in range, or a name the image has"
        raise user_error(source, f"{what} {user!r}: {exc}", fix) from None


def check_named(source: str, user: str | None, run_true: Callable[[], Ran]) -> None:
    """SpecError when the user named (not numeric) is not in the image: `run_true` runs
    `true` as the default user, which the engine refuses (126) for an unknown one."""
    if not user or check_ids(source, user, "the user") is not None:
        return
    probe = run_true()
    said = unknown_user(probe.stderr) if probe.exit_code == 126 else None
    if said is not None:
        fix = "create the user in the image, or give a uid[:gid]"
        raise user_error(source, f"{said.strip()} of the image", fix)
