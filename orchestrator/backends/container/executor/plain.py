"""The plain-exec path: one `docker exec` per command, for images where the executor cannot
run (no python3). Still kills the whole tree inside the container on timeout, by a second
exec (`KILL_TREE`) that kills: every process of the command's session (docker starts each
exec as a session of its own; the command names it, `$$`, on the first line of its stderr,
which is taken off before anyone sees it), every descendant of a process it found, and every
process whose /proc/PID/environ holds the command's unique marker (a `setsid` daemon), with
the sessions of those too. So a child that cleared its environment (`env -i`) is found by
its session or its parent, and one that left the session by its marker; only one that does
both (and outlives its parent) escapes, as it would escape the executor's kill. A kill that
came before the command's first line did (a busy engine starts an exec late, after its killed
client) leaves a mark the command looks for before it runs (TOMB).

The killer uses shell builtins only (read, kill, case, echo: no `tr`, `grep` or `ps`), so it
needs one process, the exec itself, however many the command took: a fork loop that filled
the pids limit cannot stop it (the engine moves an exec into a full cgroup). It freezes what
it finds (SIGSTOP) until a whole pass finds nothing new, so nothing forks or is reparented
away while it looks, then sends the signal (and SIGCONT, so a SIGTERM is acted on). A
timeout's SIGTERM waits out its grace in the same exec (reading the sandbox's clock in
/proc/uptime; no `sleep`), which then looks again and sends SIGKILL: one exec, not two. Where
even the exec cannot start (an engine that charges it to the full pids limit), it is retried
until KILL_TIMEOUT; if it never ran, the command raises SandboxUnavailable: its processes
may still run, and the sandbox cannot start a process anyway.

POSIX sh only: nothing is installed in the image, and nothing is left behind in it but, in
one race (see TOMB), an empty file in its /dev/shm."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time

from orchestrator import procutil
from orchestrator.backends.container import freeze
from orchestrator.backends.container.engine import (
    Engine,
    exec_impossible,
    exec_refusal,
    no_process,
)
from orchestrator.backends.container.layout import STAT_FIELDS
from orchestrator.errors import (
    BackendUnavailable,
    NoTerminal,
    OrchestratorError,
    SandboxUnavailable,
)
from orchestrator.sandbox.options import Chunks, Command, stdin_chunks
from orchestrator.tables import printable

log = logging.getLogger("orchestrator.docker")
MARK = "ORCHESTRATOR_CMD"
HOLD_LIMIT = 64 * 1024
"""Most stdout held before the command's session line: the docker CLI prints why the engine
would not start a command there (an unknown user, a missing cwd), never more."""
RUNTIME_REFUSED = 126
"""How the docker CLI exits when the engine's runtime would not start a process."""
REFUSED = (125, RUNTIME_REFUSED, 127)
"""How the docker CLI exits when the engine would not start a command (what it printed then
is its reason); any other status is the command's own, whatever came before its session."""
KILL_TIMEOUT = 30.0
"""Longest the in-container kill may take, retries included (an engine that does not
answer, a sandbox that cannot start the killer). A busy engine takes seconds to start one
`docker exec` (5 s was seen to cut the killer before its first pass: the command's
processes lived on). A timed-out command's kill is bounded as a whole: its SIGTERM passes
take at most half of this, and its SIGKILL passes (the timeout's, then a caller's that gave
up) this in all, 1.5 times this at most (a root sandbox whose /bin/sh never ends made a
`timeout=1` call take twice this, and more). A SIGKILL that did not end in time is said
(SandboxUnavailable: the command may still run), never taken for a kill."""
TOMB = "/dev/shm/.orchestrator-cancelled-"
"""+ the command's mark: left by the plain path's kill of a command not yet seen to start
(a busy engine may start a `docker exec` seconds after its client asked, and after the
client was killed at the timeout). The command looks for it first, and removes it and ends
instead of running: the killer writes it before its first pass, so a command that looked
too early is already a process with the mark, which that pass finds (its mark then stays,
an empty file). The killer opens it read-write (`<>`): a FIFO planted there does not hold
it, and a file or link planted there is not emptied. Only the command's own uid (and root)
knows the token: the killer is given it in its environment, never in its argv."""
KILL_TOKEN = "ORCHESTRATOR_KILL"
"""The killer's variable for the token it looks for (its argv is any uid's to read)."""
# The command, through sh: first its session on stderr (echo and [ are builtins everywhere)
SESSION = b"orchestrator-session:"
WRAP = (
    f'if [ -e "{TOMB}${MARK}" ]; then rm -f "{TOMB}${MARK}"; exit 137; fi; '
    'echo "orchestrator-session:$$" >&2; exec "$@"'
)
KILLER_TAIL = 64 * 1024
"""Most bytes of each of the killer's streams kept (its last line is what it says)."""
MAX_SESSIONS = 4096
"""Most sessions a pass may name for the next (each a word of the next pass's argv)."""
DONE = "orchestrator-killed:"
"""The killer's last line, then the sessions it found (passed to the next pass). Taken only
as the last line of a pass that exited 0: the command's processes run as the killer's uid,
and one could write the line into the killer's output and kill it (a hostile review)."""
TERMED = b"orchestrator-termed"
"""A timeout's pass's line once its SIGTERM is sent: from then its processes run again,
and may stop or kill the killer (same uid), so the rest of the pass must end within its
grace and AFTER_GRACE, or it is cut and a pass of its own sends the SIGKILL."""
AFTER_GRACE = 1.5
"""Seconds a timeout's pass may take past its grace (its second look, and its exit)."""
# `ORCHESTRATOR_KILL=TOKEN sh -c KILL_TREE sh SIGNAL CANCEL THEN [SESSION...]`: builtins
# only (see the module docstring); CANCEL 1: a SIGKILL leaves the command's mark (TOMB) when
# no session is known yet; THEN > 0: after SIGNAL, wait up to THEN hundredths of a second
# for what it hit to end, then look again and SIGKILL what is found (a timeout's SIGTERM,
# grace and SIGKILL in one exec: a busy engine takes seconds to start each)
KILL_TREE = (
    STAT_FIELDS
    + r"""
t=$ORCHESTRATOR_KILL; m="ORCHESTRATOR_CMD=$t"; sig=$1; cancel=$2; then=$3; shift 3; me=$$
sids=" "; k=; case $t in ""|*[!0-9a-f]*) ;; *) k="ORCHESTRATOR_KILL=$t" ;; esac
for s in "$@"; do [ "$s" -gt 1 ] 2>/dev/null && sids="$sids$s "; done
tomb() {
  if [ "$sids" = " " ] && [ "$cancel" = 1 ] && [ -n "$k" ]; then
    { : <> "@TOMB@$t"; } 2>/dev/null
  fi
}
sweep() {  # stop every process of the command, until a whole look finds nothing new
  hit=" "; quiet=0; n=0
  while [ $quiet -lt 2 ] && [ $n -lt 300 ]; do
    n=$((n + 1)); new=0
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      case $hit in *" $p "*) continue ;; esac
      if [ "$p" = "$me" ] || [ "$p" = 1 ]; then continue; fi
      fields $d 2>/dev/null || continue
      set -- $s
      [ "$1" = Z ] && continue
      take=
      case $sids in *" $4 "*) take=1 ;; esac
      case $hit in *" $2 "*) take=1 ;; esac
      if [ -z "$take" ]; then
        e=; l=
        { while IFS= read -r l || [ -n "$l" ]; do e="$e$l"; l=; done; } 2>/dev/null < "$d/environ"
        case $e in *"$m"*) take=1 ;; esac
        # an earlier pass of this kill, cut at its deadline, runs on: it would SIGCONT what
        # this one stops
        if [ -z "$take" ] && [ -n "$k" ]; then
          case $e in *"$k"*) kill -KILL "$p" 2>/dev/null; continue ;; esac
        fi
      fi
      [ -n "$take" ] || continue
      kill -STOP "$p" 2>/dev/null || continue
      hit="$hit$p "; new=1
      if [ "$4" -gt 1 ]; then case $sids in *" $4 "*) ;; *) sids="$sids$4 " ;; esac; fi
    done
    if [ $new = 1 ]; then quiet=0; else quiet=$((quiet + 1)); fi
  done
}
send() {  # $1 to every process hit, and SIGCONT (so that a SIGTERM is acted on) unless $2
  for p in $hit; do kill -"$1" "$p" 2>/dev/null; [ -n "$2" ] || kill -CONT "$p" 2>/dev/null; done
}
now() {  # u: this sandbox's uptime in hundredths of a second ("" where it cannot be read)
  u=; read -r u _ < /proc/uptime 2>/dev/null
  case $u in [0-9]*.[0-9][0-9]) u=${u%.*}${u#*.} ;; *) u=; return ;; esac
  while :; do case $u in 0?*) u=${u#0} ;; *) break ;; esac; done
}
alive() {  # whether a process hit is there and not a zombie
  for p in $hit; do
    fields /proc/$p 2>/dev/null || continue
    set -- $s
    [ "$1" = Z ] || return 0
  done
  return 1
}
[ "$sig" = KILL ] && tomb
sweep
case $sig in STOP|TSTP|TTIN|TTOU) send "$sig" 1 ;; *) send "$sig" ;; esac
if [ "$then" -gt 0 ] 2>/dev/null && [ "$sig" != KILL ]; then
  echo "@TERMED@"
  now; end=; [ -z "$u" ] || end=$((u + then)); i=0
  while alive && [ $i -lt 5000 ]; do  # (a count bounds it where there is no clock)
    i=$((i + 1)); now
    [ -n "$end" ] && [ -n "$u" ] && [ "$u" -ge "$end" ] && break
  done
  tomb; sweep; send KILL 1
fi
echo "orchestrator-killed:$sids"
""".replace("@TOMB@", TOMB).replace("@TERMED@", "orchestrator-termed")
)


