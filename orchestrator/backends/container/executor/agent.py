"""The in-container executor: started once per environment (`docker exec -i`, as root), it
runs each command it is sent in its own process group, as the requested user, and streams
the output back in frames. Timeouts are enforced here, inside the container, where the whole
process tree can be killed. Standard library only, Python 3.7+.

It never leaves a request unanswered: whatever it cannot do (an unknown user, an argument it
cannot pass, no process slot left) comes back as an error frame and an exit status. With
`--owned`, once the host has said OWN (on seeing its greeting), the end of its input means
its owner is gone (by any signal): it kills every command and stops the container. Before
OWN the host may have given up on it (a greeting later than the host waits, on a loaded
machine): the end of its input then stops nothing, whatever the host's `docker exec` lost.
"""

import errno
import hmac
import itertools
import json
import os
import queue
import re
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kept
import procutil
import spawner
import wire
from fds import close_all, connect_host, open_fifos, write_all
from spawnchild import recv_message

STATE = (
    "/dev/shm/orchestrator-executor" if os.path.isdir("/dev/shm") else "/run/orchestrator-executor"
)
"""Root-only folder (on tmpfs where there is one): one file per executor, listing the
sessions of its running commands."""
RECORD_NAME = re.compile(r"(\d+)(?:-\d+)?(\.tmp)?\Z")
"""A record's name in STATE: its executor's pid, a resident session's number, `.tmp` while
it is written."""
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


_oom = {}  # the counter's file, held open once it was read: {"fd": fd}


def oom_kills():
    """The cgroup's count of OOM kills (None: not to be had). Its file is kept open and
    read again from its start (pread) for each command: open and close cost more than
    the read."""
    held = _oom.get("fd")
    if held is not None:
        try:
            return _oom_count(os.pread(held, 4096, 0))
        except (OSError, ValueError):
            _oom.pop("fd", None)
            try:
                os.close(held)
            except OSError:
                pass
    for path in OOM_FILES:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            count = _oom_count(os.pread(fd, 4096, 0))
        except (OSError, ValueError):
            os.close(fd)
            continue
        if count is None:
            os.close(fd)
            continue
        _oom["fd"] = fd
        return count
    return None


