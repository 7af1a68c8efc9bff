"""`orchestrator config`: every setting of orchestrator/settings.py, its value in this process
and where it came from (default, environment, flag), as a table on a terminal or JSON; and
the reference table of docs/settings.md, made from the same model (`--docs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from orchestrator import settings
from orchestrator.errors import UsageError
from orchestrator.setting import Setting

UNSET = "(unset)"


def _plain(value: Any) -> Any:
    """A value as JSON has it: a list for a tuple, text for a path or a network."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def _text(value: Any) -> str:
    """A value as the table shows it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) or UNSET
    return str(value) or UNSET


def entry(setting: Setting[Any]) -> tuple[dict[str, Any], Any]:
    """What `config --json` says of one setting: its value (None when it is bad: `error`
    says why), the layer it came from, the flag that gave it, and the text it was given;
    and the value itself."""
    raw, source, flag = setting.given()
    out: dict[str, Any] = {"name": setting.name, "value": None, "source": source}
    if flag:
        out["flag"] = flag
    if raw:
        out["text"] = raw
    try:
        value = setting.get()
    except UsageError as exc:
        out["error"] = str(exc)
        return out, None
    out["value"] = _plain(value)
    return out, value


def show(*, as_json: bool) -> None:
    """Print every setting's value and source; UsageError (exit 2) after, naming each bad one."""
    from orchestrator.tables import print_table

    found = [entry(s) for s in settings.CATALOG.every]
    if as_json:
        typer.echo(json.dumps([e for e, _ in found], indent=2))
    else:
        rows = []
        for e, value in found:
            shown = f"invalid: {e['text']}" if "error" in e else _text(value)
            source = f"flag {e['flag']}" if "flag" in e else e["source"]
            rows.append([e["name"], shown, source])
        print_table(["SETTING", "VALUE", "SOURCE"], rows, drop=["SOURCE"])
    bad = [e["error"] for e, _ in found if "error" in e]
    if bad:
        raise UsageError("; ".join(bad))


DOCS = Path("docs/settings.md")
"""Where the reference lives, from the repository's root."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(setting: Setting[Any]) -> str:
    if setting.shown:
        return setting.shown
    return f"`{_text(setting.default)}`" if _text(setting.default) != UNSET else UNSET


def reference() -> str:
    """docs/settings.md: every setting by section, with its type, default and doc."""
    lines = [
        "# Settings",
        "",
        "<!-- Made from orchestrator/settings.py: `orchestrator config --docs > "
        "docs/settings.md`. Do not edit by hand. -->",
        "",
        "Every setting of the library and the CLI is an `ORCHESTRATOR_*` environment variable, "
        "read when it is used (a change counts at once). The CLI's `--host`, `--context` and "
        "`--engine` give `ORCHESTRATOR_DOCKER_HOST` and `ORCHESTRATOR_ENGINE` for one run, over "
        "the variables. `orchestrator config` prints each setting's value and where it came "
        "from (default, environment, flag); `--json` for scripts. A bad value is an error "
        "naming the variable (exit 2), never ignored. Text that is empty or blank is unset; "
        "on or off is 1, true, yes, on or 0, false, no, off (any case).",
    ]
    for title, about in settings.CATALOG.sections.items():
        lines += ["", f"## {title}", "", about, ""]
        lines += ["| variable | value | default | what it does |", "|---|---|---|---|"]
        for s in settings.CATALOG.every:
            if s.section == title:
                cells = [f"`{s.name}`", s.short or s.kind, _default(s), s.doc]
                lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
