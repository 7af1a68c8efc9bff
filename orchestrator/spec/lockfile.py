"""A lock file: what an environment file resolved to when it was locked, so that it runs the
same sandbox next month. `FILE.lock` beside the file (`env.yaml.lock`, `compose.yaml.lock`),
plain YAML for a diff, written by `orchestrator lock FILE`:

- `images`: each image the file names (by the field that names it: `image`,
  `services.db.image`) and the image id the engine had for it. A run uses that id, whatever
  the name names by then.
- `builds`: each build (`build`, `services.web.build`) with the hash of its inputs (its
  Dockerfile, args and context by content: backends/docker/fingerprint.py) and the id of each
  image it starts from. A build whose inputs or bases changed is refused.
- `gateway`: the egress gateway's image as it was (reported when it differs, never taken
  from here: the gateway is this program's, not the file's), and the version and templates
  of orchestrator that locked it (reported when they differ).

The lock is as trusted as the file beside it: it can pin only what the file names, by id,
which the file could have named itself; the backend checks it against the file and the
engine before anything starts (backends/docker/lockfile.py). Read like a file: bounded,
parsed by the same reader, every problem a SpecError at its line with the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import SpecError, SpecIssue
from orchestrator.paths import read_regular
from orchestrator.spec.yamltext import parse_yaml, plain_data

SUFFIX = ".lock"
LIMIT = 1024 * 1024
"""Bytes a lock file may hold (one line per image and build: a few hundred each)."""
IMAGE_ID = r"^sha256:[0-9a-f]{64}$"
UPDATE = "run `orchestrator lock --update {file}` to lock what the file resolves to now"


class LockedImage(BaseModel):
    """An image the file names, and the id it was locked to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(min_length=1, max_length=512)
    """The name as the file gives it."""
    id: str = Field(pattern=IMAGE_ID)
    """The engine's id of that image when it was locked (what a run uses)."""


class LockedBuild(BaseModel):
    """A build of the file, and what it was made of."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The hash of what it is built from: its Dockerfile, args, and every entry of its
    context by path, type, permissions and content (not where or when it was written: the
    same tree checked out anywhere gives the same hash)."""
    bases: dict[str, str] = Field(default_factory=dict, max_length=64)
    """Each image it starts from (FROM, COPY --from), and its id when locked."""


class Lock(BaseModel):
    """A lock file (see the module)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    file: str = Field(max_length=4096)
    """The file it locks (its name, beside the lock)."""
    orchestrator: str = Field(max_length=64)
    """The version of orchestrator that locked it."""
    templates: str = Field(max_length=64)
    """The hash of the templates it compiled through."""
    images: dict[str, LockedImage] = Field(default_factory=dict, max_length=256)
    """By the field that names each image (`image`, `services.NAME.image`)."""
    builds: dict[str, LockedBuild] = Field(default_factory=dict, max_length=256)
    """By the field of each build (`build`, `services.NAME.build`)."""
    gateway: LockedImage | None = None
    """The egress gateway's image, when the file has one (reported, never used)."""


def lock_path(source: str) -> Path | None:
    """Where the lock of the file `source` is: beside it, as its path was given (beside a
    link, not its target: a lock is never written into the folder a link points to); None
    for a file of no path."""
    if not source or source.startswith("<"):
        return None
    path = Path(source)
    return path.with_name(path.name + SUFFIX)


def read_lock(path: Path) -> Lock | None:
    """The lock at `path`; None when there is none. SpecError (at its line) for one that is
    not a lock: too large, not YAML, or any field out of its bounds."""
    if not path.exists() and not path.is_symlink():
        return None
    raw = read_regular(path, LIMIT)
    source = str(path)
    if raw is None or len(raw) > LIMIT:
        raise SpecError(
            SpecIssue(
                source,
                field="",
                message=f"not a lock file: not a regular file, or over {LIMIT} bytes",
                fix="remove it, then `orchestrator lock FILE` makes it again",
            )
        )
    root = parse_yaml(raw.decode("utf-8", "replace"), source)
    data = plain_data(root, source) if isinstance(root, dict) else root
    try:
        return Lock.model_validate(data)
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            issues.append(
                SpecIssue(
                    source,
                    field=field,
                    line=_line_of(root, err["loc"]),
                    message=err["msg"],
                    fix="a lock is written by `orchestrator lock FILE`: remove this one and "
                    "make it again",
                )
            )
        raise SpecError(issues) from None


def _line_of(root: object, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the key at `loc` in ruamel's nodes (None where not found)."""
    node, line = root, None
    for key in loc:
        lc = getattr(node, "lc", None)
        if lc is None or not isinstance(node, dict) or key not in node:
            break
        try:
            line = lc.key(key)[0] + 1
        except (KeyError, TypeError):
            break
        node = node[key]
    return line


def lock_text(lock: Lock) -> str:
    """The lock as YAML: one key a line, sorted, for a diff a reviewer reads."""
    lines = [
        f"# The lock of {lock.file}: what it resolved to. Made by `orchestrator lock`; a change",
        "# to the file or its images is refused until `orchestrator lock --update` makes it again.",
        f"version: {lock.version}",
        f"file: {_q(lock.file)}",
        f"orchestrator: {_q(lock.orchestrator)}",
        f"templates: {_q(lock.templates)}",
    ]
    lines.append("images:" + ("" if lock.images else " {}"))
    for field, image in sorted(lock.images.items()):
        lines += [f"  {_q(field)}:", f"    image: {_q(image.image)}", f"    id: {image.id}"]
    lines.append("builds:" + ("" if lock.builds else " {}"))
    for field, build in sorted(lock.builds.items()):
        lines += [f"  {_q(field)}:", f"    inputs: {build.inputs}"]
        lines.append("    bases:" + ("" if build.bases else " {}"))
        lines += [f"      {_q(name)}: {ident}" for name, ident in sorted(build.bases.items())]
    if lock.gateway is not None:
        lines += ["gateway:", f"  image: {_q(lock.gateway.image)}", f"  id: {lock.gateway.id}"]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    """`text` as a YAML scalar: double-quoted (JSON's escapes are YAML's), so that nothing in
    it is read as another type or as YAML."""
    return json.dumps(text)
