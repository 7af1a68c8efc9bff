"""The templates every container backend renders its native project from (the Compose file,
the Swarm stack file, the entry script): one Jinja environment per process, shared, so each
template compiles once (about 20 ms each), not per call. Jinja is imported on the first
render, not before: a process that only runs commands (`orchestrator exec`) never loads it."""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING

from orchestrator._resources import data_dir

if TYPE_CHECKING:
    import jinja2

_NOT_YAML = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")
"""What JSON leaves as it is but a YAML double-quoted scalar may not hold as itself: a YAML
parser folds NEL and the Unicode line and paragraph separators into a space, and refuses
the other non-printable characters."""


def quote(value: object) -> str:
    """A YAML scalar, JSON-quoted, with `$` escaped against Compose (and `docker stack
    deploy`) interpolation, and any character YAML would not read back as itself given as
    its `\\u` escape."""
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    text = json.dumps(str(value), ensure_ascii=False)
    return _NOT_YAML.sub(lambda m: f"\\u{ord(m.group()):04x}", text).replace("$", "$$")


@functools.cache
def jinja() -> jinja2.Environment:
    """The templates' environment: undefined names are errors, nothing is escaped (YAML is
    quoted by the `q` filter)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    return env
