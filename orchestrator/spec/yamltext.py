"""Reading an environment file's text: from disk (at most max_spec_bytes; a Dockerfile read as
the Compose file made for it), parsed as YAML with line numbers, within bounds on size,
bracket nesting and alias expansion; whatever the text, a SpecError at its line, never a
traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError

from orchestrator import settings
from orchestrator.errors import OrchestratorError, SpecError, SpecIssue
from orchestrator.spec import compose
from orchestrator.spec.issues import Position

MAX_BYTES_ENV = settings.MAX_SPEC_BYTES.name
MAX_VALUES = 50_000
"""Most values (mapping entries, list items, scalars) a file may expand to through aliases."""
MAX_NESTING = 100
"""Deepest nesting of flow brackets a file may have (real ones: a few levels)."""
MAX_TEXT = 8 * 1024 * 1024
"""Most characters of text a file may expand to through aliases."""


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    return yaml


class Budget:
    """Counts what `plain_data` expands, so an alias bomb stops early instead of eating memory."""

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


def _plain(node: Any, budget: Budget) -> Any:
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


def plain_data(root: Any, source: str) -> Any:
    """A parsed file (`parse_yaml`) as plain Python values: dicts, lists, str, int, float,
    bool and None; SpecError once aliases expand it past MAX_VALUES or MAX_TEXT."""
    return _plain(root, Budget(source))


def _too_deep(text: str) -> Position | None:
    """Where `[` and `{` first nest deeper than MAX_NESTING (outside quotes and comments,
    roughly: a value with that many stray brackets is no real file either), else None."""
    depth, line, start, quote = 0, 1, 0, ""
    for i, char in enumerate(text):
        if char == "\n":
            line, start = line + 1, i + 1
            if quote == "#":
                quote = ""
        elif quote:
            if char == quote:
                quote = ""
        elif char in "\"'" or (char == "#" and (i == start or text[i - 1] in " \t")):
            quote = char
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return line, i - start + 1
        elif char in "]}":
            depth = max(depth - 1, 0)
    return None


def max_spec_bytes() -> int:
    return settings.MAX_SPEC_BYTES.get()


def _malformed(
    source: str, where: tuple[int | None, int | None], problem: str, fix: str
) -> SpecError:
    """A file that does not parse as YAML, at (line, column)."""
    line, column = where
    message = f"malformed YAML: {problem}"
    return SpecError(
        SpecIssue(source, line=line, column=column, field="", message=message, fix=fix)
    )


def parse_yaml(text: str, source: str) -> Any:
    """`text` parsed as YAML with line numbers (ruamel's round-trip nodes); SpecError at the
    line and column of what does not parse, or for a file over the size or nesting bounds."""
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
    deep = _too_deep(text)
    if deep is not None:  # the parser's time grows with the square of the nesting
        raise _malformed(
            source,
            deep,
            f"brackets nested more than {MAX_NESTING} deep",
            "environment files nest a few levels; write the value out flat",
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
        raise _malformed(source, (line, col), problem, fix) from exc
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


def read_spec_text(p: Path) -> tuple[str, Path]:
    """The text of environment file `p` (at most max_spec_bytes; a Dockerfile read as the
    Compose file made for it) and its folder, symlinks resolved; a SpecError naming the file
    when it cannot be read."""
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
    if compose.is_dockerfile(p.name):
        text = compose.dockerfile_compose(p)
    return text, folder