class Killer:
    """Kills one command's processes inside the container (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        container: str,
        user: str | None,
        token: str | None = None,
        sessions: list[str] | None = None,
    ) -> None:
        self._engine, self._container = engine, container
        self.user = user
        self.token = token or os.urandom(16).hex()  # (made for every command: no uuid)
        """The command's mark (MARK=token in its environment)."""
        self.sessions: list[str] = list(sessions or [])
        """Sessions found by earlier passes: their processes die in later ones, even once
        nothing marked is left to find them by."""
        self.no_process = b""
        """Why the killer could not run at all, when the sandbox cannot start a process."""
        self.cancels = False
        """Whether its kill leaves the command's mark (TOMB) while no session of the
        command is known: set by the plain path, whose command reads the mark."""
        self.refusal = b""
        """What the engine said when it would not start the command (set by run_plain)."""
        self.ran = False
        """Whether a pass ran to its end (False: the engine refused it, e.g. while the
        sandbox was paused: the command's processes may still be there)."""
        self._spent = {signal.SIGTERM: 0.0, signal.SIGKILL: 0.0}
        """Seconds the SIGTERM and the SIGKILL passes of its kill took so far (KILL_TIMEOUT)."""
        self.unfinished = False
        """Whether its last SIGKILL pass ended without being done (cut at its deadline, or
        ended or killed in a sandbox not paused, stopped or gone): its processes may run."""
        self._one = threading.Lock()
        """One pass at a time (the timeout's kill, a caller's signal, an owed kill): each
        pass kills the passes of its token still running."""
        self._swept: set[str] | None = None
        """The sessions the last pass SIGKILLed, once it ran to its end (a SIGKILL's pass, or
        a timeout's that sent its SIGKILL after the grace); None while none did. A SIGKILL
        needs no pass of its own while it covers every session known, and one learned since
        gets one (a busy engine starts a command late: its session line may come while that
        pass runs, or after it, and a command that cleared its environment at once, `exec
        env -i`, is found by nothing else; CI, once)."""
        self._learning = threading.Lock()
        """Held to add to `sessions` or replace it: the reader thread learns the command's
        session while the watchdog's pass merges what it found (a hostile review lost one
        between the two)."""

    def finish(self) -> bool:
        """Kill what is left of the command now (once the sandbox can run the killer again:
        see backends/container/owed.py); whether this kill's pass ran (not an earlier one:
        a kill owed is kept until one does)."""
        with self._one:
            self.ran = False
            self._passes(signal.SIGKILL)
        return self.ran

    def signal(self, sig: int) -> None:
        """Send `sig` to every process of the command (a started process's `signal`)."""
        with self._one:
            self._passes(sig)

    def frozen(self) -> bool:
        """Kill what is left of the command while its sandbox is paused, from this host (see
        freeze.kill_frozen): each process dies at the thaw, before it runs again. Whether
        that could be done (False: its processes cannot be seen or read from here, and the
        kill is owed until the thaw)."""
        marks = {MARK.encode(): self.token.encode(), b"session": " ".join(self.sessions).encode()}
        try:
            self.ran = freeze.kill_frozen(self._engine, self._container, marks)
        except OrchestratorError as exc:
            log.warning("could not kill a command in its paused sandbox: %s", exc)
            return False
        return self.ran

    def __call__(self, client: subprocess.Popen[bytes], sig: int) -> None:
        """The kill of a command that timed out or whose caller gave up (procutil's
        `killer`, whose SIGTERM is followed by a SIGKILL after procutil.GRACE): its SIGTERM
        passes take KILL_TIMEOUT / 2 in all, its SIGKILL passes KILL_TIMEOUT in all. The
        SIGTERM pass waits the grace in the container and sends the SIGKILL itself, so a
        timeout costs one exec, not two; the SIGKILL's own pass runs only if that one did
        not end."""
        kind = signal.SIGKILL if sig == signal.SIGKILL else signal.SIGTERM
        share = KILL_TIMEOUT if kind == signal.SIGKILL else KILL_TIMEOUT / 2
        began = time.monotonic()
        try:
            with self._one:
                if kind == signal.SIGKILL and self._covered():
                    pass  # done by the SIGTERM's pass, which looked again before its SIGKILL
                elif self._spent[kind] < share:
                    then = procutil.GRACE if kind == signal.SIGTERM else 0.0
                    self._passes(sig, share - self._spent[kind], then)
        finally:
            self._spent[kind] += time.monotonic() - began
            if sig == signal.SIGKILL:
                client.kill()  # and the local docker client, which a paused sandbox would hold

    def learn(self, session: str) -> None:
        """The command's session, from its first line (read as the command runs)."""
        with self._learning:
            self.sessions.append(session)

    def _covered(self) -> bool:
        """Whether the last pass SIGKILLed every session known, and knew one (none known: the
        command's line may still be on its way)."""
        with self._learning:
            swept = self._swept
            if not swept:
                return False
            return swept.issuperset(self.sessions)

    def finish_late(self) -> bool:
        """After a timeout's kill that ran to its end: a SIGKILL pass for the sessions learned
        since (a session line read only once the kill was done), within what is left of its
        SIGKILL share; whether none is left unkilled. A kill that did not run to its end is
        said otherwise (`unfinished`, `no_process`; a paused sandbox's kill is owed)."""
        with self._one:
            if self._swept is None or self._covered() or not self.sessions:
                return True
            left = KILL_TIMEOUT - self._spent[signal.SIGKILL]
            if left <= 0:
                return False
            began = time.monotonic()
            try:
                self.ran = False
                self._passes(signal.SIGKILL, left)
            finally:
                self._spent[signal.SIGKILL] += time.monotonic() - began
            return self.ran and self._covered()

    def _passes(self, sig: int, within: float | None = None, then: float = 0.0) -> None:
        """Passes sending `sig` until one runs (or KILL_TIMEOUT, else `within`, is over);
        `then` > 0: each waits up to that many seconds for what it hit to end, then sends
        SIGKILL to what it finds (see KILL_TREE)."""
        name = signal.Signals(sig).name.removeprefix("SIG")
        deadline = time.monotonic() + (KILL_TIMEOUT if within is None else within)
        pause = 0.05
        while True:
            said = self._once(name, deadline, then)
            if said is None:  # done, or the engine does not answer
                break
            self.no_process = said
            if time.monotonic() + pause >= deadline:
                break
            time.sleep(pause)  # a fork loop may free a slot (a shell dies at its failure)
            pause = min(pause * 2, 0.5)

    def _once(self, name: str, deadline: float, then: float = 0.0) -> bytes | None:
        """One pass: what it said when the sandbox or the engine could not start it (the
        caller retries until KILL_TIMEOUT); else None: it ran, or failed otherwise (paused,
        stopped, gone: the caller's probe says so)."""
        # as the command's own user: root in a container has no CAP_SYS_PTRACE, so it
        # cannot read another uid's environ; the same uid can, and may signal it
        target = self._engine.exec_target(self._container)
        env = {KILL_TOKEN: self.token}
        argv = target.argv(["/bin/sh", "-c", KILL_TREE, "sh"], user=self.user, env=env)
        with self._learning:  # (the command's session line may add one meanwhile)
            known = list(self.sessions)
            self._swept = None
        argv += [name, "1" if self.cancels else "0", str(round(then * 100)), *known]
        kept = {"stdout": bytearray(), "stderr": bytearray()}
        # bounded both ways: the sandbox's /bin/sh (a root sandbox may replace it) may print
        # without end, or never end; only the last KILLER_TAIL bytes of each stream are kept
        left = max(0.1, deadline - time.monotonic())
        clients: list[subprocess.Popen[bytes]] = []
        chunks = procutil.run(  # (marked)
            argv, procutil.marked_environ(), None, timeout=left, on_start=clients.append
        )
        code, cut, timer = 0, False, None
        try:
            with procutil.kept_on():  # (the kill of a command its caller gave up on)
                while True:
                    kind, data = next(chunks)
                    kept[kind] += data
                    del kept[kind][:-KILLER_TAIL]
                    if then > 0 and timer is None and TERMED in kept["stdout"]:
                        timer = threading.Timer(then + AFTER_GRACE, _end, (clients,))
                        timer.daemon = True
                        timer.start()
        except StopIteration as stop:
            code, cut = stop.value.exit_code, stop.value.timed_out
        except (OSError, procutil.NoProcess):
            return None
        finally:
            if timer is not None:
                timer.cancel()
            chunks.close()
        out, err = bytes(kept["stdout"]), bytes(kept["stderr"])
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if lines and lines[-1].startswith(DONE) and code == 0 and not cut:
            found = lines[-1].removeprefix(DONE).split()[:MAX_SESSIONS]
            with self._learning:  # (learned meanwhile first: never cut by a full list)
                late = [sid for sid in self.sessions if sid not in known]
                self.sessions = list(dict.fromkeys(late + known + found))[:MAX_SESSIONS]
                if name == "KILL" or then > 0:
                    self._swept = {*known, *found}
            self.no_process = b""
            self.ran = True
            if name == "KILL" or then > 0:
                self.unfinished = False
            return None
        said = out + err
        # the sandbox could not start a process (the shell's words, or runc's), or the
        # engine would not start the pass (runc's refusal, 126) for a reason other than the
        # container being paused, stopped or gone (the caller's probe says which): a retry
        # may pass. Anything else (its shell ran and said no more: a root sandbox may
        # replace it) is the pass's end. Only a pass that exited with a status of its own
        # (the engine's refusals: 1, 125, 126) is read for such words: one killed by a
        # signal had started, and what it printed may be the command's (its uid may write
        # into the killer's output: a hostile review forged "is paused", then killed it)
        engine_said = 0 < code < 128
        impossible = engine_said and exec_impossible(said)
        if name == "KILL" or then > 0:  # not done: cut, or ended (a root sandbox's shell)
            self.unfinished = cut or not impossible  # or killed early
        if engine_said and (no_process(said) or (code == RUNTIME_REFUSED and not impossible)):
            return said.strip()[-HOLD_LIMIT:] or b"no answer"
        if impossible:  # paused, stopped or removed meanwhile: what an earlier pass said
            self.no_process = b""  # holds no more (a paused one's kill is owed: owed.py)
        return None


