"""What a build reads, as one hash: the Dockerfile's bytes, the build args, and the path,
type, mode, size, times and inode of every entry of the build context. A build is tagged by
it, so an edit to any of them makes a new tag (built: the engine's layer cache keeps that
cheap when nothing that matters changed) and an unchanged context reuses its image without
asking the engine.

The context may be hostile (the environment file's author chose it): the walk only
`lstat`s, never follows a symbolic link (its target's text is hashed, not what it points
to) and never opens anything but the Dockerfile. The Dockerfile is read where the builder
reads it (links followed: the policy has checked that place first), and only when `lstat`
says it is a regular file (no FIFO or device is ever opened). It is bounded: past
WALK_FILES entries or WALK_SECONDS it gives up (the fingerprint is then of the Dockerfile
and args only, and not complete) and the engine's layer cache decides instead (build.py
builds such a context once per process, and again when asked to). `.dockerignore` is not
read: a change to a file it ignores makes a new tag whose build the cache answers whole
(the same image)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from orchestrator import paths

WALK_FILES = 20_000
"""Most entries of a context hashed; a larger one is left to the engine's cache."""
WALK_SECONDS = 2.0
"""Longest a context walk may take."""
DOCKERFILE_LIMIT = 1 << 20
"""Most bytes of a Dockerfile hashed (one larger is hashed by its size and time only)."""
VERSION = b"orchestrator-build-fingerprint 2\n"


