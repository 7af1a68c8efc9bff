"""Changing what a running Docker environment may reach (`rt.set_egress`, and setup's own
`setup.egress`): its egress gateway's rules rewritten, Squid told to read them again, and
whatever it had open cut when the change takes something away.

1. The rules file (`gateway/rules/rules.conf` in the project folder, whose folder is
   bind-mounted read-only into the gateway) is replaced whole, by a new file renamed over
   it, with the new rules, and first a rule that answers a request for a name made for this
   change alone (`orch-phase-TOKEN.invalid`) with 404. Nothing else answers 404.
2. Squid gets SIGHUP, and reads its configuration again; connections it holds stay open.
3. From inside the gateway, on its own loopback, requests for that name until one gets 404:
   then the new rules hold for every new request. Bounded by the engine's bound.
4. When the change takes anything away and a client of the gateway has a request open (a
   tunnel, a download), the gateway is restarted, which cuts every connection it has: an
   open tunnel is never re-checked against new rules. Clients reconnect; what they ask
   then meets the new rules. Its open requests are read from Squid's cache manager, which
   answers only on the gateway's own loopback (templates/gateway/squid.conf).

One change at a time per environment (a lock in its project folder). What holds now is
kept beside the rules (`gateway/egress`), one line, as `describe` writes it."""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.docker.network import (
    FRONT_UID_FILE,
    GATEWAY,
    PROXY_PORT,
    RULES_FILE,
    gateway_rules,
)
from orchestrator.errors import DockerError, OrchestratorError, UsageError
from orchestrator.paths import locked_file, read_regular, write_file
from orchestrator.spec import egress as rules
from orchestrator.spec.resolve import MAIN

if TYPE_CHECKING:
    from orchestrator.backends.docker.lifecycle import Project

NOW_FILE = "gateway/egress"
"""What the gateway lets through now, relative to the project folder (one line)."""
LOCK_FILE = "gateway/.lock"
CHANGING = "(changing)\n"
"""What NOW_FILE holds while a change is made (read as "all", see `now`)."""
RESTART_GRACE = 1
"""Seconds Squid has to end before it is killed (it ends at once: shutdown_lifetime 0)."""

OPEN = (
    (
        "answer=$( (exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET http://{host}:{port}/squid-"
        "internal-mgr/active_requests HTTP/1.0\\r\\n\\r\\n' >&3 && head -c {limit} <&3)"
        " 2>/dev/null ) || true\n"
        'case $answer in "HTTP/1."[01]" 200 "*) ;; *) echo unknown; exit 0 ;; esac\n'
        '[ "${#answer}" -lt {limit} ] || { echo unknown; exit 0; }\n'
        "printf '%s\\n' \"$answer\" | grep -q '^[[:space:]]*remote: 127\\.'"
        " || { echo unknown; exit 0; }\n"
        "squid=$(printf '%s\\n' \"$answer\" | grep -E '^[[:space:]]+remote: '"
        " | grep -vc 'remote: 127\\.' || true)\n"
        # the plain-HTTP front's connections: every TCP socket of its user (its own, the
        # gateway's: templates/gateway/start) in any state but listening (0A) and TIME_WAIT
        # (06): a client's, half-closed or kept alive, and a server's, which goes on moving
        # what a client sent even once that client's socket was reset and is gone
        "uid=$(cat {front_uid} 2>/dev/null) || { echo unknown; exit 0; }\n"
        "[[ $uid =~ ^[0-9]+$ ]] || { echo unknown; exit 0; }\n"
        'front=$(awk -v uid="$uid" \'NR > 1 && $8 == uid && $4 != "0A" && $4 != "06"\''
        " /proc/net/tcp | wc -l)\n"
        'echo "$((squid + front))"\n'
    )
    .replace("{front_uid}", FRONT_UID_FILE)
    .replace("{port}", str(PROXY_PORT))
    .replace("{host}", GATEWAY)
    .replace("{limit}", str(4 << 20))
)
"""Run in the gateway (bash): how many requests of its clients are open: the cache
manager's `remote:` lines that are not its own, asked by its own name (answered by Squid
itself, never forwarded); "unknown" unless the answer is whole and lists the asking request
itself; and the plain-HTTP front's connections (every TCP socket of its user: open,
half-closed or kept alive)."""

PROBE = (
    'probe() { (exec 3<>/dev/tcp/127.0.0.1/{port} && printf "HEAD http://orch-phase-%s.invalid/'
    ' HTTP/1.0\\r\\n\\r\\n" "$1" >&3 && read -r -t 2 _ code _ <&3 && echo "$code")'
    " 2>/dev/null; }\n"
    "ok=\n"
    'for _ in $(seq "$2"); do\n'
    '  if [ "$(probe "$1")" = 404 ]; then ok=1; break; fi\n'
    "  sleep 0.05\n"
    "done\n"
    '[ -n "$ok" ] || exit 3\n'
    '[ "${3:-}" = open ] || exit 0\n'
).replace("{port}", str(PROXY_PORT)) + OPEN
"""Run in the gateway (bash): $1 the change's token, $2 the tries (a twentieth of a second
apart); exit 3 when the new rules never answered. With $3 = open, then prints what OPEN
prints (anything but "0": everything is cut)."""


