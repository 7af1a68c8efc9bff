"""Hostile review of issue 37, items 1-3: a host path swapped between its check and the
engine's mount, and programs a root sandbox leaves in host folders it writes (set-user-ID
bits, file capabilities). Each test states the attack; each fails on the code before the fix.

The swap is made at the worst moment on purpose (after every check, before the engine
mounts): the race the attacker ran from another sandbox, made certain."""

from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import PolicyError, SpecError, load_environment, spawn_runtime
from orchestrator.backends.docker import lifecycle
from orchestrator.backends.docker.runtime import ComposeRuntime
from orchestrator.spec.policy import Policy
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids

MARK = "the-checked-folder"


def _swap_to_root(path: Path) -> None:
    """What the attacker's sandbox did: the checked path becomes a link to the host's /."""
    path.rename(path.with_name(path.name + ".orig"))
    path.symlink_to("/")


@pytest.fixture
def swap_before_up(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Paths swapped for a link to / once every check has passed, just before the engine
    is asked to make the containers (the window the attacker's renameat2 loop hit)."""
    victims: list[Path] = []
    up = lifecycle.Project.up

    def late_swap(self: lifecycle.Project) -> None:
        for path in victims:
            _swap_to_root(path)
        up(self)

    monkeypatch.setattr(lifecycle.Project, "up", late_swap)
    return victims


def _dataset(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    (root / "scratch" / "data").mkdir(parents=True)
    (root / "scratch" / "data" / MARK).write_text("mine\n")
    (root / "asset.txt").write_text("the asset\n")
    return root


ENV = """version: 1
name: a37
image: {image}
mounts:
  - {{source: ./scratch/data, target: /data}}
  - {{source: ./scratch/data, target: /ro, read_only: true}}
static_assets:
  - {{name: tests, path: scratch/data, save_path: tests}}
  - {{name: one, path: asset.txt, save_path: one.txt}}
{extra}"""


@pytest.mark.parametrize("services", [False, True], ids=["direct", "compose"])
def test_a_mount_swapped_after_its_check_is_not_what_the_sandbox_gets(
    tmp_path: Path, swap_before_up: list[Path], services: bool
) -> None:
    """Item 1: the policy checked ./scratch/data (a folder of the dataset); a sandbox of an
    earlier sample exchanged it with a link to / before the engine mounted it, and this
    sample started with the host's / at /data (the engine's socket included). Pinned, the
    engine mounts the folder that was checked, whatever the path says by then: read-write,
    read-only, as a static asset folder and file, through the Engine API and Compose."""
    root = _dataset(tmp_path)
    extra = (
        "services:\n  web:\n    image: orchestrator-test/busybox:1\n"
        "    command: [sleep, '600']\n    mounts: [{source: ./scratch/data, target: /d}]\n"
        if services
        else ""
    )
    path = root / "env.yaml"
    path.write_text(ENV.format(image=PYTHON_IMAGE, extra=extra))
    swap_before_up += [root / "scratch" / "data", root / "asset.txt"]
    with spawn_runtime(load_environment(path)) as rt:
        seen = rt.execute(
            "ls /data /ro /static/tests; cat /static/one.txt; test -e /data/etc/passwd && echo ROOT"
        )
        assert seen.exit_code == 1, seen  # (`test` is false: no host /etc there)
        assert seen.stdout.count(MARK) == 3 and "the asset" in seen.stdout
        assert "ROOT" not in seen.stdout
        if services:
            web = rt.service("web").execute("ls /d; test -e /d/etc/passwd || echo clean")
            assert MARK in web.stdout and "clean" in web.stdout, web
        rt.execute("echo written > /data/new")
    assert (root / "scratch" / "data.orig" / "new").read_text() == "written\n"


def test_a_link_that_appeared_before_the_pin_refuses_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1, the other order: the link appears after the policy's look but before the
    path is pinned. The pin walks the checked path without following links, finds one,
    and the start is refused at the field, with nothing made on the engine."""
    root = _dataset(tmp_path)
    path = root / "env.yaml"
    path.write_text(ENV.format(image=PYTHON_IMAGE, extra=""))
    from orchestrator.backends.container import binds

    pin = binds.Pins.pin

    def swapped_first(self: binds.Pins, real: Path, *, writable: bool) -> binds.Pinned:
        if real.name == "data" and real.exists() and not real.is_symlink():
            _swap_to_root(real)
        return pin(self, real, writable=writable)

    monkeypatch.setattr(binds.Pins, "pin", swapped_first)
    before = labelled_ids()
    with pytest.raises(SpecError) as err:
        spawn_runtime(load_environment(path))
    assert "mounts.0.source" in str(err.value) and "changed after it was checked" in str(err.value)
    assert labelled_ids() == before


SETID = """set -u
cd {where}
echo x > plain && chmod 4755 plain; echo chmod=$?
python3 -c "import os; os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)"; echo open=$?
cp /bin/true prog && chmod u+s,g+s prog; echo bits=$?
mkdir -p sub && chmod 2755 sub; echo dir=$?
"""


def _setid_files(folder: Path) -> list[str]:
    found = []
    for dirpath, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_mode & 0o6000 and not os.path.isdir(os.path.join(dirpath, name)):
                found.append(name)
    return found


def test_a_root_sandbox_leaves_no_set_user_id_program_in_a_host_folder(tmp_path: Path) -> None:
    """Item 2: a root sandbox (no extra capability) made a 4755 root-owned program in the
    dataset's read-write mount (and the caller's workspace, and a Compose `./:/work`), and
    any host user who ran it was root, during the run and after it. No call that sets a
    set-id bit succeeds there now; the sandbox's own files are untouched by the rule."""
    root = _dataset(tmp_path)
    ws = tmp_path / "ws"
    path = root / "env.yaml"
    path.write_text(
        f"version: 1\nname: a37setid\nimage: {PYTHON_IMAGE}\nuser: root\n"
        "mounts: [{source: ./scratch, target: /scratch}]\n"
    )
    with spawn_runtime(load_environment(path), workspace=ws) as rt:
        for where in ("/scratch", "/workspace"):
            got = rt.execute(SETID.format(where=where))
            assert "chmod=1" in got.stdout and "open=1" in got.stdout, got
            assert "bits=1" in got.stdout, got
        assert _setid_files(root / "scratch") == [] and _setid_files(ws) == []
    assert _setid_files(root / "scratch") == [] and _setid_files(ws) == []
    # a sandbox that writes only its private workspace (no other user reaches it) keeps the
    # engine's own profile: a package it installs may carry a set-user-ID program
    plain = root / "plain.yaml"
    plain.write_text(f"version: 1\nname: a37own\nimage: {PYTHON_IMAGE}\nuser: root\n")
    with spawn_runtime(load_environment(plain)) as rt:
        own = rt.execute("echo y > /opt/own && chmod 4755 /opt/own && stat -c %a /opt/own")
        assert own.stdout.strip() == "4755", own


def test_a_compose_bind_of_the_file_s_folder_is_guarded_too(tmp_path: Path) -> None:
    """Item 2 through a Compose file: `./:/work` (read-write, as Compose reads it) is a host
    folder the sandbox writes: no set-id program lands in it."""
    (tmp_path / "proj").mkdir()
    compose = tmp_path / "proj" / "compose.yaml"
    compose.write_text(
        f"services:\n  default:\n    image: {PYTHON_IMAGE}\n    user: root\n"
        "    command: [sleep, infinity]\n    volumes: ['./:/work']\n"
    )
    with spawn_runtime(load_environment(compose)) as rt:
        got = rt.execute(SETID.format(where="/work"))
        assert "chmod=1" in got.stdout and "open=1" in got.stdout, got
    assert _setid_files(tmp_path / "proj") == []


def _caps_v2(*caps: int) -> bytes:
    """security.capability for `caps` permitted and effective (VFS_CAP_REVISION_2)."""
    bits = 0
    for cap in caps:
        bits |= 1 << cap
    return struct.pack("<IIIII", 0x02000001, bits & 0xFFFFFFFF, 0, bits >> 32, 0)


SETCAP = """python3 - <<'EOF'
import os
open('/workspace/fcap', 'w').write('x')
try:
    os.setxattr('/workspace/fcap', 'security.capability', {value!r})
    print('set')
except OSError as exc:
    print('refused', exc.errno)
EOF"""


def test_file_capabilities_need_the_callers_grant_and_do_not_outlive_the_run(
    make_env: Callable[..., Path], tmp_path: Path
) -> None:
    """Item 3: a file could add SETFCAP on its own, and a 150-byte `cap_setuid,cap_setgid+ep`
    program left in the caller's workspace gave root to any local user. A file cannot ask
    for it now; a caller who grants it is warned, and cleanup strips what was set."""
    value = _caps_v2(6, 7)  # CAP_SETGID, CAP_SETUID
    path = make_env("user: root\ncap_add: [SETFCAP]\n", name="a37fcap")
    with pytest.raises(PolicyError, match="SETFCAP"):
        spawn_runtime(load_environment(path), workspace=tmp_path / "ws1")
    plain = make_env("user: root\n", name="a37fcap0")
    with spawn_runtime(load_environment(plain), workspace=tmp_path / "ws0") as rt:
        assert "refused 1" in rt.execute(SETCAP.format(value=value)).stdout
    ws = tmp_path / "ws2"
    granted = Policy(allow_caps=frozenset({"SETFCAP"}))
    with spawn_runtime(load_environment(path), workspace=ws, policy=granted) as rt:
        assert any("SETFCAP" in w for w in rt.warnings)
        assert "set" in rt.execute(SETCAP.format(value=value)).stdout
    assert "security.capability" not in os.listxattr(ws / "fcap")


def test_a_set_user_id_program_already_there_is_not_rewritten_with_its_bit(
    tmp_path: Path,
) -> None:
    """Item 2, by another path: a set-user-ID root program the folder already holds, written
    over by a root sandbox, kept its bit (CAP_FSETID): the sandbox's code, run as root by
    whoever runs it. Without FSETID the write clears the bit."""
    root = _dataset(tmp_path)
    helper = root / "scratch" / "helper"
    helper.write_text("#!/bin/sh\necho original\n")
    helper.chmod(0o4755)
    path = root / "env.yaml"
    path.write_text(
        f"version: 1\nname: a37fsetid\nimage: {BUSYBOX_IMAGE}\nuser: root\n"
        "mounts: [{source: ./scratch, target: /scratch}]\n"
    )
    with spawn_runtime(load_environment(path)) as rt:
        rt.execute("echo 'echo mine' >> /scratch/helper")
    assert helper.read_text().endswith("echo mine\n")
    assert not helper.stat().st_mode & 0o6000


def test_under_gvisor_a_writable_folder_others_can_reach_is_refused(
    tmp_path: Path, gvisor_engine: str
) -> None:
    """gVisor does not apply the seccomp profile to `docker exec`'d processes (and honours
    chmod u+s on a host folder): a folder it writes must be out of other users' reach, a
    folder above it closed to them. One that is not is refused at its field with the fix;
    one that is starts, and what it leaves is defused after the run."""
    open_root = tmp_path / "open"
    (open_root / "scratch").mkdir(parents=True)
    for folder in (tmp_path, open_root):
        folder.chmod(0o755)
    path = open_root / "env.yaml"
    path.write_text(
        f"version: 1\nname: a37gv\nimage: {BUSYBOX_IMAGE}\nuser: root\nisolation: gvisor\n"
        "mounts: [{source: ./scratch, target: /scratch}]\n"
    )
    parents = [p for p in tmp_path.parents if p != Path("/")]
    if all(p.stat().st_mode & 0o011 for p in parents):  # every folder above is open
        with pytest.raises(SpecError) as err:
            spawn_runtime(load_environment(path))
        assert "mounts.0.source" in str(err.value) and "chmod 700" in str(err.value)
    closed = tmp_path / "closed"
    (closed / "inner" / "scratch").mkdir(parents=True)
    closed.chmod(0o700)
    path = closed / "inner" / "env.yaml"
    path.write_text(open_root.joinpath("env.yaml").read_text())
    with spawn_runtime(load_environment(path)) as rt:
        rt.execute("echo x > /scratch/p && chmod 4755 /scratch/p")
    assert _setid_files(closed / "inner" / "scratch") == []


def test_the_profile_takes_nothing_else_from_a_root_sandbox(tmp_path: Path) -> None:
    """The profile is the engine's default less set-id bits: a root sandbox that writes a
    shared folder still runs threads and subprocesses, and user namespaces stay closed as
    under the engine's own profile."""
    path = tmp_path / "e.yaml"
    path.write_text(f"version: 1\nname: a37prof\nimage: {PYTHON_IMAGE}\nuser: root\n")
    with spawn_runtime(load_environment(path), workspace=tmp_path / "ws") as rt:
        assert isinstance(rt, ComposeRuntime)
        script = (
            "import subprocess, threading, ctypes\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "print(subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout)\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
        )
        got = rt.execute(["python3", "-c", script])
        assert "sub" in got.stdout and "unshare -1 1" in got.stdout, got


def test_the_profile_is_what_the_engine_applied(tmp_path: Path) -> None:
    """The engine got the profile (not its own default) for a sandbox that writes the
    caller's workspace, and its own default for one that writes only the private one."""
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: a37insp\nimage: {BUSYBOX_IMAGE}\n")
    for workspace, expect in ((tmp_path / "ws", True), (None, False)):
        with spawn_runtime(load_environment(path), workspace=workspace) as rt:
            container = rt.info().container
            assert container is not None
            opts = subprocess.run(
                ["docker", "inspect", "--format", "{{json .HostConfig.SecurityOpt}}", container],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert ("seccomp=" in opts) is expect, opts


def test_under_gvisor_a_file_linked_elsewhere_is_refused_and_a_file_mount_defused(
    tmp_path: Path, gvisor_engine: str
) -> None:
    """Review item 2: the folder above was closed, but a file in the writable folder had
    another link where other users reach it (a dataset tarball keeps hard links): the
    gVisor sandbox made it set-user-ID through its own link, then removed that link, and
    nobody ran the other as root. A writable folder holding a file with several links is
    refused under gVisor; a writable single file is defused after the run."""
    closed = tmp_path / "closed"
    (closed / "box" / "priv").mkdir(parents=True)
    closed.chmod(0o700)
    pub = tmp_path / "pub"
    pub.mkdir()
    (closed / "box" / "priv" / "tool").write_text("x")
    os.link(closed / "box" / "priv" / "tool", pub / "tool")
    path = closed / "box" / "env.yaml"
    path.write_text(
        f"version: 1\nname: a37gvl\nimage: {BUSYBOX_IMAGE}\nuser: root\nisolation: gvisor\n"
        "mounts: [{source: ./priv, target: /w}]\n"
    )
    with pytest.raises(SpecError, match="2 links"):
        spawn_runtime(load_environment(path))
    (pub / "tool").unlink()
    single = closed / "box" / "one"
    single.write_text("y")
    path.write_text(
        f"version: 1\nname: a37gvf\nimage: {BUSYBOX_IMAGE}\nuser: root\nisolation: gvisor\n"
        "mounts: [{source: ./one, target: /one}]\n"
    )
    with spawn_runtime(load_environment(path)) as rt:
        rt.execute("chmod 4755 /one")
    assert not single.stat().st_mode & 0o6000
