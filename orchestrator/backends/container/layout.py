"""The container layout every container backend shares: where things are inside a
container, what keeps the main sandbox alive, and the labels on its containers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.spec.published import LOOPBACK, MAIN

if TYPE_CHECKING:  # (the file's models load pydantic: `ps` needs none of them)
    from orchestrator.spec.models import EnvironmentV1

__all__ = [
    "FORWARDER",
    "FORWARDS_LABEL",
    "GATEWAY",
    "IO_DIR",
    "IO_MOUNT",
    "KEEP_ALIVE",
    "KILL_OTHERS",
    "MAIN",
    "SANDBOX_DIR",
    "SANDBOX_MOUNT",
    "STATIC_ROOT",
    "STAT_FIELDS",
    "USER_LABEL",
    "container_bind_host",
    "parse_forwards",
]

STATIC_ROOT = "/static"
"""Static assets are read-only at STATIC_ROOT/<save_path>."""
SANDBOX_DIR = "sandbox"
SANDBOX_MOUNT = "/.orchestrator"
"""The executor's files and entry.sh: <project>/SANDBOX_DIR, read-only in every container."""
IO_DIR = "io"
IO_MOUNT = "/.orchestrator-io"
"""Where the transfer FIFOs of one container appear: <project>/IO_DIR/<service> (mode 0700),
read-only in that container only, so that no other container (root in a service, or in the
main sandbox) sees or opens them."""
GATEWAY = "orchestrator-egress"
"""Service name of the egress gateway (the proxy's host name in the sandboxes)."""
FORWARDER = "orchestrator-ports"
"""Service name of the port forwarder."""
USER_LABEL = "org.orchestrator.user"
"""On the main container: the user commands run as ("uid:gid"), for `orchestrator exec`."""

KEEP_ALIVE = (
    "trap 'exit 0' TERM INT HUP; f=/dev/shm/.orchestrator-keep-alive; "
    'if rm -f "$f" && mkfifo -m 600 "$f" && exec 3<>"$f"; then rm -f "$f"; '
    "while :; do read -r _ <&3; done; fi; "
    "while :; do sleep 86400 & wait $!; done"
)
"""What keeps the main sandbox alive (the child of its init; templates/entry.sh.j2 runs
it too): a shell blocked reading a FIFO only it holds, so it has no child process and runs
no program of the image after the start. A reset kills everything else, and a root sandbox
that replaces a program the keep-alive would start again has nothing to replace. Where
`mkfifo` or /dev/shm is missing, it sleeps in a loop instead."""


def container_bind_host(spec: EnvironmentV1, network_mode: str) -> tuple[str, str | None]:
    """In bridge mode a loopback bind address cannot be reached through published ports,
    so it becomes 0.0.0.0. Returns (bind host, notice or None)."""
    asked = spec.network.bind_host
    if network_mode == "bridge" and asked in LOOPBACK:
        return "0.0.0.0", (
            f"network.bind_host {asked} rewritten to 0.0.0.0: in bridge mode a "
            "loopback address is unreachable through published ports"
        )
    return asked, None


FORWARDS_LABEL = "org.orchestrator.forwards"
"""On an environment's port forwarder: which container port each of its own ports stands
for, "LISTEN/PROTO=SERVICE:PORT,..." (see backends/docker/network.py)."""


def parse_forwards(label: str) -> dict[tuple[int, str], tuple[str, int]]:
    """FORWARDS_LABEL read back: (listen port, protocol) -> (service, container port)."""
    out = {}
    for part in label.split(","):
        key, _, target = part.partition("=")
        listen, _, proto = key.partition("/")
        service, _, port = target.rpartition(":")
        if listen.isdigit() and port.isdigit() and service:
            out[(int(listen), proto)] = (service, int(port))
    return out


# Kill every process of the main container except PID 1 (init), the keep-alive (the oldest of
# its children, which has no child of its own) and this script's own ancestry (the executor,
# or plain exec). Orphans are reparented to PID 1, so a daemon is found like any other; a
# process cannot pass for the keep-alive, which started before any command could, and none
# is spared for being its child. Passes repeat until three in a row find nothing, so a fork
# caught mid-pass is not missed.
STAT_FIELDS = r"""
fields() {  # /proc/PID/stat after the name, read whole: a name may hold ") " and newlines
  s=; l=; while IFS= read -r l; do s="$s $l"; done < "$1/stat" || return 1; s="$s $l"
  s=${s##*) }
}
"""
"""A shell function (builtins only) that sets `s` to the fields of /proc/PID/stat after the
process's name: state first, then the parent, group and session. Read whole, up to the last
") ", because a process names itself: one called "x) Z 1" and a newline would pass for a
zombie (and be spared) to a reader of the first line. Every in-container killer reads a
process's state through it."""
KILL_OTHERS = (
    STAT_FIELDS
    + r"""
me=$$; keep=" 1 "; p=$$
while [ "${p:-0}" -gt 0 ]; do
  keep="$keep$p "; fields /proc/$p 2>/dev/null || break; set -- $s; p=$2
done
entry=; first=
for d in /proc/[0-9]*; do
  fields $d 2>/dev/null || continue; set -- $s
  [ "$2" = 1 ] || continue
  if [ -z "$first" ] || [ "${20}" -lt "$first" ]; then first=${20}; entry=${d#/proc/}; fi
done
keep="$keep$entry "; quiet=0; n=0
while [ $quiet -lt 3 ] && [ $n -lt 500 ]; do
  n=$((n + 1)); found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $keep in *" $p "*) continue ;; esac
    fields $d 2>/dev/null || continue; set -- $s
    [ "$1" = Z ] || [ "$2" = "$me" ] && continue
    kill -9 "$p" 2>/dev/null && found=1
  done
  [ $found = 1 ] && quiet=0 || quiet=$((quiet + 1))
done
[ $quiet -ge 3 ]
"""
)