def open_requests(project: Project, within: float | None = None) -> int | None:
    """How many requests of its clients the environment's gateway holds open now (OPEN);
    None when that is not known (its answer, or the gateway, failed, or took more than
    `within` seconds: default, the engine's bound)."""
    action = f"{project.name}: asking the egress gateway what it holds open"
    engine = project.engine if within is None else project.engine.within(max(1, int(within)))
    try:
        said = engine.exec(project.container_of(GATEWAY), ["/bin/bash", "-c", OPEN], action=action)
    except OrchestratorError:
        return None
    return int(said.strip()) if said.strip().isdigit() else None


def marked(egress: rules.Egress, token: str) -> str:
    """The rules file for `egress`, with the change's marker first (see the module)."""
    acl = "orch_phase"
    return (
        f"acl {acl} dstdomain -n orch-phase-{token}.invalid\n"
        f"deny_info 404:ERR_EGRESS_DENIED {acl}\n"
        f"http_access deny {acl}\n" + gateway_rules(egress)
    )


def now(directory: Path, started: str) -> rules.Egress:
    """What the gateway lets through now: as the last change wrote it, else what it started
    with (`started`, as `describe` writes it); "all" when neither reads, so that a change
    from it is taken as one that takes something away."""
    raw = read_regular(directory / NOW_FILE, 64 * 1024)
    try:
        line = raw.decode().strip() if raw is not None else started
        if line in ("none", "all"):
            return line  # type: ignore[return-value]
        if line == CHANGING.strip():
            return "all"
        return rules.parse([e for e in line.split(", ") if e]) if line else "all"
    except (UnicodeDecodeError, ValueError):
        return "all"


def apply(project: Project, egress: rules.Egress) -> None:
    """Make the gateway of `project` let through `egress` from now on (see the module).
    UsageError when its sandbox does not reach outside through a gateway."""
    compiled = project.compiled
    if GATEWAY not in compiled.infra or MAIN not in compiled.proxied:
        held = compiled.egress.get(MAIN, "none")
        raise UsageError(
            f"{project.name}: the sandbox's egress cannot change while it runs: it was started "
            f"with egress {held}, with no egress gateway to hold it to another (give the file "
            "an allowlist, or setup.egress, for a gateway)"
        )
    directory = project.directory
    within = project.engine.bound * 3  # (a change takes about one bound: its exec, a restart)
    busy = f"{project.name}: another change of its egress has run for {within:g}s; try again"
    with locked_file(directory / LOCK_FILE, within, busy):
        before = now(directory, compiled.egress.get(MAIN, "all"))
        # until this change is done, what holds is not known: a change after one that died
        # half-way takes it for "all", and cuts what is open
        write_file(directory / NOW_FILE, CHANGING)
        token = secrets.token_hex(8)
        write_file(directory / RULES_FILE, marked(egress, token), 0o644)  # (Squid's to read)
        cut = rules.takes_away(before, egress)
        engine, gateway = project.engine, project.container_of(GATEWAY)
        action = f"{project.name}: telling the egress gateway its new rules"
        tries = int(engine.bound * 10)  # (half the exec's bound in pauses; its bound ends it)
        argv = ["/bin/bash", "-c", PROBE, "probe", token, str(tries), *(["open"] if cut else [])]
        try:
            engine.signal(gateway, "HUP", action=action)
            said = engine.exec(gateway, argv, action=action)
        except Exception as exc:
            if cut:  # what the old rules let open must not outlive a failed narrowing
                with contextlib.suppress(Exception):
                    engine.restart(gateway, grace=RESTART_GRACE, action=action)
            if not isinstance(exc, DockerError):
                raise
            last = ""
            with contextlib.suppress(Exception):
                last = f"; its last lines:\n{project.logs(GATEWAY, tail=20)}"
            then = "; it was restarted, which cut what it held open" if cut else ""
            raise OrchestratorError(
                f"{project.name}: the egress gateway did not confirm its new rules ({exc}); "
                f"they are in its rules file, which it reads when it starts again if not "
                f"before{then}{last}"
            ) from None
        if cut and said.strip() != "0":  # open requests, or not known: cut them all
            engine.restart(gateway, grace=RESTART_GRACE, action=action)
            project.wait_gateway()
        write_file(directory / NOW_FILE, rules.describe(egress) + "\n")
