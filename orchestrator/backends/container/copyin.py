"""What a sandbox needs from this machine when nothing of it is mounted (a remote engine, a
Swarm): the executor's sources and the static assets, packed here and unpacked in the
container as root, owned by root and read-only."""

from __future__ import annotations

import io
import tarfile
import time

from orchestrator.backends.container.executor.client import FILES
from orchestrator.backends.container.layout import SANDBOX_MOUNT, STATIC_ROOT
from orchestrator.errors import OrchestratorError
from orchestrator.spec.loader import Environment

PREPARE = 'tar -x -f - -C / && mkdir -p -- "$1" && chown -- "$2" "$1"'
"""Unpack as root (owners and modes as archived), then give the workdir to the sandbox user."""
PREPARE_SERVICE = "tar -x -f - -C /"


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.gid, info.mtime = mode, 0, 0, int(time.time())
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _static_into(tar: tarfile.TarFile, env: Environment) -> None:
    """The static assets at /static/<save_path>, root's and read-only."""
    if not env.spec.static_assets:
        return
    _add(tar, STATIC_ROOT.lstrip("/"), None, 0o555)
    for asset in env.spec.static_assets:
        src = (env.base_dir / asset.path).resolve()
        dest = f"{STATIC_ROOT.lstrip('/')}/{asset.save_path}"
        parts = dest.split("/")
        for i in range(2, len(parts)):
            _add(tar, "/".join(parts[:i]), None, 0o555)
        if src.is_dir():
            _add(tar, dest, None, 0o555)
            for path in sorted(src.rglob("*")):
                rel = f"{dest}/{path.relative_to(src).as_posix()}"
                if path.is_dir():
                    _add(tar, rel, None, 0o555)
                elif path.is_file():
                    _add(
                        tar, rel, path.read_bytes(), 0o555 if path.stat().st_mode & 0o111 else 0o444
                    )
        elif src.is_file():
            _add(tar, dest, src.read_bytes(), 0o444)
        else:
            raise OrchestratorError(f"static asset {asset.name}: {src} is missing")


def main_archive(env: Environment) -> bytes:
    """What the main container needs from here: the executor, and the static assets."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, SANDBOX_MOUNT.lstrip("/"), None, 0o555)
        for f in FILES:
            _add(tar, f"{SANDBOX_MOUNT.lstrip('/')}/{f.name}", f.read_bytes(), 0o444)
        _static_into(tar, env)
    return out.getvalue()


def static_archive(env: Environment) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _static_into(tar, env)
    return out.getvalue()
