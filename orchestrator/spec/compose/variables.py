"""Compose's variables: interpolation (`${VAR:-default}` ...), env files, and the files a
Compose file names beside itself."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.spec.hostpaths import look_up

Loc = tuple[str | int, ...]
MAX_ENV_FILE = 64 * 1024
"""Largest `env_file` (or `.env`) read, in bytes."""
MAX_NESTING = 32
"""Deepest ${VAR:-${...}} nesting interpolated."""

_VAR = re.compile(r"\$(?:(\$)|([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)((?::?[-?+]))?)")


class InterpolationError(ValueError):
    pass


def interpolate(
    text: str, lookup: Callable[[str], str | None], unset: list[str], depth: int = 0
) -> str:
    """`text` with Compose's variables replaced: $$, $VAR, ${VAR}, ${VAR:-d}, ${VAR-d},
    ${VAR:?err}, ${VAR?err}, ${VAR:+alt}, ${VAR+alt}; a default or alternative may itself hold
    variables (at most MAX_NESTING deep). An unset variable with no default reads as empty and
    is listed in `unset`."""
    if depth > MAX_NESTING:
        raise InterpolationError(f"defaults nested deeper than {MAX_NESTING}")
    out: list[str] = []
    i = 0
    while True:
        m = _VAR.search(text, i)
        if m is None:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : m.start()])
        dollar, bare, braced, op = m.groups()
        if dollar:
            out.append("$")
            i = m.end()
            continue
        name = bare or braced
        value = lookup(name)
        if bare:
            if value is None:
                unset.append(name)
            out.append(value or "")
            i = m.end()
            continue
        end = _closing(text, m.end())
        if end < 0:
            raise InterpolationError(f"unclosed ${{ in {text!r}")
        arg = text[m.end() : end]
        i = end + 1
        empty_counts = op is not None and op.startswith(":")
        is_set = value is not None and (value != "" or not empty_counts)
        kind = op[-1] if op else ""
        if kind == "-":
            out.append(
                value
                if is_set and value is not None
                else interpolate(arg, lookup, unset, depth + 1)
            )
        elif kind == "?":
            if not is_set:
                raise InterpolationError(
                    f"variable {name} must be set" + (f": {arg}" if arg else "")
                )
            out.append(value or "")
        elif kind == "+":
            out.append(interpolate(arg, lookup, unset, depth + 1) if is_set else "")
        else:
            if arg:
                raise InterpolationError(f"bad substitution ${{{name}{arg}}}")
            if value is None:
                unset.append(name)
            out.append(value or "")


def _closing(text: str, start: int) -> int:
    depth = 1
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments, `export `, quotes as Compose reads them) of a regular file
    (not a link, a FIFO or a device: opened without following or blocking), at most
    MAX_ENV_FILE bytes; ValueError past that, or for a NUL or control character."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        raw = os.read(fd, MAX_ENV_FILE + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_ENV_FILE:
        raise ValueError(f"larger than {MAX_ENV_FILE // 1024} KiB")
    if re.search(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", raw):
        raise ValueError("holds a NUL or control character")
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", key):
            continue
        value = value.strip()
        end = value.find(value[0], 1) if value[:1] in ("'", '"') else -1
        if end > 0:  # quoted: up to its closing quote (a comment may follow)
            value = value[1:end]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key] = value
    return out


def interpolate_tree(
    node: Any,
    loc: Loc,
    lookup: Callable[[str], str | None],
    unset: list[str],
    errors: list[tuple[Loc, str]],
) -> Any:
    if isinstance(node, str):
        try:
            return interpolate(node, lookup, unset)
        except InterpolationError as exc:
            errors.append((loc, str(exc)))
            return node
    if isinstance(node, dict):
        return {k: interpolate_tree(v, (*loc, k), lookup, unset, errors) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(v, (*loc, i), lookup, unset, errors) for i, v in enumerate(node)]
    return node


def inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def beside(written: str, base_dir: Path) -> Path:
    """A file the Compose file names, resolved (links too): it must stay in the Compose
    file's folder (ValueError otherwise)."""
    found = look_up(Path(written), base_dir)
    if found.error is not None:
        raise ValueError(f"{written}: {found.error}")
    if not inside(found.real, base_dir):
        raise ValueError(f"{written} is outside the Compose file's folder")
    return found.real