def read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` when it is a regular file (not a link, FIFO or device) of at
    most `limit` bytes; None otherwise. Never blocks on what it opens (see
    `paths.read_regular`)."""
    data = paths.read_regular(path, limit)
    return data if data is not None and len(data) <= limit else None


def _entry(rel: str, st: os.stat_result, link: str = "") -> bytes:
    """One entry's line: the change time and inode too, so that an edit which keeps the size
    and sets the old modification time back (`cp -p`, `tar -x`, `touch -r`) is still seen."""
    times = f"{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
    return f"{rel}\0{st.st_mode:o}\0{st.st_size}\0{times}\0{link}\n".encode(
        "utf-8", "surrogateescape"
    )


def listed(folder: Path, left: list[int], deadline: float) -> list[os.DirEntry[str]] | None:
    """The entries of `folder` sorted by name, each counted off `left[0]` as it is listed (a
    huge folder is never held whole); None once that count or the `deadline` is passed."""
    entries = []
    with os.scandir(folder) as found:
        for entry in found:
            left[0] -= 1
            if left[0] < 0 or time.monotonic() > deadline:
                return None
            entries.append(entry)
    return sorted(entries, key=lambda e: e.name)


def walk_context(
    context: Path, *, files: int | None = None, seconds: float | None = None
) -> bytes | None:
    """The hash of the context's entries (sorted, relative paths), or None when it is not
    a folder we may read or is larger than `files` entries or `seconds` of walking (by
    default WALK_FILES and WALK_SECONDS)."""
    files = WALK_FILES if files is None else files
    seconds = WALK_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds
    digest = hashlib.sha256()
    try:
        if not stat.S_ISDIR(os.lstat(context).st_mode):
            return None
    except OSError:
        return None
    left = [files]
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            entries = listed(context / rel_dir if rel_dir else context, left, deadline)
        except OSError as exc:  # unreadable: the engine will say so; its state is hashed
            digest.update(f"{rel_dir}\0unreadable {exc.errno}\n".encode("utf-8", "surrogateescape"))
            continue
        if entries is None:
            return None
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
                link = os.readlink(entry.path) if stat.S_ISLNK(st.st_mode) else ""
            except OSError as exc:  # removed meanwhile
                digest.update(f"{rel}\0gone {exc.errno}\n".encode("utf-8", "surrogateescape"))
                continue
            digest.update(_entry(rel, st, link))
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        pending.extend(reversed(subdirs))  # depth first, in name order
    return digest.digest()


def fingerprint(
    context: Path,
    dockerfile: str | None,
    args: Mapping[str, str],
    *,
    files: int | None = None,
    seconds: float | None = None,
) -> tuple[str, bool]:
    """(hex digest, complete). Complete: of the Dockerfile, the args and the whole context.
    Not complete (the context is too large, or not a folder we can read): of the Dockerfile
    and the args only, so that an edit of the context is not seen here."""
    digest = hashlib.sha256(VERSION)
    name = dockerfile or "Dockerfile"
    digest.update(json.dumps([str(context), name, sorted(args.items())]).encode())
    path = Path(os.path.realpath(context / name))  # what the builder reads, links followed
    data = read_regular(path, DOCKERFILE_LIMIT)
    if data is not None:
        digest.update(b"dockerfile\0" + hashlib.sha256(data).digest())
    else:  # too large, missing or not a regular file: its metadata, never its bytes
        try:
            digest.update(_entry(name, os.lstat(path)))
        except OSError as exc:
            digest.update(f"no dockerfile {exc.errno}\n".encode())
    tree = walk_context(context, files=files, seconds=seconds)
    if tree is None:
        return digest.hexdigest(), False
    digest.update(b"context\0" + tree)
    return digest.hexdigest(), True


LOCK_FILES = WALK_FILES
LOCK_BYTES = 512 * 1024 * 1024
"""Most bytes of a context a lock hashes (every file read whole)."""
LOCK_SECONDS = 30.0
CHUNK = 1 << 20


def content_digest(
    context: Path, dockerfile: str | None, args: Mapping[str, str], *, skip: frozenset[str]
) -> str:
    """What a build is made of, as a lock records it (backends/docker/lockfile.py): the
    Dockerfile's bytes, the args, and each entry of the context by its relative path, type,
    permission bits and (a file) the hash of its bytes (a link: its text). Unlike
    `fingerprint`, nothing of where it is or when it was written: the same tree checked out
    anywhere gives the same digest. `skip`: names at the context's top left out (the lock
    itself, written after). ValueError when it is larger than LOCK_FILES entries or
    LOCK_BYTES, or takes longer than LOCK_SECONDS: too large to lock. Links are never
    followed, and nothing but a regular file is opened."""
    digest = hashlib.sha256(b"orchestrator-lock-inputs 1\n")
    name = dockerfile or "Dockerfile"
    digest.update(json.dumps([name, sorted(args.items())]).encode())
    data = read_regular(Path(os.path.realpath(context / name)), DOCKERFILE_LIMIT)
    digest.update(b"dockerfile\0" + (hashlib.sha256(data).digest() if data else b"-"))
    budget = [LOCK_FILES, LOCK_BYTES]
    deadline = time.monotonic() + LOCK_SECONDS
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        entries = listed(context / rel_dir if rel_dir else context, budget, deadline)
        if entries is None:
            raise ValueError(f"the build context {context} is too large to lock")
        subdirs = []
        for entry in entries:
            if not rel_dir and entry.name in skip:
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            kind = stat.S_IFMT(st.st_mode)
            line = f"{rel}\0{kind:o}\0{stat.S_IMODE(st.st_mode):o}\0"
            if stat.S_ISLNK(st.st_mode):
                line += os.readlink(entry.path)
            elif stat.S_ISREG(st.st_mode):
                line += _file_hash(Path(entry.path), budget, deadline)
            elif stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
            digest.update(line.encode("utf-8", "surrogateescape") + b"\n")
        pending.extend(reversed(subdirs))
    return digest.hexdigest()


def _file_hash(path: Path, budget: list[int], deadline: float) -> str:
    fd = paths.open_regular(path)
    if fd < 0:
        return "-"  # (swapped for another kind meanwhile: not read)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, CHUNK):
            budget[1] -= len(chunk)
            if budget[1] < 0 or time.monotonic() > deadline:
                raise ValueError(f"the build context of {path} is too large to lock")
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()
