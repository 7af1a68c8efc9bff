"""The image of an environment's egress gateway and port forwarder, built from the folder
`templates/gateway` the package ships (Squid and socat on Debian), once per machine and
version: its tag is a hash of that folder, so an image under it is the one this version
needs. mitmproxy is in it for the secrets relay, which runs only in a gateway whose
environment has secrets (relay.py). Built like a file's own build, with its progress, but
always as "auto": `--build` and `--no-build` are about the file's images, not the
environment's own.

The base it is built on: ORCHESTRATOR_GATEWAY_BASE when set; else LOCAL_BASE when the
engine has it (`scripts/build-images gateway` makes it from the machine's Debian mirror,
for machines that reach no registry: squid, socat and mitmproxy are in it, so nothing is
fetched); else debian:bookworm-slim, which the build installs them into."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

from orchestrator import settings
from orchestrator._resources import data_dir

BASE_ENV = settings.GATEWAY_BASE.name
LOCAL_BASE = "orchestrator/gateway-base:bookworm-relay"
DEFAULT_BASE = "debian:bookworm-slim"
REPOSITORY = "orchestrator/gateway"


def base_image(exists: Callable[[str], bool]) -> str:
    """The base to build on (see above); `exists` tells whether the engine has an image."""
    named = settings.GATEWAY_BASE.get()
    if named:
        return named
    return LOCAL_BASE if exists(LOCAL_BASE) else DEFAULT_BASE


def missing_base(base: str) -> str:
    """Why the gateway's image cannot be built here, and what to do."""
    return (
        f"the egress gateway's image is built on {base}, which this engine does not have, and "
        "images are never pulled unless the caller allows it: make the local base "
        f"(scripts/build-images gateway makes {LOCAL_BASE}), name one the engine has "
        f"({BASE_ENV}), or let the caller allow pulls (ORCHESTRATOR_ALLOW_PULL=1)"
    )


def context() -> Path:
    return data_dir("templates") / "gateway"


@functools.cache
def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def tag() -> str:
    """The gateway image this version runs."""
    return f"{REPOSITORY}:{_digest(context())}"
