"""What a sandbox needs from this machine when nothing of it is mounted (a remote engine, a
Swarm): the executor's sources and the static assets, packed here and unpacked in the
container as root, owned by root and read-only.

A service is prepared before its own command runs, on every backend: one with a `workdir`,
or one that shows static assets that are copied in, starts as the GATE, which waits (bounded)
for START_FILE. The runtime unpacks the assets, creates the workdir for the service's user,
then writes START_FILE last, naming the argv the image would have run (its entrypoint, then
the file's command or the image's); the GATE then `exec`s it, in the workdir, as the same
child of the container's init. A service with a `workdir` and a user other than root runs
the GATE as root (so that its root commands keep their capabilities under
no-new-privileges, as in the main sandbox) and START_FILE starts the command as that user,
with the uid, gid, groups and HOME the engine would have given it."""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.container.archives import static_into
from orchestrator.backends.container.engine import Engine, ExecTarget, up_timeout
from orchestrator.errors import DockerError, StartupError
from orchestrator.spec.loader import Environment
from orchestrator.spec.models import Service
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import resolve_user

PREPARE = (
    'tar -x -f - -C / && { [ -z "$1" ] || [ "$1" = / ] || '
    '{ mkdir -p -- "$1" && chown -- "$2" "$1"; }; }'
)
"""Unpack as root (owners and modes as archived), then make the workdir and give it to the
sandbox user: never `/` (its owner could rename /etc away and put another in its place),
and not the image's own WORKDIR (`workdir: null`, passed as "": the image's, as it is)."""

START_FILE = "/.orchestrator-start"
"""In a gated service: written by root once the service is prepared; sourced by the GATE, it
sets the argv the service runs. In `/`, which only root may write."""
GATE_WAIT = 300
"""Seconds a gated service waits to be prepared before it gives up (exit 125)."""
GATE = (
    "s=1; sleep 0.1 2>/dev/null || s=10; n=0; "
    f"while [ ! -f {START_FILE} ]; do "
    f'if [ "$n" -ge {GATE_WAIT * 10} ]; then '
    f"echo 'orchestrator: this service was not prepared within {GATE_WAIT}s "
    "(static assets, workdir); it does not start' >&2; exit 125; fi; "
    'if [ "$s" = 1 ]; then sleep 0.1; else sleep 1; fi; n=$((n + s)); done; '
    f'. {START_FILE} && exec "$@"'
)
"""The entrypoint of a gated service (run by /bin/sh -c, with the file's command as its
arguments): wait for START_FILE, bounded, then run what it names."""
UNPACK = (
    'w=$1; shift; tar -x -f - -C / || exit 1; [ $# = 0 ] || chmod 0555 -- "$@" || exit 1; '
    '[ -n "$w" ] || exit 0; rmdir -- "$w" 2>/dev/null; mkdir -p -- "$(dirname -- "$w")" '
    "2>/dev/null; true"
)
"""As root: unpack (the static assets, if any) and make their folders ($2...) read-only
(root's own, so no capability is needed: under no-new-privileges a root exec in a container
whose user is not root has none); then remove the empty workdir ($1) the engine made,
root's, and make its parent."""
MAKE_WORKDIR = (
    '[ -e "$1" ] || mkdir -m 0755 -- "$1" 2>/dev/null; [ -d "$1" ] && [ -w "$1" ] && exit 0; '
    '[ -z "$2" ] && exit 3; echo "$1 is in the image and user $(id -u) cannot write it; choose '
    'a folder the image does not have, or give it to that user in the image" >&2; exit 1'
)
"""As the service's user: create the workdir, which is then the user's own; exit 3 when the
user may not create it in its parent ($2 empty: try again once the parent is open)."""
OPEN_PARENT = (
    'p=$(dirname -- "$1"); m=$(stat -c %a -- "$p" 2>/dev/null) || { m=0; '
    "for b in 4000 2000 1000 400 200 100 40 20 10 4 2 1; do "
    '[ -n "$(find "$p" -maxdepth 0 -perm -$b 2>/dev/null)" ] && m=$((m + 0$b)); done; '
    'm=$(printf %o "$m"); }; echo "$m" && chmod 1777 -- "$p"'
)
"""As root: let anyone create the workdir in its parent (the service is held, so no one
else runs there); prints the parent's old mode, to put back. Where `stat` fails (coreutils
9 asks for statx, which some gVisor builds refuse), the mode is read bit by bit with find."""
CLOSE_PARENT = 'chmod -- "$2" "$(dirname -- "$1")"'
"""As root: put the parent's mode back."""


def _written(path: str) -> str:
    """As root: `path` (in /, which only root may write) from stdin, read-only, at once."""
    return (
        f"rm -f {path}.new && cat > {path}.new && chmod 0444 {path}.new && mv -f {path}.new {path}"
    )


