"""Escapes, tried as a hostile environment file or hostile sandbox code would, against the
real engine. Each must be refused (and leave nothing behind), or fail inside the sandbox.
Keep this module growing: every escape found gets a test here."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator import PolicyError, SpecError, load_environment, spawn_runtime
from orchestrator.backends.docker.buildplan import build_tags
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids
from tests.docker.conftest import MakeEnv

# /proc/PID/status CapEff bits (linux/capability.h)
CAP = {"DAC_READ_SEARCH": 2, "NET_RAW": 13, "SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_ADMIN": 21}
CAP.update({"MKNOD": 27, "SYS_PTRACE": 19, "NET_ADMIN": 12, "SETUID": 7, "KILL": 5})


@pytest.mark.parametrize(
    "body",
    [
        "static_assets: [{name: s, path: /var/run/docker.sock, save_path: s}]\n",
        "static_assets: [{name: s, path: /, save_path: s}]\n",
        "mounts: [{source: /tmp, target: /t}]\n",
        "mounts: [{source: /etc, target: /e, read_only: true}]\n",
        "cap_add: [DAC_READ_SEARCH]\n",
        "cap_add: [SYS_MODULE]\n",
        "network: {mode: host}\n",
        f"services: {{db: {{image: {BUSYBOX_IMAGE}, mounts: [{{source: /, target: /h}}]}}}}\n",
    ],
)
def test_escape_is_refused_before_anything_starts(make_env: MakeEnv, body: str) -> None:
    before = labelled_ids()
    with pytest.raises(PolicyError):
        spawn_runtime(make_env(body))
    assert labelled_ids() <= before  # nothing of ours stayed


def test_build_context_outside_the_roots_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    path.write_text("version: 1\nname: b\nbuild: {context: /etc}\n")
    with pytest.raises(PolicyError, match=r"build\.context"):
        spawn_runtime(path)


def _caps(status: str) -> int:
    line = next(ln for ln in status.splitlines() if ln.startswith("CapEff:"))
    return int(line.split()[1], 16)


def test_root_in_the_sandbox_has_only_the_allowed_capabilities(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("user: root\n")) as rt:
        status = rt.execute("cat /proc/self/status").stdout
        caps = _caps(status)
        for name in ("DAC_READ_SEARCH", "NET_RAW", "SYS_MODULE", "SYS_RAWIO", "SYS_ADMIN"):
            assert not caps & (1 << CAP[name]), f"{name} is in the sandbox's effective set"
        assert caps & (1 << CAP["SETUID"]) and caps & (1 << CAP["KILL"])
        assert "NoNewPrivs:\t1" in status
        # the host's root folder is out of reach even for root (open_by_handle_at needs
        # DAC_READ_SEARCH); mknod of a block device needs MKNOD
        r = rt.execute("mknod /tmp/sda b 8 0")
        assert r.exit_code != 0 and "not permitted" in r.stderr.lower()


def test_setuid_binaries_do_not_raise_privileges(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("user: '1000:1000'\n")) as rt:
        rt.execute(
            "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id",
            user="root",
            check=True,
        )
        # with no-new-privileges the setuid bit is ignored: the effective uid stays 1000
        assert rt.execute("/usr/local/bin/suid-id -u").stdout.strip() == "1000"


class Listener:
    """A TCP listener on every host address, counting connections (the host service a
    sandbox must not reach)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def saw_one(self, within: float = 10.0) -> bool:
        """Whether a connection was accepted, waiting at most `within` s for the accepting
        thread (the sandbox's connect returns once the kernel queued it)."""
        deadline = time.monotonic() + within
        while self.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.accepted > 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


# Reads the default gateway (the host's address on the project network, which the test
# created) from the routing table, then tries the listener there.
REACH_GATEWAY = """
import socket, struct, sys
gw = None
for line in open('/proc/net/route').read().splitlines()[1:]:
    f = line.split()
    if f[1] == '00000000':
        gw = socket.inet_ntoa(struct.pack('<L', int(f[2], 16)))
print('gateway', gw)
s = socket.socket(); s.settimeout(2)
try:
    s.connect((gw, int(sys.argv[1])))
    print('REACHED')
except OSError as exc:
    print('blocked', exc)
"""


@pytest.mark.parametrize(("outbound", "reached"), [(False, False), (True, True)])
def test_no_outbound_hides_the_host_too(make_env: MakeEnv, outbound: bool, reached: bool) -> None:
    listener = Listener()
    try:
        body = f"network: {{outbound: {str(outbound).lower()}}}\n"
        body += f"services: {{db: {{image: {BUSYBOX_IMAGE}, command: [sleep, '600']}}}}\n"
        with spawn_runtime(make_env(body)) as rt:
            r = rt.execute(["python3", "-c", REACH_GATEWAY, str(listener.port)], timeout=20)
            assert "gateway" in r.stdout, r.stderr
            assert ("REACHED" in r.stdout) is reached, r.stdout
            assert (listener.saw_one() if reached else listener.accepted > 0) is reached
    finally:
        listener.close()


