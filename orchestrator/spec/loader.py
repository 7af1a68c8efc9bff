"""Load environment files: the text read and parsed with line numbers (`spec.yamltext`),
version dispatch, legacy and Compose files mapped to v1, and pydantic validation turned into
errors that name file:line:column, the field and the fix."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from orchestrator._resources import templates_version
from orchestrator.errors import PolicyError, SpecError, SpecIssue
from orchestrator.spec import compose
from orchestrator.spec.hostpaths import UNREADABLE_FIX, HostPath, look_up
from orchestrator.spec.issues import Found, Locator, Position, error, position
from orchestrator.spec.migrate import Loc, looks_legacy, migrate_legacy
from orchestrator.spec.models import STATIC_PLACEHOLDER, SUPPORTED_VERSIONS, EnvironmentV1
from orchestrator.spec.policy import Policy
from orchestrator.spec.yamltext import parse_yaml, plain_data, read_spec_text

BackendNames = Callable[[], Collection[str]]
"""Where the loader learns which `backend:` names exist (the registry's `runtime_names`):
spec/ knows no backend of its own."""


@dataclass(frozen=True)
class Environment:
    """A validated environment file and where it came from."""

    spec: EnvironmentV1
    source: str
    """Path of the file (or "<string>")."""
    base_dir: Path
    """The file's own folder (symlinks resolved): every relative path in the file (static
    assets, mounts, build contexts) resolves against it, whatever the working folder or the
    workspace."""
    notices: tuple[str, ...] = field(default=())
    """Things worth telling the user (legacy format migrated, settings adjusted)."""
    positions: tuple[tuple[str, Position], ...] = field(default=(), compare=False, repr=False)
    """Line and column of each top-level field of the file, for errors found after loading
    (an unknown backend, a backend's own rules)."""

    locator: Callable[[list[SpecIssue]], list[SpecIssue]] = field(
        default=list, compare=False, repr=False
    )
    """Places issues found later by field alone at their line and column in the file."""
    compose_main: str | None = None
    """A Compose file's: the service that became the main sandbox (Inspect's name for it)."""
    fates: tuple[compose.Fate, ...] = field(default=(), compare=False, repr=False)
    """A Compose file's: what became of each of its keys (mapped, ignored, refused)."""
    variables: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """A Compose file's: the variables it reads (${NAME})."""

    def located(self, exc: SpecError) -> SpecError:
        """`exc` (raised by a later check of this environment: a backend's, the policy's)
        with each issue at its line and column in the file, sorted by position."""
        issues = self.locator(exc.issues)
        if issues == exc.issues:
            return exc
        issues.sort(key=lambda i: (i.line is not None, i.line or 0, i.column or 0))
        return type(exc)(issues)

    def where(self, key: str) -> Position:
        """1-based line and column of top-level field `key` in the file ((None, None): absent)."""
        return dict(self.positions).get(key, (None, None))

    def issue_at(self, key: str, *, message: str, fix: str) -> SpecIssue:
        """A problem with top-level field `key`, placed at its line and column in the file
        (for a check made after loading: the backend's name, the policy's word on it)."""
        line, column = self.where(key)
        return SpecIssue(self.source, line=line, column=column, field=key, message=message, fix=fix)

    def host_path(self, written: str) -> HostPath:
        """A host path written in the file (a mount source), by the one rule: `~` expanded,
        a relative one against the file's own folder (`base_dir`), then resolved through
        `..` and symlinks. Never raises (see `look_up`)."""
        return look_up(Path(written), self.base_dir, home=True)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def digest(self) -> str:
        """Hash of the normalized spec and the templates' content (short, stable)."""

        payload = json.dumps(
            {"spec": self.spec.model_dump(mode="json"), "templates": templates_version()},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_backend(env: Environment, known: Collection[str]) -> None:
    """Raise SpecError, at the file's `backend` field, unless its backend is one of `known`."""
    if env.backend in known:
        return
    names = sorted(known)
    guess = difflib.get_close_matches(env.backend, names, n=1)
    raise SpecError(
        env.issue_at(
            "backend",
            message=f"unknown backend {env.backend!r}",
            fix=(f"did you mean '{guess[0]}'? " if guess else "")
            + f"registered backends: {', '.join(names)} (a plugin adds one through the "
            "`orchestrator.runtimes` entry-point group, or `register_runtime`)",
        )
    )


def require_main_image(env: Environment) -> None:
    """Raise SpecError unless the file gives the main sandbox an `image` or a `build` (a
    backend whose sandbox runs an image calls this from its `check`)."""
    if env.spec.image is None and env.spec.build is None:
        raise SpecError(
            SpecIssue(
                env.source,
                field="image",
                message=f"the {env.backend} backend needs exactly one of `image` or `build`",
                fix="add `image: <name>` (e.g. python:3.12-slim) or a `build:` section",
            )
        )


Check = Callable[[Environment], object]
"""A later stage of validation (see `load_environment_text`)."""


def host_variables() -> Callable[[str], str | None]:
    """The host's variables as a Compose file may read them: only those the caller's policy
    passes (Policy.from_env: ORCHESTRATOR_ALLOW_ENV, "*": any)."""
    policy = Policy.from_env()
    return lambda name: os.environ.get(name) if policy.allows_env(name) else None


def _kind(value: Any) -> str:
    """What a YAML value is, in the file's words (not the parser's class names)."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return f"a {type(value).__name__}"


def load_environment_text(
    text: str,
    *,
    source: str = "<string>",
    base_dir: Path | str | None = None,
    backends: BackendNames | None = None,
    check: Check | None = None,
    variables: Mapping[str, str] | None = None,
) -> Environment:
    """Parse and validate environment-file text in one pass: raise one SpecError listing
    every problem found (the schema's, the asset paths' and placeholders', the backend
    name's, and with `check` the backend's and the policy's), each at file:line:column,
    sorted by position (at most MAX_ISSUES, then how many more). What the schema refuses is
    taken out and the rest still checked. `backends`: the registered backend names,
    checked against the file's `backend` (None: any well-formed name passes here, and the
    registry checks it when the environment is spawned). `check`: a later stage run on the
    environment (or on the valid rest of an invalid one) that raises SpecError listing what
    it refuses, such as `Runtime.check` under the caller's policy. A Compose file is read as
    one (spec/compose/), its values interpolated from `variables` first."""
    root = parse_yaml(text, source)
    if not isinstance(root, dict):
        got = "an empty file" if root is None else _kind(root)
        raise SpecError(
            SpecIssue(
                source,
                line=1,
                column=1,
                field="",
                message=f"expected a mapping at the top, got {got}",
                fix="start from `orchestrator schema` or a file in environments/",
            )
        )
    data = plain_data(root, source)
    notices: list[str] = []
    where: dict[Loc, Loc] | None = None
    if looks_legacy(data):
        data, where, notices = migrate_legacy(data)
        notices.insert(
            0,
            f"{source}: legacy format (no `version`) migrated to v1; "
            f"`orchestrator migrate {source}` prints the v1 file",
        )
    issues: list[SpecIssue] = []
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    mapped: compose.ComposeMapping | None = None
    refusals: list[SpecIssue] = []  # the Compose keys refused as they are mapped
    if compose.looks_compose(data):
        mapped = compose.from_compose(
            data,
            source=source,
            base_dir=base.resolve(),
            variables=variables,
            host=host_variables(),
        )
        data, where, notices = (
            mapped.data,
            compose.ComposeWhere(mapped.where),
            mapped.notices(source),
        )
        refusals = [compose.compose_issue(source, root, *r) for r in mapped.refused]
        if mapped.empty:
            raise error(refusals, policy=False)
    version = data.get("version")
    if version is None:  # checked as the current version all the same
        issues.append(
            SpecIssue(
                source,
                line=1,
                column=1,
                field="version",
                message="missing schema version",
                fix="add `version: 1` as the first line",
            )
        )
        data = {"version": SUPPORTED_VERSIONS[-1], **data}
    elif isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        line, col = position(root, ("version",))
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise SpecError(  # the rest means nothing under an unknown schema
            SpecIssue(
                source,
                line=line,
                column=col,
                field="version",
                message=f"unknown schema version {version!r}",
                fix=f"supported versions: {supported}",
            )
        )
    found = Found(source, root, where)
    spec, partial = found.validate(data)
    if spec is None:
        raise error([*issues, *refusals, *found.issues], policy=False)
    positions = tuple((key, _top_position(root, key, where)) for key in EnvironmentV1.model_fields)
    env = Environment(
        spec=spec,
        source=source,
        base_dir=base.resolve(),
        notices=tuple(notices),
        positions=tuple((k, p) for k, p in positions if p != (None, None)),
        locator=Locator(source, root, found.data, where, partial),
        compose_main=mapped.main if mapped is not None else None,
        fates=tuple(mapped.fates) if mapped is not None else (),
        variables=frozenset(mapped.asked) if mapped is not None else frozenset(),
    )
    stages: list[Callable[[Environment], object]] = [_check_assets]
    if backends is not None:
        stages.append(lambda e: check_backend(e, backends()))
    if check is not None:
        stages.append(check)
    policy = not issues and not found.issues  # a refused Compose key is the policy's word
    for stage in stages:
        try:
            stage(env)
        except SpecError as exc:
            found.issues += env.locator(exc.issues)
            policy = policy and isinstance(exc, PolicyError)
        except Exception:
            if not found.issues:
                raise
            # the valid rest of an invalid file tripped a later stage: the schema's errors
            # (already found) come first; fixing them lets the stage run
    if issues or refusals or found.issues:
        raise error([*issues, *refusals, *found.issues], policy=policy)
    return env


def _top_position(root: Any, key: str, where: dict[Loc, Loc] | None) -> Position:
    loc: Loc = (key,)
    if where is not None:  # migrated legacy file: the legacy key's position
        loc = where.get(loc, ())
    return position(root, loc) if loc else (None, None)


def _check_assets(env: Environment) -> None:
    """Asset paths exist, and every `{{static:NAME}}` of the file's commands names one."""
    issues = []
    names = {a.name for a in env.spec.static_assets}
    for loc, command in env.spec.file_commands():
        for match in STATIC_PLACEHOLDER.finditer(command):
            if match.group(1) not in names:
                known = ", ".join(sorted(names)) or "none"
                issues.append(
                    SpecIssue(
                        env.source,
                        field=".".join(map(str, loc)),
                        message=f"{match.group(0)} names no static asset (known: {known})",
                        fix="add it under static_assets, or fix the name",
                    )
                )
    for i, asset in enumerate(env.spec.static_assets):
        found = look_up(Path(asset.path), env.base_dir)
        if found.error is None and found.exists:
            continue
        if found.error is not None:
            message, fix = (
                f"cannot look at asset path {asset.path!r}: {found.error}",
                UNREADABLE_FIX,
            )
        else:
            message = f"asset path does not exist: {found.real}"
            fix = "paths are relative to the environment file's folder"
        issues.append(
            SpecIssue(env.source, field=f"static_assets.{i}.path", message=message, fix=fix)
        )
    if issues:
        raise SpecError(issues)


def load_environment(
    path: str | Path,
    *,
    backends: BackendNames | None = None,
    check: Check | None = None,
    variables: Mapping[str, str] | None = None,
) -> Environment:
    """Read, migrate if needed, and validate an environment file (`backends`, `check`,
    `variables`: as for `load_environment_text`). It may be a v1 file, a legacy one, a
    Compose file, or a bare Dockerfile (Dockerfile, NAME.Dockerfile, Dockerfile.NAME), which
    becomes one sandbox built from it with no network, as Inspect's docker sandbox makes it."""
    p = Path(path)
    text, folder = read_spec_text(p)
    return load_environment_text(
        text, source=str(p), base_dir=folder, backends=backends, check=check, variables=variables
    )


def migrated_yaml(path: str | Path, *, check: Check | None = None) -> str:
    """The v1 YAML equivalent of a legacy, v1 or Compose file, for `orchestrator migrate`.
    For a Compose file (or a Dockerfile), comments first say what was ignored and what is
    refused (by the mapping, the schema, or with `check` the backend and policy), each at its
    line; the mapping follows even when something is refused."""
    p = Path(path)
    text, folder = read_spec_text(p)
    root = parse_yaml(text, str(p))
    data = plain_data(root, str(p)) if isinstance(root, dict) else None
    if data is None or not compose.looks_compose(data):
        return _dump(load_environment(p).spec.model_dump(mode="json", exclude_defaults=True))
    mapped = compose.from_compose(data, source=str(p), base_dir=folder, host=host_variables())
    lines = [
        f"# made from {p.name} by `orchestrator migrate`; its main sandbox is the Compose "
        f"service {mapped.main!r}"
    ]
    ignored = [f for f in mapped.fates if f.status == "ignored"]
    if ignored:
        lines.append("# ignored (no effect here):")
        lines += [f"#   line {_line(root, f.loc)}: {f.text('').lstrip(': ')}" for f in ignored]
    try:
        load_environment(p, check=check)
    except SpecError as exc:
        lines.append("# refused (remove these, or ask the caller's policy to allow them):")
        lines += [
            f"#   line {i.line or '?'}: {i.field}: {i.message} (fix: {i.fix})" for i in exc.issues
        ]
    return "\n".join(lines) + "\n" + _dump(mapped.data)


def _line(root: Any, loc: Loc) -> str:
    line, _ = position(root, loc, key=True)
    return str(line or "?")


def _dump(data: dict[str, Any]) -> str:
    import io

    data = {"version": 1, **{k: v for k, v in data.items() if k != "version"}}
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    yaml.dump(data, out)
    return out.getvalue()