RELEASE = _written(START_FILE)
"""As root, the last step: START_FILE from stdin; the command may start."""
DROP_FILE = "/.orchestrator-drop"
"""In a gated service that runs as a user other than root: shell text that runs "$@" as that
user. Its healthcheck goes through it: the engine runs a check as the container's user,
root here (the GATE's), and a check that ran as root would run what the user may write."""


def health_context(svc: Service, user: str | None) -> dict[str, Any]:
    """A service's healthcheck as the compilers render it (run as its user where it drops
    privileges: see DROP_FILE)."""
    check = svc.healthcheck
    if check is not None and drops_privileges(user, svc.workdir):
        check = check.model_copy(update={"test": dropped_check(check.test)})
    return {
        "healthcheck": check,
        "healthcheck_is_list": isinstance(check.test, list) if check else False,
    }


def dropped_check(test: list[str] | str) -> list[str] | str:
    """A healthcheck `test` run as the service's user, through DROP_FILE (which exists once
    the service is prepared: before, the check fails, as the service is not started)."""
    through = ["CMD", "/bin/sh", DROP_FILE]
    if isinstance(test, str):
        return [*through, "/bin/sh", "-c", test]
    if test[:1] == ["CMD"]:
        return [*through, *test[1:]]
    if test[:1] == ["CMD-SHELL"]:
        return [*through, "/bin/sh", "-c", *test[1:2]]
    return test  # NONE


WHO = 'id -u && id -g && id -G && printf "%s\\n" "$HOME"'
"""As the service's user: who the engine makes it (uid, gid, groups, HOME), so that a
command started by a root PID 1 gets the same."""
DROP_PY = (
    "import os, sys; os.setgroups([int(g) for g in sys.argv[3].split(',') if g]); "
    "os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1])); os.execvp(sys.argv[4], sys.argv[4:])"
)
"""Start "$@" as given uid, gid and groups where the image has python3 but no setpriv."""
RETRY = 3
"""MAKE_WORKDIR's exit code for "the parent must be opened first"."""
START_WAIT = 60.0
"""Seconds a gated service's container may take to run once the engine made it."""


def gated_services(env: Environment, *, copied: bool) -> list[str]:
    """The services whose command waits to be prepared: those with a `workdir`, and, where
    the static assets are copied in (`copied`: nothing of this machine is mounted), those
    that show them. The compilers gate these; the runtime prepares these."""
    statics = bool(env.spec.static_assets)
    return [
        name
        for name, svc in sorted(env.spec.services.items())
        if svc.workdir is not None or (copied and statics and svc.static_assets)
    ]


def unpack(
    engine: Engine, container: str, service: str, archive: bytes, script: list[str], name: str
) -> None:
    """Unpack an archive (archives.py) into a running service's container, as root;
    StartupError naming the environment `name` and the service when that fails."""
    try:
        engine.exec(
            container,
            ["/bin/sh", "-c", *script],
            user="0:0",
            input=archive,
            action=f"preparing {service}",
            seconds=up_timeout(),
        )
    except DockerError as exc:
        raise StartupError(
            f"{name}: could not prepare {service!r} (its image needs /bin/sh and "
            f"tar): {exc.stderr.strip() or exc}"
        ) from exc


def _wait_running(engine: Engine, container: str, name: str) -> None:
    """Wait (bounded by START_WAIT) until the container runs: an orchestrator may report a
    task started while its container is still being created."""
    deadline = time.monotonic() + START_WAIT
    while True:
        state = engine.status(container)
        if state == "running":
            return
        if state not in ("created", "restarting") or time.monotonic() > deadline:
            raise StartupError(f"service {name!r} did not start (its container is {state})")
        time.sleep(0.1)


