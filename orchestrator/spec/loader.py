"""Load environment files: YAML with line numbers, version dispatch, legacy migration, and
pydantic validation turned into errors that name file:line:column, the field and the fix."""

from __future__ import annotations

import difflib
import hashlib
import json
import types
import typing
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from orchestrator import settings
from orchestrator._resources import templates_version
from orchestrator.errors import OrchestratorError, SpecError, SpecIssue
from orchestrator.spec.migrate import Loc, looks_legacy, migrate_legacy
from orchestrator.spec.models import STATIC_PLACEHOLDER, SUPPORTED_VERSIONS, EnvironmentV1
from orchestrator.spec.policy import UNREADABLE_FIX, look_up

MAX_BYTES_ENV = "ORCHESTRATOR_MAX_SPEC_BYTES"
MAX_BYTES = 128 * 1024
"""Largest environment file we parse (real ones are a few KiB; YAML parsing costs ~6 s/MiB)."""
MAX_VALUES = 50_000
"""Most values (mapping entries, list items, scalars) a file may expand to through aliases."""
MAX_TEXT = 8 * 1024 * 1024
"""Most characters of text a file may expand to through aliases."""
BackendNames = Callable[[], Collection[str]]
"""Where the loader learns which `backend:` names exist (the registry's `runtime_names`):
spec/ knows no backend of its own."""
Position = tuple[int | None, int | None]


@dataclass(frozen=True)
class Environment:
    """A validated environment file and where it came from."""

    spec: EnvironmentV1
    source: str
    """Path of the file (or "<string>")."""
    base_dir: Path
    """Folder that relative asset paths and build contexts resolve against."""
    notices: tuple[str, ...] = field(default=())
    """Things worth telling the user (legacy format migrated, settings adjusted)."""
    positions: tuple[tuple[str, Position], ...] = field(default=(), compare=False, repr=False)
    """Line and column of each top-level field of the file, for errors found after loading
    (an unknown backend, a backend's own rules)."""

    def where(self, key: str) -> Position:
        """1-based line and column of top-level field `key` in the file ((None, None): absent)."""
        return dict(self.positions).get(key, (None, None))

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


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    return yaml


