"""The in-container executor: started once per environment (`docker exec -i`, as root), it
runs each command it is sent in its own process group, as the requested user, and streams
the output back in frames. Timeouts are enforced here, inside the container, where the whole
process tree can be killed. Standard library only, Python 3.7+.
"""

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


class Agent:
    def __init__(self, inp, out):
        self.inp, self.out = inp, out
        self.lock = threading.Lock()
        self.stdin = {}
        self.procs = {}

    def send(self, kind, cid, payload=b""):
        with self.lock:
            try:
                self.out.write(wire.pack(kind, cid, payload))
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass

    def serve(self):
        self.send(
            wire.READY,
            0,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "oom": oom_kills() is not None,
                    "python": sys.version.split()[0],
                }
            ).encode(),
        )
        while True:
            frame = wire.read_frame(self.inp)
            if frame is None:
                break
            kind, cid, payload = frame
            if kind == wire.RUN:
                req = json.loads(payload.decode())
                if req.get("stdin"):
                    self.stdin[cid] = queue.Queue()
                threading.Thread(target=self.run, args=(cid, req), daemon=True).start()
            elif kind == wire.STDIN and cid in self.stdin:
                self.stdin[cid].put(payload)
            elif kind == wire.STDIN_EOF and cid in self.stdin:
                self.stdin[cid].put(None)
            elif kind == wire.KILL:
                proc = self.procs.get(cid)
                if proc is not None:
                    procutil.kill_tree(proc.pid, signal.SIGKILL)
        for proc in list(self.procs.values()):  # the host went away: nothing may outlive it
            procutil.kill_tree(proc.pid, signal.SIGKILL)

    def feed(self, cid):
        q = self.stdin[cid]
        while True:
            chunk = q.get()
            if chunk is None:
                return
            yield chunk

    def run(self, cid, req):
        started = procutil.time.monotonic()
        env = dict(os.environ)
        env.update(req.get("env") or {})
        ids = None
        if req.get("user"):
            uid, _, gid = req["user"].partition(":")
            ids = (int(uid), int(gid or uid))
            if ids[0] != os.geteuid():
                env["HOME"] = home_of(ids[0])
        before = oom_kills()
        try:
            proc = procutil.spawn(
                req["argv"], env, req.get("cwd"), ids, with_stdin=bool(req.get("stdin"))
            )
        except OSError as exc:
            code, message = procutil.spawn_error(exc, req["argv"], req.get("cwd"))
            self.send(wire.ERR, cid, message)
            self.finish(
                cid,
                {
                    "exit_code": code,
                    "timed_out": False,
                    "elapsed": procutil.time.monotonic() - started,
                },
            )
            return
        self.procs[cid] = proc
        self.record()
        stdin = self.feed(cid) if cid in self.stdin else None
        gen = procutil.pump(proc, stdin, req.get("timeout"), started=started)
        try:
            while True:
                kind, data = next(gen)
                self.send(wire.OUT if kind == "stdout" else wire.ERR, cid, data)
        except StopIteration as stop:
            code, timed_out, elapsed = stop.value
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
        self.send(wire.EXIT, cid, json.dumps(outcome).encode())


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
    Agent(sys.stdin.buffer, sys.stdout.buffer).serve()
