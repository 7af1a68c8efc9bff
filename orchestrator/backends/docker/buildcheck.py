"""What a file's build may do, checked on the very files the builder reads.

`docker build` runs outside every rule a sandbox lives under unless told: on the default
network, without limits, on the host's kernel, fetching what its Dockerfile names. So
(issue 37, item 4):

- the context is copied, following no link and leaving out what is not a file, a folder or
  a link, into a private folder (`private_context`), and the builder gets the copy with the
  Dockerfile whose text was checked: nothing swapped in after the check is built;
- `ADD` of a URL or a git repository is refused: the engine fetches it itself, from the
  host's own network namespace, past any egress rule (127.0.0.1 included);
- every image the build starts from (`FROM`, `COPY --from`) must be on the engine unless the
  caller lets it pull (Policy.allow_pull): a registry is a peer that learns about the host;
- build.py runs the classic builder with the network, memory and CPU of the container the
  image is for, and refuses a build when the caller requires gVisor.

The Dockerfile is read as the classic builder reads it: instructions case-insensitive, lines
joined at the escape character (`\\` or a `# escape=` directive's), comments dropped, `ARG`s
before the first `FROM` substituted into it from their defaults and the build's args."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator import settings
from orchestrator.backends.container.binds import PinRefused, open_exact
from orchestrator.backends.docker.buildplan import ImageBuild
from orchestrator.errors import SpecIssue
from orchestrator.paths import read_regular

_VAR = re.compile(r"\$(?:\{([A-Za-z_]\w*)(?:(:[-+])([^}]*))?\}|([A-Za-z_]\w*))")
_PLAIN_SOURCE = re.compile(r"^[A-Za-z0-9._/*?\[\]+,=-]+$")
"""What an ADD source may be here: a path of the context, with globs. No URL (`:`), no git
(`@`), no variable (`$`), quote or escape: any of those the builder may turn into a fetch."""
_WORD = re.compile(r"^\s*(\S+)\s*(.*)$", re.S)
DOCKERFILE_LIMIT = 1 << 20
ESCAPES = ("\\", "`")
"""The two escape characters a Dockerfile may use (`# escape=`): every reading is checked."""


def _logical(lines: list[str], escape: str, lstrip: bool) -> list[tuple[int, str]]:
    r"""The instructions of `lines` as the builder joins them with `escape`: a line ending in
    it (trailing blanks aside) goes on with the next, with nothing between (so `AD\` and
    `D x` make `ADD x`); comment lines inside are dropped. `lstrip`: with the next line's
    leading blanks removed, as some builders do."""
    out: list[tuple[int, str]] = []
    start, current = 0, None
    for number, raw in enumerate(lines, 1):
        line = raw.lstrip(" \t") if (lstrip and current is not None) else raw
        if current is None:
            if not raw.strip(" \t") or raw.lstrip(" \t").startswith("#"):
                continue
            start, current = number, ""
        elif raw.lstrip(" \t").startswith("#"):
            continue
        body = line.rstrip(" \t\r")
        if body.endswith(escape):
            current += body[: -len(escape)]
            continue
        out.append((start, current + line))
        current = None
    if current is not None:
        out.append((start, current))
    return out


def readings(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, rest) of every instruction under every way a builder may read
    the file: each physical line on its own, and the lines joined with either escape
    character, with and without the next line's leading blanks. A check that holds on all
    of them holds on the builder's, whatever our parse and its differ on (a BOM, a
    directive, a blank after the escape): each instruction starts some line in one of
    them."""
    lines = text.removeprefix("\ufeff").splitlines()
    views = [[(n, line) for n, line in enumerate(lines, 1)]]
    views += [_logical(lines, esc, strip) for esc in ESCAPES for strip in (False, True)]
    out: list[tuple[int, str, str]] = []
    for view in views:
        for number, line in view:
            found = _WORD.match(line)
            if found and not found.group(1).startswith("#"):
                entry = (number, found.group(1).upper(), found.group(2).strip())
                if entry not in out:
                    out.append(entry)
    return out


def _words(rest: str) -> list[str]:
    """An instruction's arguments: its JSON form, else split at whitespace."""
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
            if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
                return parsed
        except ValueError:
            pass
    return rest.split()


def _substitute(word: str, values: Mapping[str, str]) -> str | None:
    """`word` with $VAR, ${VAR}, ${VAR:-default} and ${VAR:+alt} replaced as the builder
    does; None when a variable it needs has no value (so the image cannot be told)."""
    missing = False

    def one(found: re.Match[str]) -> str:
        nonlocal missing
        name = found.group(1) or found.group(4)
        op, word = found.group(2), found.group(3) or ""
        value = values.get(name)
        if op == ":-":
            return value if value else word
        if op == ":+":
            return word if value else ""
        if value is None:
            missing = True
            return ""
        return value

    out = _VAR.sub(one, word)
    return None if missing or "$" in out else out


def problems(text: str, args: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, images): what the Dockerfile does that no build may (each a sentence with
    its line), and the images it starts from (FROM, COPY --from), for the engine to have.
    Checked on every reading of the file (`readings`): a false alarm is possible on an odd
    file, a miss is not."""
    found: list[str] = []
    images: list[str] = []
    stages: set[str] = set()
    values = _global_args(text, args)
    for line, word, rest in readings(text):
        parts = _words(rest)
        flags = [p for p in parts if p.startswith("--")]
        plain = [p for p in parts if not p.startswith("--")]
        if word == "ONBUILD":
            found.append(f"line {line}: ONBUILD adds steps that run in another build, unseen here")
        elif word == "ADD":
            bad = [p for p in plain[:-1] if not _PLAIN_SOURCE.match(p)] or [
                f for f in flags if f.lower().startswith(("--checksum", "--keep-git-dir"))
            ]
            if bad or not plain[:-1]:
                found.append(
                    f"line {line}: ADD {' '.join(bad) or rest} is not a plain path of the "
                    "context (a URL, a repository, a variable, a quote or an escape): the "
                    "engine would fetch it itself, past the file's egress"
                )
        elif word == "FROM" and plain:
            image = _substitute(plain[0], values)
            if image is None:
                found.append(f"line {line}: FROM {plain[0]} names a variable with no value")
            elif image.lower() != "scratch" and image not in stages:
                images.append(image)
            if len(plain) >= 3 and plain[1].lower() == "as":
                stages.add(plain[2].lower())
        elif word == "COPY":
            for flag in flags:
                if flag.startswith("--from="):
                    ref = flag.removeprefix("--from=")
                    if "$" in ref:
                        found.append(f"line {line}: COPY {flag} names a variable")
                    elif ref.lower() not in stages and not ref.isdigit():
                        images.append(ref)
    return found, images


def _global_args(text: str, args: Mapping[str, str]) -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults or the build's args."""
    values: dict[str, str] = {}
    for _, word, rest in readings(text):
        if word == "FROM":
            break
        if word == "ARG":
            for part in _words(rest):
                name, eq, default = part.partition("=")
                if name in args:
                    values[name] = args[name]
                elif eq:
                    values[name] = default.strip("\"'")
    return values


PROBLEM_FIX = (
    "put what the build needs into its context (ADD/COPY of a file), or fetch it in a RUN "
    "step, which follows the file's egress"
)


def dockerfile_issues(plan: ImageBuild) -> list[SpecIssue]:
    """What the build's Dockerfile does that no build may, each at the build's dockerfile
    field (for `validate`; build.py checks the private copy the builder reads again)."""
    data = read_regular(plan.context / (plan.dockerfile or "Dockerfile"), DOCKERFILE_LIMIT)
    if data is None or len(data) > DOCKERFILE_LIMIT:
        return []  # missing, not a file or too large: the builder says so
    found, _ = problems(data.decode("utf-8", "replace"), plan.args)
    field = f"{plan.where}.dockerfile"
    return [SpecIssue(plan.source, field=field, message=p, fix=PROBLEM_FIX) for p in found]


def read_dockerfile(path: Path) -> str:
    """The Dockerfile's text, read without following a link at its last component (the
    private copy's: ours), bounded."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = f.read(DOCKERFILE_LIMIT + 1)
    if len(data) > DOCKERFILE_LIMIT:
        raise ValueError(f"{path} is larger than {DOCKERFILE_LIMIT} bytes")
    return data.decode("utf-8", "replace")


CONTEXT_LIMIT_ENV = settings.BUILD_CONTEXT_LIMIT.name


class Budget:
    """What a context's copy may still take: bytes and time, both bounded."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.left = limit
        self.deadline = time.monotonic() + seconds

    def take(self, size: int, what: str) -> None:
        self.left -= size
        if self.left < 0:
            raise ValueError(
                f"the build context is larger than {CONTEXT_LIMIT_ENV} allows (at {what}): "
                "leave out what the build does not need (.dockerignore is read after the copy)"
            )
        if time.monotonic() > self.deadline:
            raise ValueError(f"copying the build context took too long (at {what})")


def private_context(
    context: Path, dockerfile: Path, into: Path, budget: Budget
) -> tuple[Path, Path]:
    """Copy the build context (resolved, checked: `context`) and its Dockerfile into the
    private folder `into`: reached without following links, every entry from its folder's
    descriptor, links copied as links, FIFOs, sockets and devices left out, within `budget`
    (a sparse file counts its whole size: the copy would hold it). Returns the copy of the
    context and of the Dockerfile (beside it, never inside: COPY cannot see it)."""
    top = _open_dir(context)
    copy = into / "context"
    try:
        copy.mkdir(mode=0o700)
        _copy_tree(top, copy, budget)
    finally:
        os.close(top)
    try:
        fd = open_exact(dockerfile)
    except PinRefused as exc:
        raise ValueError(str(exc)) from None
    try:
        target = into / "Dockerfile"
        _copy_file(fd, target, 0o600, budget)
    finally:
        os.close(fd)
    return copy, target


def _open_dir(path: Path) -> int:
    try:
        pinned = open_exact(path)
    except PinRefused as exc:
        raise ValueError(str(exc)) from None
    try:
        if not stat.S_ISDIR(os.fstat(pinned).st_mode):
            raise ValueError(f"{path} is not a folder")
        return os.open(f"/proc/self/fd/{pinned}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(pinned)


def _copy_tree(src: int, dest: Path, budget: Budget) -> None:
    for where, dirs, names, dfd in os.fwalk(".", dir_fd=src, follow_symlinks=False):
        base = dest / os.path.normpath(where)
        for name in dirs:
            budget.take(0, name)
            mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
            (base / name).mkdir(mode=stat.S_IMODE(mode) & 0o755 | 0o700)
        for name in names:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                budget.take(0, name)
                os.symlink(os.readlink(name, dir_fd=dfd), base / name)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    _copy_file(fd, base / name, stat.S_IMODE(st.st_mode) & 0o755 | 0o600, budget)
                finally:
                    os.close(fd)


def _copy_file(fd: int, target: Path, mode: int, budget: Budget) -> None:
    """The regular file `fd` holds (an O_PATH descriptor) copied to the new file `target`:
    its type is checked before it is opened, and it is opened without waiting (a FIFO put in
    its place could not hold us)."""
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        raise ValueError(f"{target.name} is not a regular file")
    budget.take(found.st_size, target.name)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    with os.fdopen(os.open(f"/proc/self/fd/{fd}", flags), "rb") as src:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(out, "wb") as dst:
            copied = 0
            while chunk := src.read(1 << 20):  # no more than it said it held
                copied += len(chunk)
                if copied > found.st_size:
                    raise ValueError(f"{target.name} grew while it was copied")
                dst.write(chunk)


def absent(images: list[str], exists: Callable[[str], bool]) -> list[str]:
    """The images of `images` the engine does not have."""
    return [i for i in dict.fromkeys(images) if not exists(i)]