def _end(clients: list[subprocess.Popen[bytes]]) -> None:
    """Cut a pass that outlived its grace: its docker client killed (the pass, if it runs
    on in the sandbox, is killed by the next pass of its kill)."""
    for client in clients:
        with contextlib.suppress(OSError):
            client.kill()


def run_plain(
    engine: Engine,
    container: str,
    cmd: Command,
    out: int | None = None,
    *,
    killer: Killer | None = None,
) -> Chunks:
    """`cmd` by one `docker exec`. `out`: the read end of a FIFO the command's output goes
    to instead of through the engine (see `procutil.pump`). `killer`: the one that kills it
    (made here when None), which the caller keeps to kill it later if it could not then."""
    if cmd.tty is not None:
        raise NoTerminal()
    try:  # ids the engine's runtime may not refuse (runsc runs -1 as nobody): refused here
        procutil.numeric_ids(cmd.user or "")
    except procutil.UnknownUser as exc:
        yield "stderr", f"{exc}\n".encode()
        return procutil.Outcome(126, False, 0.0)
    killer = killer or Killer(engine, container, cmd.user)
    killer.cancels = True  # (its command reads the mark: WRAP)
    # through sh, so a missing program is 127 with the message on stderr, as everywhere else
    argv = engine.exec_target(container).argv(
        ["/bin/sh", "-c", WRAP, "sh", *cmd.argv],
        user=cmd.user,
        workdir=cmd.cwd,
        env={**cmd.env, MARK: killer.token},  # last: a caller's variable cannot hide the mark
        stdin=cmd.stdin is not None,
    )

    stdin = stdin_chunks(cmd.stdin) if cmd.stdin is not None else None
    chunks = procutil.run(  # (marked: ended by our guardian if we die first)
        argv,
        procutil.marked_environ(),
        None,
        stdin=stdin,
        timeout=cmd.timeout,
        killer=killer,
        out=out,
    )
    try:
        head: bytes | None = b""  # stderr until the session's line is complete
        held: bytes | None = b""  # stdout until then: the engine's refusal if it never comes
        while True:
            try:
                kind, data = next(chunks)
            except StopIteration as stop:
                outcome: procutil.Outcome = stop.value
                if head:
                    yield "stderr", head  # not our line after all (the exec failed)
                if held and outcome.exit_code in REFUSED:  # it never started: the refusal
                    code, said = exec_refusal(held, outcome.exit_code)
                    killer.refusal = held
                    outcome = outcome._replace(exit_code=code)
                    yield "stderr", said
                elif held:  # it ran, and the engine lost its session line (CI: once, gVisor)
                    yield "stdout", held
                if killer.no_process:
                    raise SandboxUnavailable(
                        "the sandbox cannot start a process (its pids or memory limit is "
                        "reached), so the processes of a command that timed out could not "
                        "be killed and may still run: "
                        + printable(killer.no_process.decode(errors="replace")[-300:])
                    ) from None
                if outcome.timed_out and not killer.finish_late():  # (its line came late)
                    killer.unfinished = True
                if outcome.timed_out and killer.unfinished:
                    raise SandboxUnavailable(
                        "the command timed out, and its kill did not end as it should "
                        f"(within {KILL_TIMEOUT:g} s; the sandbox's processes or its /bin/sh "
                        "held it back or stopped it): its processes may still run"
                    ) from None
                return outcome
            except procutil.NoProcess as exc:  # this host, not the sandbox, is out of processes
                raise BackendUnavailable(f"cannot start the docker client: {exc.strerror}") from exc
            if head is not None and kind == "stderr":
                head, data = _session(head + data, killer)
                if head is None:  # the first line is there: the command (or sh) runs
                    if cmd.control is not None:  # a started process: it may be signalled
                        cmd.control.bind(killer.signal, killer.finish)
                    if held:
                        yield "stdout", held
                    held = None
                if not data:
                    continue
            elif held is not None and kind == "stdout" and len(held) + len(data) <= HOLD_LIMIT:
                held += data  # (never more than HOLD_LIMIT held)
                continue
            elif held or (held is not None and kind == "stdout"):  # more than a refusal is
                if held:
                    yield "stdout", held
                held = None
            yield kind, data
    finally:
        if cmd.control is not None:
            cmd.control.unbind()
        chunks.close()  # a caller that gave up: the core kills the tree in the container


def _session(head: bytes, killer: Killer) -> tuple[bytes | None, bytes]:
    """Take the command's first stderr line, its session, off `head`: (what is still held,
    None once done; what goes on to the caller)."""
    if head.startswith(SESSION) and b"\n" not in head and len(head) < 64:
        return head, b""  # the line is not complete yet
    if SESSION.startswith(head):
        return head, b""
    line, newline, rest = head.partition(b"\n")
    if head.startswith(SESSION) and newline and line[len(SESSION) :].isdigit():
        killer.learn(line[len(SESSION) :].decode())
        return None, rest
    return None, head