def _words(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def drops_privileges(user: str | None, workdir: str | None) -> bool:
    """Whether a service runs its PID 1 (the GATE) as root and its command as `user`: a
    service with a `workdir` and a user other than root is a sandbox like the main one, whose
    root commands keep their capabilities under no-new-privileges (they have none in a
    container whose own user is not root)."""
    return workdir is not None and user is not None and user not in ("0", "0:0", "root")


@dataclass(frozen=True)
class Who:
    """Who the engine makes a user: ids, groups and HOME."""

    uid: str
    gid: str
    groups: str
    home: str

    def drop(self) -> str:
        """Shell text that runs "$@" as this user (setpriv of util-linux, else python3)."""
        u, g, gs = self.uid, self.gid, self.groups
        groups = f"--groups={gs}" if gs else "--clear-groups"
        return (
            f"export HOME={shlex.quote(self.home)}\n"
            "if setpriv --help 2>&1 | grep -q -- --reuid; then "
            f'exec setpriv --reuid={u} --regid={g} {groups} -- "$@"; fi\n'
            "if command -v python3 >/dev/null 2>&1; then "
            f'exec python3 -c {shlex.quote(DROP_PY)} {u} {g} {shlex.quote(gs)} "$@"; fi\n'
            f"echo 'orchestrator: starting the command as {u}:{g} needs setpriv (util-linux) "
            "or python3 in the image' >&2; exit 126\n"
        )


def entrypoint_words(entrypoint: Sequence[str] | str | None) -> list[str] | None:
    """A service's `entrypoint` as argv (a string is split as Compose splits it)."""
    if entrypoint is None:
        return None
    return shlex.split(entrypoint) if isinstance(entrypoint, str) else list(entrypoint)


def start_text(
    entrypoint: Sequence[str],
    image_cmd: Sequence[str],
    command_given: bool,
    workdir: str | None,
    who: Who | None = None,
) -> str:
    """START_FILE's text: the argv the engine would have run, as `set --` (the file's
    command, when it gives one, is already the GATE's arguments), the workdir to start in
    (made again after the GATE started in the engine's empty one), and, from a root PID 1,
    the user to become (`who`)."""
    words = " ".join(shlex.quote(w) for w in [*entrypoint, *([] if command_given else image_cmd)])
    tail = ' "$@"' if command_given else ""
    check = "[ $# -gt 0 ] || { echo 'orchestrator: the service has no command' >&2; exit 127; }"
    cd = f"cd -- {shlex.quote(workdir)} || exit 1\n" if workdir else ""
    return f"{cd}set -- {words}{tail}\n{check}\n{who.drop() if who else ''}"


def _exec(target: ExecTarget, name: str, script: str, args: Sequence[str], **how: Any) -> str:
    """Run a preparation step in a service's container; its output, or a StartupError
    (`retry`: exit code RETRY returns None instead)."""
    try:
        out = target.engine.exec(
            target.container,
            ["/bin/sh", "-c", script, "sh", *args],
            workdir="/",  # from /: the workdir is made again meanwhile
            action=f"preparing {name}",
            seconds=up_timeout(),
            **how,
        )
    except DockerError as exc:
        if exc.returncode == RETRY:
            return str(RETRY)
        raise StartupError(
            f"could not prepare service {name!r} (its image needs /bin/sh, tar, mkdir, chmod "
            f"and stat): {exc.stderr.strip() or exc}"
        ) from exc
    return str(out or "").strip()


def _make_workdir(target: ExecTarget, name: str, workdir: str, user: str | None) -> None:
    """The service's user makes its own workdir (a root exec may have no capability to
    chown): in its parent if it may write there, else in the parent opened for a moment."""
    if _exec(target, name, MAKE_WORKDIR, [workdir, ""], user=user) != str(RETRY):
        return
    mode = _exec(target, name, OPEN_PARENT, [workdir], user="0:0")
    try:
        _exec(target, name, MAKE_WORKDIR, [workdir, "opened"], user=user)
    finally:
        _exec(target, name, CLOSE_PARENT, [workdir, mode], user="0:0")


def _who(target: ExecTarget, name: str, user: str) -> Who:
    words = _exec(target, name, WHO, [], user=user).splitlines()
    if len(words) != 4 or not all(w.isdigit() for w in words[:2]):
        raise StartupError(f"could not look up user {user} in service {name!r}: {words}")
    return Who(words[0], words[1], ",".join(words[2].split()), words[3])


def prepare_service(
    env: Environment,
    name: str,
    engine: Engine,
    container: str,
    *,
    copied: bool,
    policy: Policy | None = None,
) -> None:
    """Prepare gated service `name` (its container runs the GATE): its static assets when
    they are copied in, its workdir, made by its user, then START_FILE, last."""
    svc = env.spec.services[name]
    _wait_running(engine, container, name)
    config = engine.image_config(container)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = static_into(tar, env, policy, 0o755) if copied and svc.static_assets else []
    target = engine.exec_target(container)
    workdir = svc.workdir or ""
    user = resolve_user(svc.user) if svc.user else None
    _exec(target, name, UNPACK, [workdir, *folders], user="0:0", input=out.getvalue())
    if workdir:
        _make_workdir(target, name, workdir, user)
    who = _who(target, name, user) if user and drops_privileges(user, svc.workdir) else None
    entrypoint = entrypoint_words(svc.entrypoint)
    text = start_text(
        _words(config.get("Entrypoint")) if entrypoint is None else entrypoint,
        _words(config.get("Cmd")) if entrypoint is None else [],
        svc.command is not None,
        svc.workdir,
        who,
    )
    if who is not None and svc.healthcheck is not None:
        _exec(target, name, _written(DROP_FILE), [], user="0:0", input=who.drop().encode())
    _exec(target, name, RELEASE, [], user="0:0", input=text.encode())


def prepare_services(
    env: Environment,
    locate: Callable[[str], tuple[str, Engine]],
    copied: bool,
    policy: Policy | None,
) -> list[str]:
    """Prepare each gated service (`prepare_service`; `locate`: the runtime's placement):
    its command starts once its static assets (when `copied`) and workdir are in place.
    Returns those with a healthcheck, for the caller to wait on."""
    gated = gated_services(env, copied=copied)
    for service in gated:
        container, engine = locate(service)
        prepare_service(env, service, engine, container, copied=copied, policy=policy)
    return [s for s in gated if env.spec.services[s].healthcheck is not None]
