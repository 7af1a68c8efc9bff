"""The in-container executor: started once per environment (`docker exec -i`, as root), it
runs each command it is sent in its own process group, as the requested user, and streams
the output back in frames. Timeouts are enforced here, inside the container, where the whole
process tree can be killed. Standard library only, Python 3.7+.

It never leaves a request unanswered: whatever it cannot do (an unknown user, an argument it
cannot pass, no process slot left) comes back as an error frame and an exit status. With
`--owned`, the end of its input means its owner is gone (by any signal): it kills every
command and stops the container.
"""

import errno
import json
import os
import queue
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import procutil
import wire

STATE = (
    "/dev/shm/orchestrator-executor" if os.path.isdir("/dev/shm") else "/run/orchestrator-executor"
)
"""Root-only folder (on tmpfs where there is one): one file per executor, listing the
sessions of its running commands."""
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
NO_PROCESS = (errno.EAGAIN, errno.ENOMEM)
"""fork() errors that mean the sandbox cannot start a process at all (pids or memory)."""


def oom_kills():
    for path in OOM_FILES:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def session_of(pid):
    try:
        with open("/proc/%s/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
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
        if not name.isdigit() or alive(name):
            continue
        path = os.path.join(STATE, name)
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


class Refused(Exception):
    """A request the executor cannot honour: (exit status, message, sandbox unavailable)."""

    def __init__(self, code, message, unavailable=False):
        Exception.__init__(self, message)
        self.code, self.message, self.unavailable = code, message, unavailable


class Agent:
    def __init__(self, inp, out, owned):
        self.inp, self.out, self.owned = inp, out, owned
        self.lock = threading.Lock()
        self.stdin = {}
        self.procs = {}
        self.flows = {}

    def send(self, kind, cid, payload=b""):
        with self.lock:
            try:
                self.out.write(wire.pack(kind, cid, payload))
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass

    def serve(self):
        info = {
            "pid": os.getpid(),
            "oom": oom_kills() is not None,
            "python": sys.version.split()[0],
        }
        self.send(wire.READY, 0, json.dumps(info).encode())
        while True:
            frame = wire.read_frame(self.inp)
            if frame is None:
                break
            self.handle(*frame)
        for cid in list(self.flows):  # the host went away: nothing may outlive it
            self.kill(cid)
        if self.owned:
            stop_container()

    def handle(self, kind, cid, payload):
        if kind == wire.RUN:
            self.start(cid, payload)
        elif kind == wire.STDIN and cid in self.stdin:
            self.stdin[cid].put(payload)
        elif kind == wire.STDIN_EOF and cid in self.stdin:
            self.stdin[cid].put(None)
        elif kind == wire.CREDIT and cid in self.flows and len(payload) == wire.COUNT.size:
            self.flows[cid].grant(wire.COUNT.unpack(payload)[0])
        elif kind == wire.KILL:
            self.kill(cid)
        elif kind == wire.PING:
            self.send(wire.PONG, cid)
        elif kind == wire.RELEASE:
            self.owned = False

    def kill(self, cid):
        flow = self.flows.get(cid)
        if flow is not None:
            flow.cancel()
        proc = self.procs.get(cid)
        if proc is not None:
            procutil.kill_tree(proc.pid, signal.SIGKILL)
        if cid in self.stdin:
            self.stdin[cid].put(None)

    def start(self, cid, payload):
        self.flows[cid] = Flow()
        try:
            req = json.loads(payload.decode())
            if req.get("stdin"):
                self.stdin[cid] = queue.Queue()
            threading.Thread(target=self.run, args=(cid, req), daemon=True).start()
        except RuntimeError:  # no thread: the pids limit is reached
            self.refuse(cid, Refused(126, "cannot start a thread", True))
        except ValueError as exc:  # includes JSON errors
            self.refuse(cid, Refused(125, "bad request: %s" % exc))

    def refuse(self, cid, why, elapsed=0.0):
        self.send(wire.ERR, cid, (why.message.rstrip("\n") + "\n").encode())
        self.finish(
            cid,
            {
                "exit_code": why.code,
                "timed_out": False,
                "elapsed": elapsed,
                "unavailable": why.message if why.unavailable else "",
            },
        )

    def feed(self, cid):
        q = self.stdin[cid]
        while True:
            chunk = q.get()
            if chunk is None:
                return
            yield chunk

    def spawn(self, req):
        env = dict(os.environ)
        env.update(req.get("env") or {})
        ids = None
        if req.get("user"):
            try:
                ids = procutil.resolve_ids(req["user"])
            except procutil.UnknownUser as exc:
                raise Refused(126, str(exc)) from None
            if ids[0] != os.geteuid():
                env["HOME"] = home_of(ids[0])
        try:
            return procutil.spawn(
                req["argv"], env, req.get("cwd"), ids, with_stdin=bool(req.get("stdin"))
            )
        except OSError as exc:
            if exc.errno in NO_PROCESS:
                raise Refused(126, "cannot start a process: %s" % exc.strerror, True) from None
            code, message = procutil.spawn_error(exc, req["argv"], req.get("cwd"))
            raise Refused(code, message.decode()) from None
        except (ValueError, TypeError, KeyError) as exc:  # NUL bytes, bad env keys, ...
            raise Refused(125, "cannot start the command: %s" % exc) from None

    def run(self, cid, req):
        started = procutil.time.monotonic()
        before = oom_kills()
        proc = None
        try:
            proc = self.spawn(req)
            self.procs[cid] = proc
            self.record()
            if self.flows[cid].cancelled:  # KILL came while it was starting
                procutil.kill_tree(proc.pid, signal.SIGKILL)
            stdin = self.feed(cid) if cid in self.stdin else None
            gen = procutil.pump(proc, stdin, req.get("timeout"), started=started)
            flow = self.flows[cid]
            try:
                while True:
                    kind, data = next(gen)
                    if flow.acquire():
                        self.send(wire.OUT if kind == "stdout" else wire.ERR, cid, data)
            except StopIteration as stop:
                code, timed_out, elapsed = stop.value
        except Refused as why:
            self.refuse(cid, why, procutil.time.monotonic() - started)
            return
        except Exception as exc:  # a bug or a resource limit: answer, never go silent
            if proc is not None:
                procutil.kill_tree(proc.pid, signal.SIGKILL)
            self.refuse(
                cid,
                Refused(125, "executor error: %r" % (exc,)),
                procutil.time.monotonic() - started,
            )
            return
        after = oom_kills()
        oom = before is not None and after is not None and after > before and code == 137
        self.finish(
            cid, {"exit_code": code, "timed_out": timed_out, "elapsed": elapsed, "oom_killed": oom}
        )

    def record(self):
        """Write the sessions of the running commands (for reap_orphans of a successor)."""
        try:
            path = os.path.join(STATE, str(os.getpid()))
            with open(path + ".tmp", "w") as fh:
                fh.write("".join("%d\n" % p.pid for p in list(self.procs.values())))
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # not root, or no /run: orphans then live until the environment goes down

    def finish(self, cid, outcome):
        if self.procs.pop(cid, None) is not None:
            self.record()
        self.stdin.pop(cid, None)
        self.flows.pop(cid, None)
        self.send(wire.EXIT, cid, json.dumps(outcome).encode())


def stop_container():
    """Stop the sandbox: SIGTERM to PID 1 (the init, which passes it to the keep-alive loop)."""
    try:
        os.kill(1, signal.SIGTERM)
    except OSError:
        pass


def home_of(uid):
    try:
        import pwd

        return pwd.getpwuid(uid).pw_dir
    except (ImportError, KeyError):
        return "/"


if __name__ == "__main__":
    try:
        os.makedirs(STATE, mode=0o700, exist_ok=True)
    except OSError:
        pass
    reap_orphans()
    Agent(sys.stdin.buffer, sys.stdout.buffer, "--owned" in sys.argv[1:]).serve()