def test_user_names_resolve_in_the_sandbox_and_unknown_ones_fail_fast(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("")) as rt:
        assert rt.execute("id -u", user="nobody").stdout.strip() == "65534"
        r = rt.execute("id", user="nobody:no-such-group", timeout=10)
        assert r.exit_code == 126 and "no-such-group" in r.stderr


@pytest.mark.parametrize("mode", ["auto", "plain"])
def test_a_user_out_of_the_kernels_range_never_runs_as_root(
    make_env: MakeEnv, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4294967295 is -1 to setuid ("leave it unchanged"): `execute(user="4294967295")` ran
    as root through the executor. Every path refuses it as an unknown user (126)."""
    monkeypatch.setenv("ORCHESTRATOR_EXEC_MODE", mode)
    with spawn_runtime(make_env("user: '1000:1000'\n")) as rt:
        for user in ("4294967295", "1000:4294967295", "4294967296"):
            r = rt.execute("id -u; id -g", user=user, timeout=20)
            assert r.exit_code == 126 and r.stdout == "", (user, r)


@pytest.mark.parametrize(
    ("base", "dockerfile", "user"),
    [
        (PYTHON_IMAGE, "USER 4294967295\n", "image"),  # the image's USER, as Compose runs it
        (PYTHON_IMAGE, "RUN echo 'big:x:4294967295:4294967295::/:/bin/sh' >> /etc/passwd\n", "big"),
        (
            BUSYBOX_IMAGE,
            "RUN echo 'big:x:4294967295:4294967295::/:/bin/sh' >> /etc/passwd\n",
            "big",
        ),
    ],
    ids=["image-user", "passwd-entry", "passwd-entry-plain"],
)
def test_an_image_giving_an_id_out_of_range_is_a_spec_error(
    tmp_path: Path, base: str, dockerfile: str, user: str
) -> None:
    """An image may say anything: USER 4294967295 gave a traceback (exit 1), and a name whose
    passwd entry says it started a sandbox whose every command then failed (the executor's
    words, or runc's on the plain path)."""
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\n{dockerfile}")
    (tmp_path / "env.yaml").write_text(
        f"version: 1\nname: big{user.replace('-', '')}\nbuild: {{context: .}}\nuser: {user}\n"
    )
    env = load_environment(tmp_path / "env.yaml")
    before = labelled_ids()
    try:
        with pytest.raises(SpecError, match=r"user: .*(4294967295 is out of range|in range)"):
            spawn_runtime(env)
    finally:
        for tag in build_tags(env):
            subprocess.run(["docker", "image", "rm", tag], capture_output=True, timeout=60)
    assert labelled_ids() == before  # nothing left half-started


@pytest.mark.parametrize("mode", ["auto", "plain"])
def test_the_file_user_may_be_a_name_of_the_image(
    make_env: MakeEnv, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_EXEC_MODE", mode)
    with spawn_runtime(make_env("user: nobody:nogroup\n")) as rt:
        assert rt.execute("id -u; id -g").stdout.split() == ["65534", "65534"]
        assert rt.execute("touch made && stat -c %u made").stdout.strip() == "65534"
    before = labelled_ids()
    with pytest.raises(SpecError, match="user: unable to find user no-such-user") as info:
        spawn_runtime(make_env("user: no-such-user\n"))
    assert "give a uid" in str(info.value) and labelled_ids() <= before


def test_tmp_is_a_bounded_tmpfs(make_env: MakeEnv) -> None:
    with spawn_runtime(make_env("resources: {memory: 256m, tmp: 8m}\n")) as rt:
        r = rt.execute("head -c 20000000 /dev/zero > /tmp/fill", timeout=30)
        assert r.exit_code != 0 and "space" in r.stderr.lower()
        assert rt.execute("echo ok").stdout == "ok\n"


def test_disk_limit_is_enforced_or_refused_clearly(make_env: MakeEnv) -> None:
    """Where the storage driver can limit the writable layer, writing past it fails; where it
    cannot (overlay2 on ext4, as on our machines), the start fails naming the field."""
    import subprocess

    from orchestrator import SpecError

    driver = subprocess.run(
        ["docker", "info", "--format", "{{.Driver}} {{json .DriverStatus}}"],
        capture_output=True,
        text=True,
    ).stdout
    before = labelled_ids()
    path = make_env("resources: {disk: 64m}\n")
    if "pquota" in driver or driver.startswith(("btrfs", "zfs")):
        with spawn_runtime(path) as rt:
            r = rt.execute("head -c 200000000 /dev/zero > /var/fill", timeout=60)
            assert r.exit_code != 0 and "space" in r.stderr.lower()
    else:
        with pytest.raises(SpecError, match=r"resources\.disk") as info:
            spawn_runtime(path)
        assert "resources.tmp" in str(info.value)
    assert labelled_ids() <= before  # nothing of ours stayed