class _Budget:
    """Counts what `_plain` expands, so an alias bomb stops early instead of eating memory."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.values = 0
        self.text = 0

    def spend(self, node: Any) -> None:
        self.values += 1
        if isinstance(node, str):
            self.text += len(node)
        if self.values > MAX_VALUES or self.text > MAX_TEXT:
            raise SpecError(
                SpecIssue(
                    self.source,
                    field="",
                    message=f"the file expands to more than {MAX_VALUES} values or {MAX_TEXT} "
                    "characters (YAML aliases repeating each other?)",
                    fix="write the values out, or use fewer nested aliases",
                )
            )


def _plain(node: Any, budget: _Budget) -> Any:
    """ruamel's round-trip containers and scalars as plain Python values."""
    budget.spend(node)
    if isinstance(node, dict):
        return {
            (_plain(k, budget) if not isinstance(k, str) else str(k)): _plain(v, budget)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_plain(v, budget) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    for base in (str, int, float):
        if isinstance(node, base):
            return base(node)
    return node


def _position(root: Any, loc: Loc, *, key: bool = False) -> tuple[int | None, int | None]:
    """1-based line and column of the deepest node of `loc` found in the YAML tree
    (of the key itself with `key=True`, e.g. for an unknown key)."""
    node, line, col = root, None, None
    for step in loc:
        if isinstance(node, CommentedMap) and step in node:
            k_line, k_col, v_line, v_col = node.lc.data[step]
            line, col = k_line + 1, k_col + 1
            child = node[step]
            leaf = not isinstance(child, CommentedMap | CommentedSeq)
            if leaf and not key and v_line is not None:
                line, col = v_line + 1, v_col + 1
            node = child
        elif isinstance(node, CommentedSeq) and isinstance(step, int) and step < len(node):
            i_line, i_col = node.lc.item(step)
            line, col = i_line + 1, i_col + 1
            node = node[step]
        else:
            break
    return line, col


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model that the mapping at `loc` is validated against (for 'did you mean')."""
    model: type[BaseModel] | None = EnvironmentV1
    annotation: Any = None
    for step in loc:
        if isinstance(step, int) or model is None:
            continue
        info = model.model_fields.get(str(step))
        if info is None:
            # a dict key such as a service name: stay on the dict's value type
            if annotation is not None and typing.get_origin(annotation) is dict:
                found = list(_models_in(typing.get_args(annotation)[1]))
                model = found[0] if found else None
            continue
        annotation = info.annotation
        found = list(_models_in(annotation))
        model = found[0] if found else None
        if typing.get_origin(annotation) in (dict, types.UnionType) and not found:
            model = None
    return model


def _fix_for(err: Any, loc: Loc) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = sorted(model.model_fields) if model else []
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else "remove it. "
        return hint + (f"Allowed keys here: {', '.join(allowed)}" if allowed else "")
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"use one of {expected}"
    if kind == "missing":
        return f"add `{loc[-1]}:` to this mapping" if loc else "add the missing field"
    if kind == "string_pattern_mismatch":
        return f"the value must match {err.get('ctx', {}).get('pattern')}"
    if kind == "string_type":
        return "write it as text (quote it in YAML)"
    return ""


def _clean_loc(loc: tuple[Any, ...], data: Any) -> Loc:
    """Drop pydantic's union-branch tags ('list[str]', 'function-after[...]') from a loc."""
    out: list[str | int] = []
    node = data
    for step in loc:
        if (isinstance(node, dict) and step in node) or (
            isinstance(node, list) and isinstance(step, int) and step < len(node)
        ):
            out.append(step)
            node = node[step]
        elif (isinstance(node, dict | list) and not out) or isinstance(step, int):
            out.append(step)
            node = None
        elif isinstance(node, dict):
            out.append(step)  # a missing or extra key: keep it, it names the field
            node = None
    return tuple(out)


def _issues_from(
    exc: ValidationError, source: str, root: Any, data: Any, where: dict[Loc, Loc] | None
) -> list[SpecIssue]:
    issues = []
    for err in exc.errors(include_url=False):
        loc = _clean_loc(err["loc"], data)
        yaml_loc = loc
        if where is not None:  # migrated legacy file: point at the legacy key
            yaml_loc = next(
                (where[p] for n in range(len(loc), 0, -1) if (p := loc[:n]) in where), ()
            )
        line, col = _position(root, yaml_loc, key=err["type"] == "extra_forbidden")
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        elif (
            "input" in err
            and err["type"] not in ("missing",)
            and not isinstance(err["input"], dict | list)
        ):
            message += f" (got {err['input']!r})"
        field_path = ".".join(str(s) for s in loc)
        issues.append(
            SpecIssue(
                source,
                line=line,
                column=col,
                field=field_path,
                message=message,
                fix=_fix_for(err, loc),
            )
        )
    return sorted(issues, key=lambda i: (i.line or 0, i.column or 0))


def max_spec_bytes() -> int:
    return settings.whole(MAX_BYTES_ENV, MAX_BYTES)


def parse_yaml(text: str, source: str) -> Any:
    limit = max_spec_bytes()
    if len(text) > limit:
        raise SpecError(
            SpecIssue(
                source,
                field="",
                message=f"the file is over the limit of {limit} characters",
                fix=f"environment files are small; split data out into static assets "
                f"(or raise {MAX_BYTES_ENV})",
            )
        )
    try:
        return _yaml().load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p) or "invalid YAML"
        fix = "fix the YAML syntax at that position"
        if "duplicate key" in problem:
            fix = "each key may appear once per mapping; remove one of them"
        raise SpecError(
            SpecIssue(
                source,
                line=line,
                column=col,
                field="",
                message=f"malformed YAML: {problem}",
                fix=fix,
            )
        ) from exc
    except Exception as exc:  # YAMLError, RecursionError, and the parser's own slips
        # ('-_' raises IndexError inside it): bad input is a spec error, never a traceback
        raise SpecError(
            SpecIssue(
                source,
                field="",
                message=f"malformed YAML: {exc}",
                fix="fix the YAML syntax",
            )
        ) from exc


