"""The templates every container backend renders its native project from (the Compose file,
the Swarm stack file, the entry script): one Jinja environment per process, shared, so each
template compiles once, not per call. Jinja is imported on the first render, not before: a
process that only runs commands (`orchestrator exec`) never loads it.

A template's compiled code is kept in the state folder (`cache/templates`, private to this
user like everything there), so that a CLI process (`up`, `validate`, `render`) does not
compile them again: 50 ms each for the Compose file here, a tenth of a second of every such
command. The files hold Python code and a pickle, so they are read only from that folder
(0700, this user's, its holders checked: `paths.state_folder`), never through a link,
bounded; a key names this release and the environment's options as well as the template,
and Jinja itself checks the template's source and its own and Python's versions. Where the
state folder is refused, or the cache cannot be read or written, templates compile as
before."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
from typing import TYPE_CHECKING

from orchestrator import paths
from orchestrator._resources import data_dir
from orchestrator._version import __version__
from orchestrator.errors import OrchestratorError

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


OPTIONS = "strict-undefined keep-trailing-newline trim-blocks lstrip-blocks no-autoescape"
"""The environment's options below, in words: part of each cached template's key."""
CACHE_LIMIT = 4 * 1024 * 1024
"""Bytes of one cached template read at most (the Compose file's is about 60 KB)."""


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
        bytecode_cache=_compiled_cache(),
    )
    env.filters["q"] = quote
    return env


def _compiled_cache() -> jinja2.BytecodeCache | None:
    """Where compiled templates are kept (see the module); None where there is no private
    folder for them."""
    import jinja2

    try:
        folder = paths.state_folder("cache", "templates")
    except (OSError, OrchestratorError):
        return None
    salt = f"{__version__}\0{OPTIONS}"

    class Compiled(jinja2.BytecodeCache):
        def get_cache_key(self, name: str, filename: str | None = None) -> str:
            return hashlib.sha256(f"{salt}\0{name}\0{filename}".encode()).hexdigest()

        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            data = paths.read_regular(folder / f"{bucket.key}.jinja", CACHE_LIMIT)
            if data is None or len(data) > CACHE_LIMIT:
                return
            try:
                bucket.bytecode_from_string(data)
            except Exception:  # (a file cut short: compiled again, and written whole)
                bucket.reset()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                paths.write_file(folder / f"{bucket.key}.jinja", bucket.bytecode_to_string())

    return Compiled()
