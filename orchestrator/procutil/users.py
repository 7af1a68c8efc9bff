"""Who a command runs as: "uid", "uid:gid", "name" or "name:group" turned into numbers
from this system's passwd and group files, within the range the engine takes. Standard
library only, Python 3.7+."""

from __future__ import annotations

from typing import Optional, Tuple

from .base import UnknownUser

MAX_ID = 2147483647
"""The largest uid or gid taken, the engine's (Docker and runc refuse more: "uids and gids
must be in range 0-2147483647"). The kernel would take more, but 4294967295 is -1 to setuid,
setgid and chown, "leave it as it is", which left a command root."""


def _id_text(text: str) -> bool:
    """Whether `text` is written as a numeric id (ASCII digits only)."""
    return text.isascii() and text.isdigit()


def in_range(number: int, what: str) -> int:
    """`number` as a uid or gid (`what`); UnknownUser when it is out of MAX_ID's range."""
    if not 0 <= number <= MAX_ID:  # (pwd gives 4294967295 as -1: said as written)
        shown = number % (1 << 32) if -(1 << 31) <= number < 0 else number
        raise UnknownUser("%s %d is out of range (0 to %d)" % (what, shown, MAX_ID))
    return number


def numeric_ids(user: str) -> Optional[Tuple[int, int]]:
    """ "uid" or "uid:gid" as numbers (a bare uid gets gid = uid); None when a part is a name.
    UnknownUser for a number out of range."""
    uid, _, gid = user.partition(":")
    if not _id_text(uid) or not _id_text(gid or uid):
        return None
    return in_range(int(uid), "uid"), in_range(int(gid or uid), "gid")


def resolve_ids(user: str) -> Tuple[int, int]:
    """ "uid", "uid:gid", "name" or "name:group" as numbers, looked up in this system's
    passwd and group files. A bare uid without a passwd entry gets gid = uid. UnknownUser
    when one is missing, or a number (written, or in those files) is out of range."""
    numeric = numeric_ids(user)
    if numeric is not None:
        return numeric
    name, _, group = user.partition(":")
    entry = None
    if _id_text(name):
        uid = in_range(int(name), "uid")
    else:
        try:
            import pwd

            entry = pwd.getpwnam(name)
        except (ImportError, KeyError):
            raise UnknownUser(
                "unable to find user %s: no matching entries in passwd file" % name
            ) from None
        uid = in_range(entry.pw_uid, "uid")
    if _id_text(group):
        return uid, in_range(int(group), "gid")
    if group:
        try:
            import grp

            return uid, in_range(grp.getgrnam(group).gr_gid, "gid")
        except (ImportError, KeyError):
            raise UnknownUser(
                "unable to find group %s: no matching entries in group file" % group
            ) from None
    return uid, in_range(entry.pw_gid, "gid") if entry is not None else uid


def home_of(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_dir
    except (ImportError, KeyError):
        return "/"