def check_backend(env: Environment, known: Collection[str]) -> None:
    """Raise SpecError, at the file's `backend` field, unless its backend is one of `known`."""
    if env.backend in known:
        return
    names = sorted(known)
    guess = difflib.get_close_matches(env.backend, names, n=1)
    line, col = env.where("backend")
    raise SpecError(
        SpecIssue(
            env.source,
            line=line,
            column=col,
            field="backend",
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


def load_environment_text(
    text: str,
    *,
    source: str = "<string>",
    base_dir: Path | str | None = None,
    backends: BackendNames | None = None,
) -> Environment:
    """Parse and validate environment-file text. `backends`: the registered backend names,
    checked against the file's `backend` (None: any well-formed name passes here, and the
    registry checks it when the environment is spawned)."""
    root = parse_yaml(text, source)
    if not isinstance(root, dict):
        got = "an empty file" if root is None else f"a {type(root).__name__}"
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
    data = _plain(root, _Budget(source))
    notices: list[str] = []
    where: dict[Loc, Loc] | None = None
    if looks_legacy(data):
        data, where, notices = migrate_legacy(data)
        notices.insert(
            0,
            f"{source}: legacy format (no `version`) migrated to v1; "
            f"`orchestrator migrate {source}` prints the v1 file",
        )
    version = data.get("version")
    if version is None:
        raise SpecError(
            SpecIssue(
                source,
                line=1,
                column=1,
                field="version",
                message="missing schema version",
                fix="add `version: 1` as the first line",
            )
        )
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        line, col = _position(root, ("version",))
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise SpecError(
            SpecIssue(
                source,
                line=line,
                column=col,
                field="version",
                message=f"unknown schema version {version!r}",
                fix=f"supported versions: {supported}",
            )
        )
    try:
        spec = EnvironmentV1.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_issues_from(exc, source, root, data, where)) from None
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    positions = tuple((key, _top_position(root, key, where)) for key in EnvironmentV1.model_fields)
    env = Environment(
        spec=spec,
        source=source,
        base_dir=base.resolve(),
        notices=tuple(notices),
        positions=tuple((k, p) for k, p in positions if p != (None, None)),
    )
    if backends is not None:
        check_backend(env, backends())
    _check_assets(env, root)
    return env


def _top_position(root: Any, key: str, where: dict[Loc, Loc] | None) -> Position:
    loc: Loc = (key,)
    if where is not None:  # migrated legacy file: the legacy key's position
        loc = where.get(loc, ())
    return _position(root, loc) if loc else (None, None)


def _check_assets(env: Environment, root: Any) -> None:
    """Asset paths exist, and every `{{static:NAME}}` of the file's commands names one."""
    issues = []
    names = {a.name for a in env.spec.static_assets}
    for loc, command in env.spec.file_commands():
        for match in STATIC_PLACEHOLDER.finditer(command):
            if match.group(1) not in names:
                line, col = _position(root, loc)
                known = ", ".join(sorted(names)) or "none"
                issues.append(
                    SpecIssue(
                        env.source,
                        line=line,
                        column=col,
                        field=".".join(map(str, loc)),
                        message=f"{match.group(0)} names no static asset (known: {known})",
                        fix="add it under static_assets, or fix the name",
                    )
                )
    for i, asset in enumerate(env.spec.static_assets):
        found = look_up(Path(asset.path), env.base_dir)
        if found.error is None and found.exists:
            continue
        line, col = _position(root, ("static_assets", i, "path"))
        if found.error is not None:
            message, fix = (
                f"cannot look at asset path {asset.path!r}: {found.error}",
                UNREADABLE_FIX,
            )
        else:
            message = f"asset path does not exist: {found.real}"
            fix = "paths are relative to the environment file's folder"
        issues.append(
            SpecIssue(
                env.source,
                line=line,
                column=col,
                field=f"static_assets.{i}.path",
                message=message,
                fix=fix,
            )
        )
    if issues:
        raise SpecError(issues)


def load_environment(path: str | Path, *, backends: BackendNames | None = None) -> Environment:
    """Read, migrate if needed, and validate an environment file (`backends`: as for
    `load_environment_text`)."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO would block open()
            raise SpecError(
                SpecIssue(
                    str(p),
                    field="",
                    message="not a regular file",
                    fix="pass the .yaml file",
                )
            )
        with p.open("rb") as fh:  # no more than the limit: a huge file must not stall us
            text = fh.read(max_spec_bytes() + 1).decode("utf-8")
        folder = p.resolve().parent
    except FileNotFoundError:
        raise SpecError(
            SpecIssue(
                str(p),
                field="",
                message="file not found",
                fix="check the path; shipped files are in environments/",
            )
        ) from None
    except IsADirectoryError:
        raise SpecError(
            SpecIssue(
                str(p),
                field="",
                message="is a folder, not a file",
                fix="pass the .yaml file itself",
            )
        ) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            SpecIssue(
                str(p),
                field="",
                message=f"not UTF-8 text ({exc.reason})",
                fix="save the file as UTF-8",
            )
        ) from None
    except OrchestratorError:
        raise  # a bad ORCHESTRATOR_* setting says so itself
    except (OSError, RuntimeError, ValueError) as exc:  # EACCES, ELOOP, a NUL byte ...
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise SpecError(
            SpecIssue(
                str(p),
                field="",
                message=f"cannot read: {why}",
                fix="pass a readable file",
            )
        ) from None
    return load_environment_text(text, source=str(p), base_dir=folder, backends=backends)


def migrated_yaml(path: str | Path) -> str:
    """The v1 YAML equivalent of a (legacy or v1) file, for `orchestrator migrate`."""
    import io

    env = load_environment(path)
    data = env.spec.model_dump(mode="json", exclude_defaults=True)
    data = {"version": 1, **{k: v for k, v in data.items() if k != "version"}}
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    yaml.dump(data, out)
    return out.getvalue()
