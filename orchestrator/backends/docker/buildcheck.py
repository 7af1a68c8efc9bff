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
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.backends.container.binds import PinRefused, open_exact
from orchestrator.backends.docker.buildplan import ImageBuild
from orchestrator.errors import SpecIssue
from orchestrator.paths import read_regular

_DIRECTIVE = re.compile(r"^#\s*escape\s*=\s*(\S)\s*$", re.IGNORECASE)
_VAR = re.compile(r"\$(?:\{([A-Za-z_]\w*)(?:(:[-+])([^}]*))?\}|([A-Za-z_]\w*))")
_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@)", re.IGNORECASE)
DOCKERFILE_LIMIT = 1 << 20


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, rest) of each instruction, continuation lines joined."""
    lines = text.splitlines()
    escape = "\\"
    for line in lines:  # parser directives come first, before any other line
        found = _DIRECTIVE.match(line.strip())
        if not found:
            if line.strip().startswith("#") and "=" in line:
                continue
            break
        escape = found.group(1)
    out: list[tuple[int, str, str]] = []
    start, parts = 0, list[str]()
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not parts:
            start = number
        if stripped.endswith(escape):
            parts.append(stripped[: -len(escape)])
            continue
        parts.append(stripped)
        joined = " ".join(p for p in parts if p)
        word, _, rest = joined.partition(" ")
        out.append((start, word.upper(), rest.strip()))
        parts = []
    if parts:
        joined = " ".join(p for p in parts if p)
        word, _, rest = joined.partition(" ")
        out.append((start, word.upper(), rest.strip()))
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
    return None if missing else out


def problems(text: str, args: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, images): what the Dockerfile does that no build may (each a sentence with
    its line), and the images it starts from (FROM, COPY --from), for the engine to have."""
    found: list[str] = []
    images: list[str] = []
    stages: set[str] = set()
    values: dict[str, str] = {}
    seen_from = False
    for line, word, rest in instructions(text):
        parts = _words(rest)
        if word == "ARG" and not seen_from:
            for part in parts:
                name, eq, default = part.partition("=")
                if name in args:
                    values[name] = args[name]
                elif eq:
                    values[name] = default.strip("\"'")
        elif word == "FROM":
            seen_from = True
            names = [p for p in parts if not p.startswith("--")]
            if not names:
                continue
            image = _substitute(names[0], values)
            if image is None:
                found.append(f"line {line}: FROM {names[0]} names a variable with no value")
            elif image.lower() != "scratch" and image not in stages:
                images.append(image)
            if len(names) >= 3 and names[1].lower() == "as":
                stages.add(names[2])
            stages.add(str(len(stages)))
        elif word == "ADD":
            for src in [p for p in parts if not p.startswith("--")][:-1]:
                if _REMOTE.match(src):
                    found.append(
                        f"line {line}: ADD {src} is fetched by the engine itself, past the "
                        "file's egress"
                    )
        elif word == "COPY":
            for part in parts:
                if part.startswith("--from="):
                    ref = part.removeprefix("--from=")
                    if ref not in stages and not ref.isdigit():
                        images.append(ref)
    return found, images


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


def private_context(context: Path, dockerfile: Path, into: Path) -> tuple[Path, Path]:
    """Copy the build context (resolved, checked: `context`) and its Dockerfile into the
    private folder `into`: reached without following links, every entry from its folder's
    descriptor, links copied as links, FIFOs, sockets and devices left out. Returns the copy
    of the context and of the Dockerfile (beside it, never inside: COPY cannot see it)."""
    top = _open_dir(context)
    copy = into / "context"
    try:
        copy.mkdir(mode=0o700)
        _copy_tree(top, copy)
    finally:
        os.close(top)
    try:
        fd = open_exact(dockerfile)
    except PinRefused as exc:
        raise ValueError(str(exc)) from None
    try:
        target = into / "Dockerfile"
        _copy_file(fd, target, 0o600)
    finally:
        os.close(fd)
    return copy, target


def _open_dir(path: Path) -> int:
    try:
        pinned = open_exact(path)
    except PinRefused as exc:
        raise ValueError(str(exc)) from None
    try:
        return os.open(f"/proc/self/fd/{pinned}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(pinned)


def _copy_tree(src: int, dest: Path) -> None:
    for where, dirs, names, dfd in os.fwalk(".", dir_fd=src, follow_symlinks=False):
        base = dest / os.path.normpath(where)
        for name in dirs:
            mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
            (base / name).mkdir(mode=stat.S_IMODE(mode) | 0o700)
        for name in names:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=dfd), base / name)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
                try:
                    _copy_file(fd, base / name, stat.S_IMODE(st.st_mode) & 0o755 | 0o600)
                finally:
                    os.close(fd)


def _copy_file(fd: int, target: Path, mode: int) -> None:
    """The regular file `fd` holds (O_PATH or not) copied to the new file `target`."""
    with os.fdopen(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC), "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise ValueError(f"{target.name} is not a regular file")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def absent(images: list[str], exists: Callable[[str], bool]) -> list[str]:
    """The images of `images` the engine does not have."""
    return [i for i in dict.fromkeys(images) if not exists(i)]
