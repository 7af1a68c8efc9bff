"""Attacks on the reset a reuse pool and `restore()` rely on: what a root sandbox plants must
not outlive it to meet the next user of the same container."""

from __future__ import annotations

from pathlib import Path

from orchestrator import Policy, Pool, load_environment, spawn_runtime
from tests.docker.conftest import MakeEnv

# Replace `sleep` by a trojan that runs under a name of its own, then end every child of
# the keep-alive (the oldest child of init): a keep-alive that starts `sleep` again starts
# the trojan, as its own child.
PLANT = r"""
set -e
cp /bin/sleep /bin/sleep.real
rm -f /bin/sleep  # (it runs: written in place it would be busy)
printf '#!/bin/sh\nexec /bin/sleep.real 86399\n' > /bin/sleep
chmod 755 /bin/sleep
python3 - <<'EOF'
import os, signal
def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
keeper = min((p for p in pids if stat(p)[1] == "1"), key=lambda p: int(stat(p)[19]))
for pid in pids:
    if stat(pid)[1] == str(keeper):
        os.kill(pid, signal.SIGKILL)
EOF
/bin/sleep.real 0.5
"""
TROJAN = (  # the trojan's command lines (NUL-separated in /proc), not this one's
    'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f" 2>/dev/null; echo; done'
    " | grep 'sleep[.]real 86399' || true"
)


def test_a_planted_keep_alive_child_does_not_survive_a_reuse_reset(make_env: MakeEnv) -> None:
    env = load_environment(make_env("user: root\n", name="trojan"))
    with Pool(env, size=1, reuse=True) as pool:
        rt = pool.acquire(timeout=120)
        try:
            planted = rt.execute(PLANT, timeout=60)
            assert planted.ok, planted.stderr
        finally:
            pool.release(rt)  # reset for the next user
        again = pool.acquire(timeout=120)
        try:
            assert again is rt  # the same container, handed to someone else
            found = again.execute(TROJAN).stdout
            assert found == "", "a process the last user planted still runs"
        finally:
            pool.release(again)


def test_restore_leaves_the_keep_alive_without_children(make_env: MakeEnv, tmp_path: Path) -> None:
    """The keep-alive itself starts no program of the image once it runs, so replacing one
    plants nothing: after a restore the keep-alive has no child, and the container lives."""
    env = load_environment(make_env("user: root\n", name="keeper"))
    with spawn_runtime(env) as rt:
        snap = rt.snapshot(tmp_path / "base.tar")
        assert rt.execute(PLANT, timeout=60).ok
        rt.restore(snap)
        assert rt.poll() is None
        assert rt.execute(TROJAN).stdout == ""
        assert rt.execute("echo alive").stdout == "alive\n"


def test_no_setuid_file_or_device_stays_in_the_host_workspace(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """A root sandbox owns its files as uid 0 on the host: a setuid copy of a shell left in a
    bind-mounted workspace would give any host user who runs it euid 0. The sandbox cannot set
    the bit there at all (the seccomp profile of a container writing a host folder); a set-id
    file that got there anyway (here: put by the host while it runs) and a device node (where
    the caller granted MKNOD) are both gone once the environment ends."""
    workspace = tmp_path / "ws"
    policy = Policy(allow_caps=frozenset({"MKNOD"}))
    env = load_environment(make_env("user: root\ncap_add: [MKNOD]\n", name="suid"))
    with spawn_runtime(env, workspace=workspace, policy=policy) as rt:
        refused = rt.execute("mkdir -p d && cp /bin/sh d/rootsh && chmod 6755 d/rootsh")
        assert refused.exit_code != 0 and "not permitted" in refused.stderr.lower()
        made = rt.execute("mknod blk b 7 0 && chmod 666 blk && ln -s /bin/sh link", timeout=30)
        assert made.ok, made.stderr
        (workspace / "d" / "rootsh").chmod(0o6755)  # as if a path around the profile existed
        assert (workspace / "d" / "rootsh").stat().st_mode & 0o6000  # there while it runs
    mode = (workspace / "d" / "rootsh").stat().st_mode
    assert mode & 0o6000 == 0 and mode & 0o755 == 0o755
    assert not (workspace / "blk").exists() and not (workspace / "blk").is_symlink()
    assert (workspace / "link").is_symlink()  # links are left, and never followed


# A daemon that names itself like a zombie: "x) Z 1" and a newline, which /proc/PID/stat
# does not escape, so a reader of its first line sees state Z and spares it.
FAKE_ZOMBIE = r"""
python3 -c 'import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("/proc/self/comm", "w").write("x) Z 1\n")
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(86398)
    os._exit(0)'
"""


def test_a_process_named_like_a_zombie_does_not_survive_restore(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    env = load_environment(make_env("user: root\n", name="zombie"))
    with spawn_runtime(env) as rt:
        snap = rt.snapshot(tmp_path / "base.tar")
        assert rt.execute(FAKE_ZOMBIE, timeout=30).ok
        sleeping = "grep -l 'x) Z 1' /proc/[0-9]*/comm 2>/dev/null || true"
        assert rt.execute(sleeping).stdout.strip(), "the plant did not start: tested nothing"
        rt.restore(snap)
        assert rt.execute(sleeping).stdout.strip() == ""
