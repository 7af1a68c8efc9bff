"""The local backend: plain subprocesses on the host, for trusted code and machines without
Docker. It is also the reference the Docker backend is held to by the conformance suite."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import ClassVar

from orchestrator import procutil, settings
from orchestrator.errors import SandboxUnavailable, SpecIssue, UsageError
from orchestrator.paths import make_folders
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.options import Chunks, Command, SpawnOptions, stdin_chunks
from orchestrator.sandbox.results import Connection, RuntimeInfo
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import (
    Policy,
    check_host_paths,
    env_passthrough_warnings,
    raise_if,
)
from orchestrator.spec.resolve import MAIN, resolve_env

MARK = "ORCHESTRATOR_RUNTIME"
#: Host variables every local command gets, so that programs can be found at all.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "SHELL")


def _read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *dirnames]:
            p = Path(dirpath, name)
            mode = p.lstat().st_mode
            if not stat.S_ISLNK(mode):
                p.chmod(mode & ~0o222)
    root.chmod(root.stat().st_mode & ~0o222)


def _refusals(env: Environment, policy: Policy) -> list[SpecIssue]:
    """What cannot hold on this backend, whose commands are the caller's own processes: an
    egress allowlist, secrets, and gVisor's kernel."""
    out = []
    got, _ = policy.egress_of(env.spec, MAIN)
    if isinstance(got, tuple):
        out.append(
            SpecIssue(
                env.source,
                field="network.egress",
                message="the local backend runs commands on this host as the caller: nothing "
                "can hold them to an allowlist",
                fix="use the docker backend for an egress allowlist",
            )
        )
    setup, _ = policy.setup_egress_of(env.spec)
    if setup is not None and setup != got:
        out.append(
            SpecIssue(
                env.source,
                field="setup.egress",
                message="the local backend runs commands on this host as the caller: nothing "
                "can change what they reach while setup runs",
                fix="drop setup.egress (or make it network.egress), or use the docker backend",
            )
        )
    if env.spec.secrets:
        out.append(
            SpecIssue(
                env.source,
                field="secrets",
                message="the local backend runs commands on this host as the caller: no "
                "gateway stands between them and the secrets' hosts to put the values in",
                fix="use the docker backend for secrets",
            )
        )
    if policy.isolation_of(env.spec, MAIN) == "gvisor":
        out.append(
            SpecIssue(
                env.source,
                field="isolation",
                message="the local backend runs commands on this host's kernel as the caller: "
                "it has no gVisor",
                fix="use the docker backend for gvisor",
            )
        )
    return out


def _remove(owner: int, tmp: Path, mark: bytes, guard: subprocess.Popen[bytes] | None) -> None:
    """What a runtime leaves: processes carrying its mark, and its folder; then its guardian
    is told it is done with (it finds nothing left, and exits). Nothing in a child forked
    from the owner (`owner` is the owner's pid), which holds a copy of the runtime at its
    exit or when it drops it: the runtime is its parent's, still in use."""
    if os.getpid() != owner:
        return
    procutil.kill_marked(mark)
    procutil.remove_tree(str(tmp))
    if guard is not None and guard.stdin is not None:
        with contextlib.suppress(OSError):
            guard.stdin.close()


GUARD = (
    "import sys; from orchestrator import procutil; "
    "procutil.guard_marked(int(sys.argv[1]), sys.argv[2], sys.argv[3].encode(), sys.argv[4])"
)


def _guard(tmp: Path, mark: str) -> subprocess.Popen[bytes] | None:
    """A guardian of this runtime (see `procutil.guard_marked`): when the owner dies, by any
    signal, its processes and folder go all the same."""
    if not settings.GUARDIAN.get():
        return None
    pid = os.getpid()
    guard = procutil.guardian(GUARD, [str(pid), procutil.process_start(pid), mark, str(tmp)])
    # reaped whenever it ends, whoever still holds the runtime
    threading.Thread(target=guard.wait, name="orchestrator-local-guard", daemon=True).start()
    return guard