def _oom_count(text):
    for line in text.decode("ascii", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


def session_of(pid):
    fields = procutil.stat_fields(pid)
    return int(fields[3]) if len(fields) > 3 else None


def reap_orphans():
    """Kill what a dead executor of this container left running. Each command leads its own
    session; executors record those sessions in STATE, and /proc/PID/stat (readable whatever
    the uid) says which processes still belong to them."""
    try:
        names = os.listdir(STATE)
    except OSError:
        return
    for name in names:
        named = RECORD_NAME.match(name)  # PID or PID-N (a resident's session), maybe .tmp
        if named is None or alive(named.group(1)):
            continue
        path = os.path.join(STATE, name)
        if named.group(2):  # a record a dead executor was writing: the last one stands
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        try:
            with open(path) as fh:
                sessions = {int(line) for line in fh if line.strip().isdigit()}
        except OSError:
            sessions = set()
        for pid in os.listdir("/proc"):
            if pid.isdigit() and session_of(pid) in sessions:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        try:
            os.unlink(path)
        except OSError:
            pass


def alive(pid):
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


class Flow:
    """Credit for one command's output frames; cancelled when the host gave up on it."""

    def __init__(self):
        self.cond = threading.Condition()
        self.credit = wire.WINDOW
        self.cancelled = False

    def acquire(self):
        """Wait for credit to send one frame; False when the frame should be dropped."""
        with self.cond:
            while self.credit <= 0 and not self.cancelled:
                self.cond.wait()
            self.credit -= 1
            return not self.cancelled

    def grant(self, count):
        with self.cond:
            self.credit += count
            self.cond.notify_all()

    def cancel(self):
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()


class Unpaced(Flow):
    """A kept process's output (kept.py): never waits for credit (each reader has its own)."""

    def acquire(self):
        return not self.cancelled


class Agent:
    def __init__(self, inp, out, owned, session=None, spawners=None):
        self.inp, self.out = inp, out
        self.ownable = owned  # --owned: the host may make it owned (OWN), until RELEASE
        self.owned = False
        self.lock = threading.Lock()
        self.stdin = {}
        self.procs = {}
        self.flows = {}
        self.held = {}  # signals sent to a command still starting: {cid: [signal, ...]}
        self.starting = threading.Lock()  # a command becoming known, or a signal held
        self.recording = threading.Lock()  # the record's look at `closed` and its write
        self.ttys = {}  # the terminals of commands run on one: {cid: procutil.Tty}
        self.spawners = spawners or spawner.Spawners()
        # a resident's connection (see resident()) is a session: its own record, one
        # command, no DIRECT
        self.session = session
        self.record_as = str(os.getpid()) if session is None else "%d-%d" % (os.getpid(), session)
        self.asked_direct = session is not None
        self.closed = False
        # a session's kept process (kept.py), or the one it reads (ATTACH): its Hub, and
        # this connection's Reader of it
        self.hub = None
        self.reader = None
        self.gone = False  # the session's connection ended
        self.ended = False  # its kept process ended

    def send(self, kind, cid, payload=b""):
        """A frame to the host; a kept process's own go to its readers (kept.py)."""
        hub = self.hub
        if hub is not None and hub.agent is self and cid == 1:
            if kind in (wire.OUT, wire.ERR):
                return hub.add(kind, payload)
            if kind == wire.EXIT:
                return hub.finish(payload)
            if kind == wire.TAKEN:
                return hub.taken(payload)
        self.send_here(kind, cid, payload)

    def send_here(self, kind, cid, payload=b""):
        with self.lock:
            try:
                write_all(self.out.fileno(), wire.pack(kind, cid, payload))
            except (BrokenPipeError, OSError, ValueError):
                pass

    def serve(self):
        info = {
            "pid": os.getpid(),
            "oom": oom_kills() is not None,
            "python": sys.version.split()[0],
            "setuid": can_switch_users(),
            "direct": not self.asked_direct,  # it takes DIRECT
        }
        self.send(wire.READY, 0, json.dumps(info).encode())
        try:
            while True:
                try:
                    frame = wire.read_frame(self.inp)
                except (ValueError, OSError):  # a broken frame, a reset: as if the host went
                    frame = None
                if frame is None or not self.allowed(*frame[:2]):
                    break
                self.handle(*frame)
        finally:
            if self.reader is not None:
                self.reader.close()
            keeps = self.hub is not None and self.hub.agent is self
            for cid in list(self.flows):  # the host went away: nothing may outlive it
                if not keeps:  # (but a kept process)
                    self.kill(cid)
            if self.owned:
                stop_container()
            if self.session is not None:  # a session's record goes with it (a kept
                with self.starting:  # process's, once that ended: see finish)
                    self.gone = True
                    close = not keeps or self.ended
                if close:
                    self.closed = True
                    self.record()

    def allowed(self, kind, cid):
        """A resident's session runs one command, number 1 (endpoint.py): any other
        frame ends it."""
        if self.session is None:
            return True
        if kind in (wire.RUN, wire.ATTACH):
            return cid == 1 and not self.flows and self.hub is None
        return cid == 1 or kind == wire.PING

    def handle(self, kind, cid, payload):
        if self.reader is not None and kind in (wire.STDIN, wire.STDIN_EOF):
            self.hub.write(self.reader, kind, payload)  # (to a kept process: kept.py)
        elif self.reader is not None and kind in (wire.KILL, wire.SIGNAL, wire.RESIZE):
            self.hub.agent.act(kind, 1, payload)
        elif self.reader is not None and kind == wire.CREDIT:
            if len(payload) == wire.COUNT.size:
                self.reader.grant(wire.COUNT.unpack(payload)[0])
        elif kind == wire.RUN:
            self.start(cid, payload)
        elif kind == wire.ATTACH and self.session is not None:
            self.attach(payload)
        elif kind == wire.PING:
            self.send_here(wire.PONG, cid)
        elif kind == wire.OWN:
            self.owned = self.ownable
        elif kind == wire.RELEASE:
            self.owned = self.ownable = False
        elif kind == wire.DIRECT and not self.asked_direct and not self.flows:
            self.go_direct(payload)
        else:
            self.act(kind, cid, payload)

    def act(self, kind, cid, payload):
        """What the host asks of one of this executor's own commands."""
        if kind == wire.STDIN and cid in self.stdin:
            self.stdin[cid].put(payload)
        elif kind == wire.STDIN_EOF and cid in self.stdin:
            self.stdin[cid].put(None)
        elif kind == wire.CREDIT and cid in self.flows and len(payload) == wire.COUNT.size:
            self.flows[cid].grant(wire.COUNT.unpack(payload)[0])
        elif kind == wire.KILL:
            self.kill(cid)
        elif kind == wire.SIGNAL and cid in self.flows and len(payload) == wire.COUNT.size:
            self.signal(cid, wire.COUNT.unpack(payload)[0])
        elif kind == wire.RESIZE and cid in self.ttys and len(payload) == wire.SIZE.size:
            self.ttys[cid].resize(*wire.SIZE.unpack(payload))

    def attach(self, payload):
        """ATTACH: this connection reads a kept process from its cursor on (GONE when no
        kept process has the id: nothing else is said)."""
        try:
            ident, cursor = wire.decode_attach(payload)
        except ValueError:
            hub = None
        else:
            hub = kept.find(ident)
        if hub is None:
            self.send_here(wire.GONE, 1)
            return
        with hub.cond:
            cursor = min(cursor, hub.end)
        self.send_here(wire.AT, 1, wire.OFFSET.pack(cursor))
        try:
            reader = self.follow(hub, cursor)
        except RuntimeError:  # no thread: the pids limit
            end = wire.Exit(126, False, 0.0, unavailable="cannot start a thread")
            self.send_here(wire.EXIT, 1, wire.encode_exit(end))
            return
        self.hub, self.reader = hub, reader

    def go_direct(self, payload):
        """Carry every later frame over the host's socket (see direct.py on the host): a
        path under the folder the host shares with this container alone, and the token the
        host takes that connection by. Asked once, before any command; on any failure the
        pipes stay, and the host is told why."""
        self.asked_direct = True
        try:
            ask = json.loads(payload.decode())
            sock = connect_host(str(ask["path"]), bytes.fromhex(ask["token"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.send(wire.NOT_SWITCHED, 0, str(exc)[:200].encode("utf-8", "replace"))
            return
        with self.lock:
            try:
                write_all(self.out.fileno(), wire.pack(wire.SWITCHED, 0))
            except OSError:  # the host is gone: its end of input follows
                sock.close()
                return
            self.out = sock
        self.inp = sock.makefile("rb")

    def kill(self, cid):
        flow = self.flows.get(cid)
        if flow is not None:
            flow.cancel()
        proc = self.procs.get(cid)
        if proc is not None:
            procutil.kill_tree(proc.pid, signal.SIGKILL)
        if cid in self.stdin:
            self.stdin[cid].put(None)

    def signal(self, cid, sig):
        """Send `sig` to a command's process group (held until it runs, if it is starting);
        a number no signal has is ignored."""
        if not 0 < sig < signal.NSIG:
            return
        with self.starting:
            proc = self.procs.get(cid)
            if proc is None:
                held = self.held.setdefault(cid, [])
                if sig not in held:  # pending once, as the kernel holds a signal
                    held.append(sig)
                return
        if proc.returncode is None:  # never the group of a pid already reaped
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass

    def start(self, cid, payload):
        self.flows[cid] = Flow()
        try:
            req = wire.decode_request(payload)
            if req.keep is not None and not self.keep(cid, req.keep):
                return
            if req.stdin:
                self.stdin[cid] = queue.Queue()
            procutil.in_thread(lambda: self.run(cid, req))
        except RuntimeError:  # no thread: the pids limit is reached
            self.refuse(cid, 126, "cannot start a thread", unavailable=True)
        except ValueError as exc:  # includes JSON errors
            self.refuse(cid, 125, "bad request: %s" % exc)

    def keep(self, cid, ident):
        """Make this session's command a kept one (kept.py), this connection its first
        reader; False (refused) where it cannot be."""
        if self.session is None:
            self.refuse(cid, 125, "only a resident's session keeps a process")
            return False
        try:
            hub = kept.register(ident, self)
        except (ValueError, kept.Full) as exc:
            self.refuse(cid, 125, "cannot keep the process: %s" % exc)
            return False
        try:
            reader = self.follow(hub, 0)
        except RuntimeError:  # no thread: the pids limit (start refuses it)
            kept.forget(ident)
            raise
        self.flows[cid] = Unpaced()
        self.hub, self.reader = hub, reader
        return True

    def follow(self, hub, cursor):
        """This connection's Reader of `hub` from `cursor` on, sending in a thread of its
        own (RuntimeError: no thread)."""
        reader = kept.Reader(hub, lambda kind, data: self.send_here(kind, 1, data), cursor)
        procutil.in_thread(reader.serve)
        return reader

    def refuse(self, cid, code, message, elapsed=0.0, unavailable=False):
        """Answer a request the executor cannot honour: an error frame and an exit status."""
        self.send(wire.ERR, cid, (message.rstrip("\n") + "\n").encode())
        self.finish(
            cid, wire.Exit(code, False, elapsed, unavailable=message if unavailable else "")
        )

    def feed(self, cid):
        q = self.stdin[cid]
        while True:
            chunk = q.get()
            if chunk is None:
                return
            yield chunk
            self.send(wire.TAKEN, cid, wire.COUNT.pack(1))  # written: the host may send one more

    def started(self, cid, proc, fifos):
        close_all(fifos)  # the command holds them now: its end of file is ours no more
        with self.starting:
            self.procs[cid] = proc
            held = self.held.pop(cid, ())
        self.record()
        if self.flows[cid].cancelled:  # KILL came while it was starting
            procutil.kill_tree(proc.pid, signal.SIGKILL)
        for sig in held:  # signals that came while it was starting
            self.signal(cid, sig)

    def run(self, cid, req):
        started = time.monotonic()
        before = oom_kills()
        env = dict(os.environ)
        env.update(req.env or {})
        flow = self.flows[cid]
        try:
            fifos = open_fifos(req)
        except OSError:  # not for us here (no CAP_DAC_OVERRIDE, an engine in a VM)
            self.finish(cid, wire.Exit(wire.NO_FIFO, False, time.monotonic() - started))
            return
        try:
            given = (
                req.argv,
                env,
                req.cwd,
                req.user,
                self.feed(cid) if cid in self.stdin else None,
            )
            if req.tty:
                env.setdefault("TERM", "xterm")  # as `docker exec -t` gives its command

                def on_tty(proc, tty):
                    self.ttys[cid] = tty
                    self.started(cid, proc, fifos)

                gen = procutil.run_tty(
                    *given, req.timeout, tuple(req.tty), on_tty, started, self.spawners
                )
            else:
                gen = procutil.run(
                    *given,
                    req.timeout,
                    started=started,
                    on_start=lambda proc: self.started(cid, proc, fifos),
                    stdio=(fifos[0], fifos[1]),
                    spawn=self.spawners,
                )
            try:
                while True:
                    kind, data = next(gen)
                    if flow.acquire():
                        self.send(wire.OUT if kind == "stdout" else wire.ERR, cid, data)
            except StopIteration as stop:
                outcome = stop.value
        except procutil.NoProcess as exc:
            self.refuse(cid, 126, exc.strerror, time.monotonic() - started, True)
            return
        except Exception as exc:  # a bug or a resource limit: answer, never go silent
            proc = self.procs.get(cid)
            if proc is not None:
                procutil.kill_tree(proc.pid, signal.SIGKILL)
            self.refuse(cid, 125, "executor error: %r" % (exc,), time.monotonic() - started)
            return
        finally:
            close_all(fifos)
        # (asked only of a command SIGKILL ended: the answer is said of no other)
        after = oom_kills() if outcome.exit_code == 137 and before is not None else None
        oom = after is not None and after > before
        self.finish(cid, wire.Exit(*outcome[:3], oom_killed=oom))

    def record(self):
        """Write the sessions of the running commands and of the spawners (for
        reap_orphans of a successor). One at a time: a command's record, written after its
        answer, must not land after the session's end removed the file."""
        with self.recording:
            try:
                path = os.path.join(STATE, self.record_as)
                if self.closed:
                    os.unlink(path)
                    return
                with open(path + ".tmp", "w") as fh:
                    pids = [p.pid for p in list(self.procs.values())] + self.spawners.pids()
                    fh.write("".join("%d\n" % pid for pid in pids))
                os.replace(path + ".tmp", path)
            except OSError:
                pass  # not root, or no /run: orphans then live until the environment goes down

    def finish(self, cid, outcome):
        ran = self.procs.pop(cid, None) is not None
        fed = self.stdin.pop(cid, None)
        if fed is not None:
            fed.put(None)  # whoever feeds the command its input stops: it ended
        self.flows.pop(cid, None)
        self.held.pop(cid, None)
        self.ttys.pop(cid, None)
        self.send(wire.EXIT, cid, wire.encode_exit(outcome))
        if ran:  # (after the answer: the host waits for that, not for this file)
            self.record()
        if self.hub is not None and self.hub.agent is self:  # a kept process: its record
            with self.starting:  # goes once its session's connection went too
                self.ended = True
                close = self.gone
            if close:
                self.closed = True
                self.record()


def can_switch_users():
    """Whether commands may run as other users: CAP_SETUID and CAP_SETGID are effective (a
    root exec into a container whose own user is not root has no capabilities at all)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    return bool(caps & (1 << 6)) and bool(caps & (1 << 7))
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def stop_container():
    """Stop the sandbox: SIGTERM to PID 1 (the init, which passes it to the keep-alive loop)."""
    try:
        os.kill(1, signal.SIGTERM)
    except OSError:
        pass


SESSIONS = 32
"""Connections a resident serves at once (others are closed at once)."""
TOKEN_WITHIN = 2.0
"""Seconds a connection to the resident has to show its token."""


def resident():
    """`--resident`: the environment's endpoint for `orchestrator exec` (see resident.py on
    the host). Told on stdin where the host's meeting is and its token, it leaves docker
    exec's sight (two forks, a session of its own, stdio on /dev/null: still one thread),
    meets the host in the folder it shares with this container alone, receives there the
    listening socket the host made where no container sees it and the token its clients
    show, and serves each client that shows it as an executor of its own (one command, no
    DIRECT, not owned); a client's command dies with its connection."""
    ask = json.loads(sys.stdin.buffer.readline(4096).decode())
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    reap_orphans()  # a former resident's kept processes: nobody enforces their timeouts now
    conn = connect_host(str(ask["path"]), bytes.fromhex(ask["token"]))
    conn.settimeout(TOKEN_WITHIN)
    msg, fds = recv_message(conn, max_fds=1, limit=4096)
    conn.close()
    if len(fds) != 1:
        os._exit(1)
    listener = socket.socket(fileno=fds[0])
    token = bytes.fromhex(msg["token"])
    spawners = spawner.Spawners()
    free = threading.BoundedSemaphore(SESSIONS)
    for number in itertools.count(1):
        try:
            client, _ = listener.accept()
        except (InterruptedError, ConnectionAbortedError):
            continue
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                return
            time.sleep(0.05)  # out of descriptors or memory: a moment, then the next one
            continue
        if not free.acquire(blocking=False):
            client.close()
            continue
        try:
            procutil.in_thread(lambda c=client, n=number: session(c, n, token, spawners, free))
        except RuntimeError:  # no thread: the pids limit
            client.close()
            free.release()


def session(client, number, token, spawners, free):
    """One client of the resident: its token, then an executor's frames."""
    reader = None
    try:
        deadline = time.monotonic() + TOKEN_WITHIN  # for the whole token: no trickling
        shown = b""
        while len(shown) < len(token):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            client.settimeout(left)
            part = client.recv(len(token) - len(shown))
            if not part:
                return
            shown += part
        if not hmac.compare_digest(shown, token):
            return
        client.settimeout(None)
        reader = client.makefile("rb")
        Agent(reader, client, False, number, spawners).serve()
    except OSError:
        pass
    finally:
        if reader is not None:
            reader.close()
        client.close()
        free.release()


if __name__ == "__main__":
    try:
        os.makedirs(STATE, mode=0o700, exist_ok=True)
    except OSError:
        pass
    if sys.argv[1:] == ["--resident"]:
        resident()
        os._exit(0)
    reap_orphans()
    Agent(sys.stdin.buffer, sys.stdout.buffer, "--owned" in sys.argv[1:]).serve()
