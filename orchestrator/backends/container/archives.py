"""What is packed on this machine for a container that mounts nothing of it (a remote engine,
a Swarm): the executor's folder and the static assets, as one tar archive, owned by root and
read-only, each asset's path checked again where it is read. copyin.py unpacks it."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.backends.container.binds import PinRefused, open_exact
from orchestrator.backends.container.executor.files import executor_files
from orchestrator.backends.container.layout import SANDBOX_MOUNT, STATIC_ROOT
from orchestrator.errors import OrchestratorError
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import Policy, check_host_paths, look_up, raise_if


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.gid, info.mtime = mode, 0, 0, int(time.time())
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def static_into(
    tar: tarfile.TarFile, env: Environment, policy: Policy | None, dir_mode: int = 0o555
) -> list[str]:
    """The static assets at /static/<save_path>, root's and read-only (folders `dir_mode`:
    0o755 where the unpacking root has no capability to write in a read-only folder and
    makes them read-only after). Returns the folders' absolute paths. Each asset's path is
    checked again here, where it is read (the policy's rule, then a walk that follows no
    link), so nothing swapped in since the spec was checked is copied."""
    folders: list[str] = []
    if not env.spec.static_assets:
        return folders

    def folder(name: str) -> None:
        _add(tar, name, None, dir_mode)
        folders.append("/" + name)

    folder(STATIC_ROOT.lstrip("/"))
    for asset in env.spec.static_assets:
        real = look_up(Path(asset.path), env.base_dir).real
        roots = (policy or Policy.from_env()).mount_roots(env.base_dir, None)
        raise_if(check_host_paths(env.source, [(f"static_assets.{asset.name}", real)], roots))
        dest = f"{STATIC_ROOT.lstrip('/')}/{asset.save_path}"
        parts = dest.split("/")
        for i in range(2, len(parts)):
            folder("/".join(parts[:i]))
        try:
            top = open_exact(real)  # no link on the way: what was checked, or nothing
        except PinRefused as exc:
            raise OrchestratorError(f"static asset {asset.name}: {exc}") from None
        try:
            _asset_into(tar, top, dest, folder)
        finally:
            os.close(top)
    return folders


def _asset_into(tar: tarfile.TarFile, top: int, dest: str, folder: Callable[[str], None]) -> None:
    """One asset, file or folder, from the descriptor `top`: every entry reached from its
    folder's descriptor without following a link (a link inside is copied as a link, never
    read through: `key -> ~/.ssh/id_rsa` gives the sandbox a dangling link, not the key);
    FIFOs, sockets and devices are left out."""
    if stat.S_ISREG(os.fstat(top).st_mode):
        _add(tar, dest, _read_fd(top), 0o444)
        return
    folder(dest)
    root = os.open(f"/proc/self/fd/{top}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _tree_into(tar, root, dest, folder)
    finally:
        os.close(root)


def _tree_into(tar: tarfile.TarFile, root: int, dest: str, folder: Callable[[str], None]) -> None:
    for where, dirs, names, dfd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
        rel = os.path.normpath(where)
        base = dest if rel == "." else f"{dest}/{rel}"
        for name in sorted(dirs):
            folder(f"{base}/{name}")
        for name in sorted(names):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                _link(tar, f"{base}/{name}", os.readlink(name, dir_fd=dfd))
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        mode = 0o555 if st.st_mode & 0o111 else 0o444
                        _add(tar, f"{base}/{name}", _read_fd(fd), mode)
                finally:
                    os.close(fd)


def _read_fd(fd: int) -> bytes:
    with os.fdopen(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        return f.read()


def _link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)


def main_archive(env: Environment, policy: Policy | None = None) -> bytes:
    """What the main container needs from here: the executor, and the static assets."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        root = SANDBOX_MOUNT.lstrip("/")
        _add(tar, root, None, 0o555)
        folders: set[str] = set()
        for rel, data in executor_files().items():
            parts = rel.split("/")[:-1]
            for depth in range(1, len(parts) + 1):  # its folders first (procutil/__pycache__)
                folder = "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    _add(tar, f"{root}/{folder}", None, 0o555)
            _add(tar, f"{root}/{rel}", data, 0o444)
        static_into(tar, env, policy)
    return out.getvalue()


def static_archive(env: Environment, policy: Policy | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        static_into(tar, env, policy)
    return out.getvalue()