class LocalRuntime(Runtime):
    name: ClassVar[str] = "local"
    isolated: ClassVar[bool] = False
    deviations: ClassVar[dict[str, str]] = {
        "resources": "no memory, cpu or pid limits, the file's or the default ones: processes "
        "run directly on the host (admission still counts them)",
        "isolation": "no file-system or network isolation; mounts, ports and network are ignored",
        "user": "commands run as the host user; another uid needs the caller to be root",
        "oom": "no memory limit, so nothing is reported as out-of-memory",
        "services": "no extra containers: a file's services are ignored (with a warning)",
        "suspend-filesystem": "suspend saves the workspace only: the host's filesystem is "
        "not the sandbox's, and there are no services",
        "fork-memory": "a fork copies the workspace only: host processes have no checkpoint, "
        "so the copy's start anew (setup.resume_commands)",
        "static-read-only-as-root": "static assets are read-only by file mode only, which "
        "does not stop root",
        "pause-freezer": "pause stops its processes with SIGSTOP (SIGCONT on resume), not a "
        "cgroup freezer: any process of the host user can continue them",
        "pause-in-flight": "a command running when the environment is paused waits, stopped, "
        "until resume or its own timeout, instead of failing with SandboxPaused (no executor "
        "stands between it and the caller)",
    }

    def __init__(self, env: Environment, options: SpawnOptions) -> None:
        super().__init__(env, options)
        self._tmp: Path | None = None
        self._leftovers: (
            weakref.finalize[[int, Path, bytes, subprocess.Popen[bytes] | None], LocalRuntime]
            | None
        ) = None
        self._workspace: Path | None = None
        self._static: Path | None = None
        self._env: dict[str, str] = {}
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._procs_lock = threading.Lock()
        self._mark = f"{MARK}={uuid.uuid4().hex}"
        """In every command's environment, so that cleanup finds processes that left the
        command's tree (`setsid` daemons) and were not killed with it."""

    def _host_workspace(self) -> Path | None:
        return self._workspace

    @classmethod
    def check(cls, env: Environment, policy: Policy, *, workspace: Path | None = None) -> list[str]:
        raise_if(_refusals(env, policy))
        return super().check(env, policy, workspace=workspace)

    # ----- lifecycle -----------------------------------------------------------------------
    def _start(self) -> None:
        spec = self.env.spec
        raise_if(_refusals(self.env, self.options.policy))
        self._tmp = Path(tempfile.mkdtemp(prefix=f"orch-local-{spec.name}-"))
        # a runtime dropped without cleanup (and collected) or still open at exit: its
        # processes and folder go all the same
        try:
            guard = _guard(self._tmp, self._mark)  # when this process is killed, by any signal
        except OSError as exc:  # no interpreter to run it: go on without, and say so
            guard = None
            self.warnings.append(f"local backend: no guardian ({exc}): a killed owner leaks")
        self._leftovers = weakref.finalize(
            self, _remove, os.getpid(), self._tmp, self._mark.encode(), guard
        )
        if self.options.workspace is not None:
            self._workspace = self.options.workspace
            make_folders(self._workspace)  # what is missing of it: 0700, whatever the umask
        else:
            self._workspace = self._tmp / "workspace"
            self._workspace.mkdir()
        self._static = self._tmp / "static"
        self._static.mkdir()
        roots = self.options.policy.mount_roots(self.env.base_dir, self.options.workspace)
        raise_if(
            check_host_paths(
                self.env.source,
                [
                    (f"static_assets.{i}", self.env.base_dir / a.path)
                    for i, a in enumerate(spec.static_assets)
                ],
                roots,
            )
        )
        for asset in spec.static_assets:
            src = (self.env.base_dir / asset.path).resolve()
            dst = self._static / asset.save_path
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst)
        _read_only(self._static)
        if (
            spec.mounts
            or spec.volumes
            or self.options.mounts
            or spec.network.ports
            or spec.services
        ):
            self.warnings.append("local backend: mounts, volumes, ports and services are ignored")
        host = {k: v for k, v in os.environ.items() if k in BASE_ENV}
        bind = spec.network.bind_host
        policy = self.options.policy
        self._env = {
            **host,
            **resolve_env(spec, self.options.env_vars, bind_host=bind, policy=policy),
        }
        asked = [n for n in spec.env_passthrough if n not in BASE_ENV]  # passed here anyway
        self.warnings += env_passthrough_warnings(asked, policy)
        key, _, value = self._mark.partition("=")
        self._env[key] = value

    def _close(self) -> None:
        self._kill()
        if self._leftovers is not None:
            self._leftovers()

    def _kill_processes(self) -> None:
        self._kill()

    def _kill(self) -> None:
        with self._procs_lock:
            procs = list(self._procs)
        for proc in procs:
            procutil.kill_tree(proc.pid, signal.SIGKILL)
        procutil.kill_marked(self._mark.encode())  # after a second, give up: poll() says so

    # ----- pause / resume: SIGSTOP and SIGCONT (see `deviations`) --------------------------
    def _pause(self) -> None:
        self._signal_all(signal.SIGSTOP)

    def _resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _frozen(self) -> bool:
        return self._paused  # no other process reaches this environment

    def _signal_all(self, sig: int) -> None:
        """Signal each running command's process group, then every process carrying this
        runtime's mark (daemons that left their command's tree), in passes until three in a
        row find none new: a process forking while a pass read /proc has a child that pass
        never saw (after a second, give up)."""
        with self._procs_lock:
            leaders = [proc.pid for proc in self._procs]
        for pid in leaders:
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)
        seen: set[int] = set()
        deadline, quiet = time.monotonic() + 1.0, 0
        while quiet < 3 and time.monotonic() < deadline:
            found = set(procutil.marked(self._mark.encode())) - seen
            quiet = 0 if found else quiet + 1
            for pid in found:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            seen |= found
            time.sleep(0.005)

    def _poll(self) -> int | None:
        """Alive until kill(); then down (128+SIGKILL) once no process of it is left."""
        if not self._killed:
            return None
        return None if procutil.marked(self._mark.encode()) else 128 + signal.SIGKILL

    # ----- paths ---------------------------------------------------------------------------
    @property
    def workdir(self) -> str:
        assert self._workspace is not None, "runtime not started"
        return str(self._workspace)

    @property
    def static_dir(self) -> Path:
        """The per-runtime read-only folder holding the static assets."""
        assert self._static is not None, "runtime not started"
        return self._static

    def static_path(self, name: str) -> str:
        return str(self.static_dir / self.env.spec.static_asset(name).save_path)

    def info(self) -> RuntimeInfo:
        self._check_open()
        return RuntimeInfo(
            id=f"local-{self.env.name}-{self._mark[-8:]}",
            env=self.env.name,
            backend=self.name,
            workdir=self.workdir,
            user=None,
            exec_mode="process",
        )

    def connection(self, *, user: str | None = None) -> Connection:
        self._check_open()
        self._check_user(self._user(user))
        env = [f"{k}={v}" for k, v in self._env.items()]
        enter = 'cd "$1" && exec "${SHELL:-/bin/sh}"'
        return Connection("local", ("env", "-i", *env, "/bin/sh", "-c", enter, "sh", self.workdir))

    # ----- commands ------------------------------------------------------------------------
    def _check_user(self, user: str | None) -> None:
        """Another user needs root here; asking without it is the caller's mistake."""
        if user is None or os.geteuid() == 0:
            return
        with contextlib.suppress(procutil.UnknownUser):  # that one is the command's 126
            if procutil.resolve_ids(user) != (os.getuid(), os.getgid()):
                raise UsageError(
                    f"the local backend runs as the host user; running as {user} "
                    "needs the caller to be root"
                )

    def _run(self, cmd: Command) -> Chunks:
        self._check_user(cmd.user)
        procs, mine = self._procs, []  # for _kill: every command of this runtime

        def started(proc: subprocess.Popen[bytes], tty: procutil.Tty | None = None) -> None:
            with self._procs_lock:
                procs.add(proc)
            mine.append(proc)
            if cmd.control is not None:  # a started process: its caller may signal it now
                resize = tty.resize if tty is not None else None
                cmd.control.bind(lambda sig: _signal_group(proc, sig), lambda: _kill(proc), resize)

        env = {**self._env, **cmd.env}
        stdin = stdin_chunks(cmd.stdin) if cmd.stdin is not None else None
        try:
            if cmd.tty is not None:
                return (
                    yield from procutil.run_tty(
                        cmd.argv, env, cmd.cwd, cmd.user, stdin, cmd.timeout, cmd.tty, started
                    )
                )
            return (
                yield from procutil.run(
                    cmd.argv, env, cmd.cwd, cmd.user, stdin, cmd.timeout, on_start=started
                )
            )
        except procutil.NoProcess as exc:
            raise SandboxUnavailable(f"{self.env.name}: {exc.strerror}") from exc
        finally:
            if cmd.control is not None:
                cmd.control.unbind()
            with self._procs_lock:
                procs.difference_update(mine)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """`sig` to a command's process group (it leads its session), unless it was reaped."""
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """A command's whole tree killed, unless it was reaped."""
    if proc.returncode is None:
        procutil.kill_tree(proc.pid, signal.SIGKILL)
