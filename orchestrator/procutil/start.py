"""Starting a command as a session of its own, as the requested user: what cannot start
is answered as a shell would answer it (`Refused`: 127, 126, 2), and only "no process at
all" raises (`NoProcess`). Standard library only, Python 3.7+."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Dict, List, NoReturn, Optional, Tuple

from .base import NO_PROCESS, Lost, NoProcess, UnknownUser
from .held import Held
from .users import home_of, resolve_ids

if TYPE_CHECKING:
    from .base import Spawn


class Refused(Exception):
    """A command that cannot start, as the exit status and message a shell would give."""

    def __init__(self, code: int, message: str) -> None:
        Exception.__init__(self, message)
        self.code, self.message = code, message


def start_command(
    argv: List[str],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    with_stdin: bool,
    stdio: Tuple[Optional[int], Optional[int]] = (None, None),
    spawn: Optional[Spawn] = None,
    held: Optional[List["subprocess.Popen[bytes]"]] = None,
) -> "subprocess.Popen[bytes]":
    """Start `argv` as a new session, as `user` (switching only when it differs from ours);
    `stdio`: file descriptors to give it as stdin and stdout instead of pipes. `spawn`
    starts it instead when there is a switch to make (the executor's spawners), or returns
    None to leave it to Popen. `held`: where the Popen puts itself before it makes its
    process, made with the unwinding signals held (held.py), so the caller can end it
    whatever unwinds it."""
    kwargs: Dict[str, Any] = {}
    if user:
        try:
            uid, gid = resolve_ids(user)
        except UnknownUser as exc:  # as `docker exec -u` answers it
            raise Refused(126, str(exc)) from None
        if uid != os.geteuid() or gid != os.getegid():
            if env is not None and uid != os.geteuid():
                env = dict(env, HOME=home_of(uid))
            if spawn is not None:
                given: Any = stdio[0] if stdio[0] is not None else (True if with_stdin else None)
                try:
                    child = spawn(argv, env or dict(os.environ), cwd, uid, gid, given, stdio[1])
                except Lost as exc:
                    raise Refused(128 + signal.SIGKILL, str(exc)) from None
                except OSError as exc:
                    _raise_as_shell(exc, argv, cwd)
                except (ValueError, TypeError) as exc:
                    raise Refused(125, "cannot start the command: %s" % exc) from None
                if child is not None:
                    return child  # type: ignore[no-any-return]
            if sys.version_info >= (3, 9):
                kwargs = {"user": uid, "group": gid, "extra_groups": []}
            else:  # pragma: no cover - old Pythons inside containers

                def drop() -> None:
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)

                kwargs = {"preexec_fn": drop}
    given = subprocess.PIPE if with_stdin else subprocess.DEVNULL
    try:
        return Held(
            [] if held is None else held,
            argv,
            stdin=given if stdio[0] is None else stdio[0],
            stdout=subprocess.PIPE if stdio[1] is None else stdio[1],
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
    except OSError as exc:
        _raise_as_shell(exc, argv, cwd)
    except (ValueError, TypeError) as exc:  # NUL bytes, bad env keys, ...
        raise Refused(125, "cannot start the command: %s" % exc) from None


def _raise_as_shell(exc: OSError, argv: List[str], cwd: Optional[str]) -> NoReturn:
    if exc.errno in NO_PROCESS:
        raise NoProcess(exc.errno, "cannot start a process: %s" % exc.strerror) from None
    raise Refused(*_shell_answer(exc, argv, cwd)) from None


def _shell_answer(exc: OSError, argv: List[str], cwd: Optional[str]) -> Tuple[int, str]:
    """The exit code and message a shell would give for a command that could not start."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and cwd and not os.path.isdir(cwd):
        why = (
            "Not a directory"
            if isinstance(exc, NotADirectoryError)
            else "No such file or directory"
        )
        return 2, "cannot change directory to %s: %s" % (cwd, why)  # the error's, as a shell
    if isinstance(exc, FileNotFoundError):
        return 127, "%s: command not found" % argv[0]
    if isinstance(exc, PermissionError):
        return 126, "%s: permission denied" % argv[0]
    return 126, "%s: %s" % (argv[0], exc.strerror or exc)
