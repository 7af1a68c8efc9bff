"""What the engine's network hook would give a container on no network, given here instead
when the fast path (direct.py) makes one with networking disabled: an empty namespace
(loopback only), the engine's /etc/hosts and /etc/resolv.conf, and IPv6 off."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

NAME_FILES = "names"
"""The project's folder of /etc/hosts and /etc/resolv.conf for a sandbox without network."""
HOSTS = """\
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
ff00::0\tip6-mcastprefix
ff02::1\tip6-allnodes
ff02::2\tip6-allrouters
"""
"""The engine's /etc/hosts for a container on no network."""
NO_IPV6 = ("all", "default", "lo")
IPV6_SWITCH = "/proc/sys/net/ipv6/conf/all/disable_ipv6"
_LOCAL_NAMESERVER = re.compile(
    r"(?m)^nameserver\s+((127\.([0-9]{1,3}\.){2}[0-9]{1,3})|(::1))\s*\n*"
)
_IPV6_NAMESERVER = re.compile(r"(?m)^nameserver\s+([0-9A-Fa-f]*:[0-9A-Fa-f:.%a-zA-Z]*)\s*\n*")
_NAMESERVER = re.compile(r"(?m)^nameserver\s+\S+")
RESOLVED_STUB = "/run/systemd/resolve/resolv.conf"
DEFAULT_DNS = "nameserver 8.8.8.8\nnameserver 8.8.4.4"


def unnetworked(config: dict[str, Any], host: dict[str, Any], directory: Path) -> dict[Path, str]:
    """A sandbox with no network, made without the engine's network hook: at each start the
    engine runs a whole copy of its own binary to set up a network namespace, about 0.1
    CPU-s, even for `none`. With networking disabled it makes the same empty namespace
    (loopback only) itself; what the hook would have added is given here instead, as the
    engine would: /etc/hosts and /etc/resolv.conf (each unless the file mounts its own
    there, as the engine then leaves it), and IPv6 off (where this kernel has IPv6).
    Returns the files to write."""
    config["NetworkDisabled"] = True
    if Path(IPV6_SWITCH).exists():  # a kernel without IPv6 has no such setting to make
        host["Sysctls"] = {f"net.ipv6.conf.{c}.disable_ipv6": "1" for c in NO_IPV6}
    taken = {posixpath.normpath(m["Target"]) for m in host["Mounts"]}
    folder = directory / NAME_FILES
    files: dict[Path, str] = {}
    if "/etc/hosts" not in taken:
        files[folder / "hosts"] = HOSTS
    if "/etc/resolv.conf" not in taken:
        files[folder / "resolv.conf"] = _resolv_conf()
    host["Mounts"] = [
        *host["Mounts"],
        *({"Type": "bind", "Source": str(f), "Target": f"/etc/{f.name}"} for f in files),
    ]
    return files


def _resolv_conf() -> str:
    """The engine's /etc/resolv.conf for a container: this machine's, without nameservers
    it cannot reach from a container (its own loopback, IPv6 when that is off), and its
    defaults when none is left."""
    try:
        text = Path("/etc/resolv.conf").read_text(errors="replace")
        names = _NAMESERVER.findall(text)
        if names and all(n.split()[1] == "127.0.0.53" for n in names):  # systemd's stub
            text = Path(RESOLVED_STUB).read_text(errors="replace")
    except OSError:
        text = ""
    text = _IPV6_NAMESERVER.sub("", _LOCAL_NAMESERVER.sub("", text))
    if not _NAMESERVER.search(text):
        text += "\n" + DEFAULT_DNS
    return text
