"""`orchestrator.attach(id)` and the CLI commands built on it: `orchestrator exec` and
`rt.execute` agree on exit codes and output on the same environment, on the main sandbox and
on a sidecar; compose's `exec ID SERVICE -- cmd` never runs a command named after the
service; `logs` names the services; `up` and `run` print the runtime's warnings."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Runtime, SandboxUnavailable, attach
from tests.docker.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, MakeEnv, loaded_by

CLI = [sys.executable, "-m", "orchestrator"]
TWO = f"""services:
  side:
    image: {BUSYBOX_IMAGE}
    command: ["sleep", "3600"]
setup:
  commands: ["printf 'echo no' > noexec && chmod 644 noexec"]
"""


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _up_two(folder: Path) -> Iterator[str]:
    """An environment left running by `orchestrator up` (a python main, a busybox side)."""
    path = folder / "attached.yaml"
    path.write_text(f"version: 1\nname: attached\nimage: {PYTHON_IMAGE}\n{TWO}")
    up = cli("up", str(path))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        yield ident
    finally:
        down = cli("down", ident)
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One such environment for the tests that only run commands in it and read it."""
    yield from _up_two(tmp_path_factory.mktemp("attached"))


@pytest.fixture
def running_alone(tmp_path: Path) -> Iterator[str]:
    """One for a test that kills its sandbox."""
    yield from _up_two(tmp_path)


CASES = [
    ("success", ["true"], None, 0),
    ("non-zero exit", ["sh", "-c", "exit 3"], None, 3),
    ("missing command", ["no-such-command", "x"], None, 127),
    ("not executable", ["./noexec", "x"], None, 126),
    ("timeout", ["sleep", "30"], 1.0, 124),
]


def test_exec_and_execute_agree_on_exit_codes(running: str) -> None:
    with attach(running) as rt:  # leaving the block leaves it running
        assert rt.info().id == running
        assert rt.info().exec_mode == "executor"  # python3 in the image: as a spawn
        for what, argv, timeout, code in CASES:
            result = rt.execute(argv, timeout=timeout)
            library = 124 if result.timed_out else result.exit_code
            flags = ["--timeout", f"{timeout:g}"] if timeout else []
            done = cli("exec", running, *flags, "--", *argv)
            assert (what, library, done.returncode) == (what, code, code), done.stderr
    assert cli("exec", running, "--", "true").returncode == 0  # still running


def test_exec_splits_output_and_reaches_a_sidecar(running: str) -> None:
    done = cli("exec", running, "--", "echo out; echo err >&2; exit 5")
    assert (done.returncode, done.stdout, done.stderr.strip()) == (5, "out\n", "err")
    with attach(running[-8:]) as rt:  # the short id, as `down` takes
        side = rt.service("side").execute(["sh", "-c", "echo $HOSTNAME; exit 4"])
    for args in (["--service", "side"], ["-s", "side"]):
        done = cli("exec", running, *args, "--", "sh", "-c", "echo $HOSTNAME; exit 4")
        assert (done.returncode, done.stdout) == (side.exit_code, side.stdout)
    as_user = cli("exec", running, "--user", "1234", "--workdir", "/tmp", "--", "id -u; pwd")
    assert as_user.stdout.split() == ["1234", "/tmp"]


def test_exec_passes_binary_output_through_unchanged(running: str) -> None:
    """Bytes that are not UTF-8 came out as U+FFFD (three bytes each): 3 MB of random bytes
    came out as 5.4 MB. stdout and stderr carry the command's own bytes, on the executor
    and on the plain path (the busybox sidecar)."""
    script = (
        "{ printf '\\377\\376\\000\\001'; head -c 300000 /dev/urandom; } | tee /tmp/sent; "
        "printf '\\303' >&2"
    )
    for where in ([], ["--service", "side"]):
        done = subprocess.run(
            [*CLI, "exec", running, *where, "--", "sh", "-c", script],
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        sent = subprocess.run(
            [*CLI, "exec", running, *where, "--", "cat", "/tmp/sent"],
            capture_output=True,
            timeout=120,
        ).stdout
        assert len(sent) == 300004 and done.stdout == sent and done.stdout[:4] == b"\xff\xfe\0\1"
        assert done.stderr.endswith(b"\n\xc3") or done.stderr == b"\xc3", done.stderr


def test_exec_with_its_stdout_closed_keeps_the_commands_exit_code(running: str) -> None:
    """Started with stdout closed (`>&-`), it ended in a Python error (sys.stdout is None)."""
    argv = [*CLI, "exec", running, "--", "sh", "-c", "echo out; echo err >&2; exit 3"]
    done = subprocess.run(
        ["sh", "-c", '"$@" >&-', "sh", *argv], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (3, "err\n"), done.stderr


def test_compose_service_form_is_refused_not_run(running: str) -> None:
    done = cli("exec", running, "side", "--", "echo", "hi")
    assert done.returncode == 2
    assert "use --service side" in done.stderr and done.stdout == ""
    shell = cli("shell", running, "side")
    assert shell.returncode == 2 and "use --service side" in shell.stderr


def test_logs_names_the_services_and_shows_the_main_sandbox(running: str) -> None:
    unknown = cli("logs", running, "nosuch")
    assert unknown.returncode == 2
    assert "nosuch" in unknown.stderr and "main, side" in unknown.stderr
    shown = cli("logs", running)
    assert shown.returncode == 0 and "main" in shown.stderr


def test_killed_sandbox_is_one_line_and_the_unavailable_code(running_alone: str) -> None:
    running = running_alone
    with attach(running) as rt:
        container = rt.info().container
        assert container is not None
        subprocess.run(["docker", "kill", container], capture_output=True, check=True)
        with pytest.raises(SandboxUnavailable) as raised:
            rt.execute(["true"])
    done = cli("exec", running, "--", "true")
    assert done.returncode == raised.value.exit_code == 3
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not running" in done.stderr


def test_cleanup_of_an_attached_runtime_removes_it(make_env: MakeEnv) -> None:
    up = cli("up", str(make_env("", name="attachgone")))
    assert up.returncode == 0, up.stderr
    rt: Runtime = attach(up.stdout.strip())
    rt.cleanup()  # as `down`
    gone = cli("exec", up.stdout.strip(), "--", "true")
    assert gone.returncode == 2 and "no environment" in gone.stderr


def test_up_and_run_print_the_runtime_warnings(
    make_env: MakeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_PUBLIC_PORTS", "1")  # the caller's, with a warning
    path = make_env("network:\n  ports: [{container: 8000, host_ip: 0.0.0.0}]\n", name="warned")
    want = "port 8000 is published on 0.0.0.0"
    ran = cli("run", str(path), "--", "true")
    assert ran.returncode == 0 and want in ran.stderr, ran.stderr
    up = cli("up", str(path))
    try:
        assert up.returncode == 0 and want in up.stderr, up.stderr
    finally:
        cli("down", up.stdout.strip())
    assert Path(path).exists()


def _loaded_by(*args: str) -> tuple[str, set[str]]:
    return loaded_by("orchestrator.cli", *args)


HEAVY = {"python_on_whales", "jinja2"}


@pytest.mark.parametrize("image", ["python", "busybox"])
def test_exec_ps_and_down_load_neither_python_on_whales_nor_jinja(
    make_env: MakeEnv, image: str
) -> None:
    """The commands a harness runs most stay light: python-on-whales (about 0.3 s of CPU to
    import) and Jinja are not loaded to run a command, list or take down an environment;
    also in an image without Python, where each command runs by plain `docker exec` after
    the container's state and defaults are asked (through the engine's API)."""
    chosen = {"image": BUSYBOX_IMAGE} if image == "busybox" else {}
    up = cli("up", str(make_env("", name=f"light{image}", **chosen)))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        out, loaded = _loaded_by("exec", ident, "--", "echo", "hi")
        assert out == "hi\n" and not loaded & HEAVY, sorted(loaded)
        out, loaded = _loaded_by("ps")
        # (once seen without the id while other workers ran: what a second look says tells
        # a listing that missed it from one that lost it)
        assert ident in out, (out, cli("ps").stdout, cli("ps", "--json").stdout)
        assert not loaded & HEAVY, sorted(loaded)
    finally:
        out, loaded = _loaded_by("down", ident)
    assert ident in out and not loaded & HEAVY, sorted(loaded)
    assert ident not in cli("ps").stdout


PARSING = {"typer", "click", "rich", "pydantic", "pydantic_core", "ruamel", "_ruamel_yaml"}
"""What the full CLI loads to read a command and a file, which `ps` and `down` need not."""


def _both(*args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """`orchestrator ARGS` from the command's own start, and from the full CLI."""
    return tuple(  # type: ignore[return-value]
        subprocess.run(
            [sys.executable, "-c", f"from {entry} import main; main()", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for entry in ("orchestrator.endpoint", "orchestrator.cli")
    )


def test_ps_and_down_load_no_parser_and_say_what_the_full_cli_says(make_env: MakeEnv) -> None:
    """`ps` and `down` from the command's start load neither Typer, Rich nor pydantic, and
    print what the full CLI prints for the same call: the same row and JSON of an
    environment, the same errors and exit codes. Calls this path does not take (`--help`,
    another option) are the full CLI's."""
    up = cli("up", str(make_env("", name="quickps", image=BUSYBOX_IMAGE)))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        out, loaded = loaded_by("orchestrator.endpoint", "ps")
        assert ident in out and not loaded & (HEAVY | PARSING), sorted(loaded & (HEAVY | PARSING))
        _, loaded = loaded_by("orchestrator.endpoint", "ps", "--usage", "--json")
        assert not loaded & (HEAVY | PARSING), sorted(loaded & (HEAVY | PARSING))
        quick, full = _both("ps")
        assert quick.returncode == full.returncode == 0, (quick.stderr, full.stderr)
        rows = [
            {line.split()[0]: line.split() for line in done.stdout.splitlines()}
            for done in (quick, full)
        ]
        assert rows[0]["ID"] == rows[1]["ID"] == ["ID", "ENV", "OWNER", "STATE", "PORTS", "POOL"]
        assert rows[0][ident] == rows[1][ident] == [ident, "quickps", "detached", "running"]
        quick, full = _both("ps", "--json")
        listed = [{r["id"]: r for r in json.loads(done.stdout)}[ident] for done in (quick, full)]
        assert listed[0] == listed[1] and listed[0]["containers"] == 1
        for args in (
            ["down"],
            ["down", "--all", ident],
            ["down", "orch-nosuch-00000000"],
            ["ps", "extra"],
            ["ps", "--nosuch"],
            ["down", "--nosuch", ident],
        ):
            quick, full = _both(*args)
            assert quick.returncode == full.returncode == 2, (args, quick.stderr, full.stderr)
            said = [done.stderr.split(" known: ")[0] for done in (quick, full)]
            assert said[0] == said[1] and said[0].strip(), args
        quick, _ = _both("down", "--help")
        assert quick.returncode == 0 and "--force" in quick.stdout
    finally:
        out, loaded = loaded_by("orchestrator.endpoint", "down", ident)
    assert out == f"removed {ident}\n" and not loaded & (HEAVY | PARSING), sorted(loaded)
    quick, full = _both("down", ident)
    assert quick.returncode == full.returncode == 2
    assert quick.stderr.split(" known: ")[0] == full.stderr.split(" known: ")[0]


LOGGER = (
    "printf 'one\\n'; printf 'two\\n' >&2; sleep 0.5; printf 'bad \\377\\376 bytes\\n'; "
    "head -c 200000 /dev/zero | tr '\\0' x; printf '\\nlast\\n'; exec sleep 100000"
)
"""What the logging service prints: both streams, bytes that are not UTF-8, a line of
200,000 bytes (printed in pieces of logprint.LINE_LIMIT), then a last line."""


def _bytes_of(entry: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", f"from {entry} import main; main()", *args],
        capture_output=True,
        timeout=120,
    )


def test_logs_load_no_parser_and_print_what_the_full_cli_prints(make_env: MakeEnv) -> None:
    """`logs` from the command's start reads the environment's containers through the
    engine's API, loads neither Typer, Rich nor pydantic, and prints what the full CLI
    prints, byte for byte: every service or one, `--tail`, the main sandbox's note, an
    unknown service's error; `--follow` prints lines as they come and ends on SIGTERM."""
    command = json.dumps(["sh", "-c", LOGGER])
    body = f"services:\n  web:\n    image: {BUSYBOX_IMAGE}\n    command: {command}\n"
    up = cli("up", str(make_env(body, name="quicklogs", image=BUSYBOX_IMAGE)))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while b"last" not in _bytes_of("orchestrator.cli", "logs", ident, "web").stdout:
            assert time.monotonic() < deadline, "the service never printed its last line"
            time.sleep(0.2)
        out, loaded = loaded_by("orchestrator.endpoint", "logs", ident, "web", "-n", "1")
        assert out == "last\n" and not loaded & (HEAVY | PARSING), sorted(loaded)
        for args in (
            [ident],
            [ident, "web"],
            [ident, "main"],
            [ident, "--tail", "3", "web"],
            [ident, "web", "-n", "0"],
            [ident, "nope"],
            ["orch-nosuch-00000000"],
        ):
            quick, full = (_bytes_of(e, "logs", *args) for e in ENTRIES)
            assert (quick.returncode, quick.stdout, quick.stderr) == (
                full.returncode,
                full.stdout,
                full.stderr,
            ), args
        quick = _bytes_of("orchestrator.endpoint", "logs", ident)
        lines = quick.stdout.split(b"\n")
        # (both streams, in the order the engine took them from their pipes; its log holds
        # text: what is not UTF-8 is replaced)
        bad = "web  | bad \ufffd\ufffd bytes".encode()
        assert set(lines[:3]) == {b"web  | one", b"web  | two", bad}
        assert [len(x) for x in lines[3:-2]] == [7 + 65536] * 3 + [7 + 200000 - 3 * 65536]
        assert lines[-2:] == [b"web  | last", b""] and b"main: no output" in quick.stderr
        # following: what comes next is printed as it comes; SIGTERM ends it as 143
        with subprocess.Popen(
            [*CLI, "logs", ident, "web", "-f", "-n", "0"], stdout=subprocess.PIPE
        ) as follower:
            assert follower.stdout is not None
            # a line every 0.2 s until the follower prints one: with `-n 0` a line logged
            # before it follows is not its to print (one line a second after its start
            # came first once, under load, and the read waited for good)
            said = subprocess.run(
                ["docker", "exec", "-d", f"{ident}-web-1", "sh", "-c", NEWS],
                capture_output=True,
            )
            assert said.returncode == 0, said.stderr
            ready, _, _ = select.select([follower.stdout], [], [], 60)
            assert ready, "`logs -f` printed nothing in 60 s"
            assert follower.stdout.readline() == b"news\n"
            follower.terminate()
            assert follower.wait(30) == 143
    finally:
        down = cli("down", ident)
        assert down.returncode == 0, down.stderr


NEWS = "while :; do echo news > /proc/1/fd/1; sleep 0.2; done"
"""A line in a service's log every 0.2 s (the environment's removal ends it)."""
ENTRIES = ("orchestrator.endpoint", "orchestrator.cli")


def _foreign(labels: dict[str, str], *, start: bool, reapable: bool = False) -> str:
    """A container of someone else's (another state folder's) wearing our labels: left
    "created" (a start half-way) unless `start`. `reapable`: its owner is dead, so any
    process's reaper (another test's `ps`) may remove it at once, also between `docker
    run`'s create and its start: then there is none ("")."""
    argv = ["docker", "run", "-d"] if start else ["docker", "create"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    made = subprocess.run(
        [*argv, BUSYBOX_IMAGE, "sleep", "600"], capture_output=True, text=True, timeout=60
    )
    if reapable and made.returncode != 0 and "No such container" in made.stderr:
        return ""
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def test_ps_and_down_print_what_a_forged_container_says_as_text_whatever_the_stream(
    tmp_path: Path,
) -> None:
    """ATTACK (anyone who can start a container can wear our labels): an owner label with
    an escape and a line of its own, and an environment name Unicode, reach `down`'s error
    and `ps`'s rows. Neither may move the cursor or forge a line; `ps` in a pipe whose
    encoding is ASCII, or with its stdout closed, still lists (as the full CLI did)."""
    name = f"orch-forged-{uuid.uuid4().hex[:8]}"
    forged = _foreign(
        {
            "org.orchestrator.managed": "1",
            "org.orchestrator.project": name,
            "org.orchestrator.env": "wide\u4e2d\u6587",
            "org.orchestrator.dir": f"{tmp_path}/projects/{name}",
            "com.docker.compose.service": "main",
            "org.orchestrator.owner.host": socket.gethostname(),
            "org.orchestrator.owner.pid": f"{os.getpid()}\x1b[31m\nerror: forged",
            "org.orchestrator.owner.start": "",
        },
        start=False,
    )
    try:
        for entry in ("orchestrator.endpoint", "orchestrator.cli"):
            argv = [sys.executable, "-c", f"from {entry} import main; main()"]
            down = subprocess.run([*argv, "down", name], capture_output=True, timeout=120)
            assert down.returncode == 2 and b"\x1b" not in down.stderr, (entry, down.stderr)
            lines = down.stderr.decode().splitlines()
            assert len(lines) == 1 and "forged" in lines[0], (entry, lines)
            ascii = subprocess.run(
                [*argv, "ps"],
                capture_output=True,
                timeout=120,
                env={**os.environ, "PYTHONIOENCODING": "ascii"},
            )
            assert ascii.returncode == 0, (entry, ascii.stderr)
            assert name.encode() in ascii.stdout and "中文".encode() in ascii.stdout, entry
            closed = subprocess.run(  # (its stdout closed by the shell: `>&-`)
                ["sh", "-c", 'exec "$@" >&-', "sh", *argv, "ps"],
                stderr=subprocess.PIPE,
                timeout=120,
            )
            assert closed.returncode == 0, (entry, closed.stderr)
    finally:
        subprocess.run(["docker", "rm", "-f", forged], capture_output=True, timeout=120)


def test_ps_stays_light_beside_other_state_folders_snapshots_and_half_started_projects(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """`ps` beside what other processes, with other state folders, leave on the engine at
    any moment: a snapshot image (every `ps` inspected each one through python-on-whales,
    so it loaded it whenever any process on the engine held a snapshot), a detached
    project half-started, and one half-started whose owner is gone (which `ps` reaps). It
    lists them as they are, reaps the dead one by the docker CLI, leaves the image alone,
    and still loads neither python-on-whales nor Jinja."""
    other = tmp_path / "other-state"
    made: list[str] = []
    image = ""
    up = cli("up", str(make_env("", name="lightbeside", image=BUSYBOX_IMAGE)))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        base = _foreign({}, start=False)
        made.append(base)
        snap = {
            "org.orchestrator.managed": "1",
            "org.orchestrator.snapshot.record": f"{other}/snapshots/x.json",  # gone: an orphan
            "org.orchestrator.snapshot.state": str(other),
        }
        change = "LABEL " + " ".join(f'{k}="{v}"' for k, v in snap.items())
        committed = subprocess.run(
            ["docker", "commit", "--change", change, base],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert committed.returncode == 0, committed.stderr
        image = committed.stdout.strip()
        names = {what: f"orch-{what}way-{uuid.uuid4().hex[:8]}" for what in ("half", "dead")}
        for what, name in names.items():
            labels = {
                "org.orchestrator.managed": "1",
                "org.orchestrator.project": name,
                "org.orchestrator.env": what,
                "org.orchestrator.dir": f"{other}/projects/{name}",
                "org.orchestrator.owner.host": socket.gethostname(),
                "org.orchestrator.owner.pid": "0" if what == "half" else str(_dead_pid()),
                "org.orchestrator.owner.start": "" if what == "half" else "1",
            }
            for start in (False, True):
                made.append(_foreign(labels, start=start, reapable=what == "dead"))
        out, loaded = _loaded_by("ps")
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert ident in rows and not loaded & HEAVY, (out, sorted(loaded & HEAVY))
        assert "created,running" in rows[names["half"]], out  # listed as it is
        assert names["dead"] not in rows, out  # reaped (by this `ps`, or another's)
        kept = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
        assert kept.returncode == 0  # another state folder's image: never touched
    finally:
        gone = [m for m in made if m]
        subprocess.run(["docker", "rm", "-f", *gone], capture_output=True, timeout=120)
        if image:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True, timeout=120)
        down = cli("down", ident)
        assert down.returncode == 0, down.stderr


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_container_removed_under_exec_is_said_alike_on_both_paths(
    make_env: MakeEnv, entry: str
) -> None:
    """The main container removed while `exec` runs: the endpoint's path (its resident went
    with it) says the sandbox is gone and exits 3, as the full CLI does."""
    up = cli("up", str(make_env("", name=f"gone{entry.rsplit('.', 1)[-1]}")))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    try:
        argv = [sys.executable, "-c", f"from {entry} import main; main()"]
        with subprocess.Popen(
            [*argv, "exec", ident, "--", "sh", "-c", "echo up; exec sleep 60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline() == b"up\n"
            removed = subprocess.run(
                ["docker", "rm", "-f", f"{ident}-main-1"], capture_output=True, timeout=60
            )
            assert removed.returncode == 0, removed.stderr
            code = proc.wait(60)
            said = proc.stderr.read().decode()
        assert code == 3 and "its main container" in said, (code, said)
    finally:
        cli("down", ident)


def test_logs_end_quietly_when_their_reader_leaves_and_never_read_a_forged_container(
    make_env: MakeEnv,
) -> None:
    """`logs -f` into a reader that leaves (`| head`) ends with 1 and no traceback, on both
    entries. ATTACK (anyone who can start a container can wear our labels): a container
    labelled as the environment's service, its own removed, is never read: both entries
    read the service's container by its name, and say the same."""
    ticker = json.dumps(["sh", "-c", "while :; do echo tick; sleep 0.05; done"])
    body = f"services:\n  web:\n    image: {BUSYBOX_IMAGE}\n    command: {ticker}\n"
    up = cli("up", str(make_env(body, name="logsgone", image=BUSYBOX_IMAGE)))
    assert up.returncode == 0, up.stderr
    ident = up.stdout.strip()
    forged = ""
    try:
        for entry in ENTRIES:
            argv = [sys.executable, "-c", f"from {entry} import main; main()"]
            with subprocess.Popen(
                [*argv, "logs", "-f", ident, "web"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ) as reader:
                assert reader.stdout is not None and reader.stderr is not None
                assert reader.stdout.read(5) == b"tick\n"
                reader.stdout.close()  # the reader leaves
                code = reader.wait(60)
                said = reader.stderr.read()
            assert code == 1 and b"Traceback" not in said, (entry, code, said)
        folder = json.loads(cli("ps", "--json").stdout)
        assert any(row["id"] == ident for row in folder)
        gone = subprocess.run(["docker", "rm", "-f", f"{ident}-web-1"], capture_output=True)
        assert gone.returncode == 0, gone.stderr
        labels = subprocess.run(
            ["docker", "inspect", "--format", "{{json .Config.Labels}}", f"{ident}-main-1"],
            capture_output=True,
            text=True,
        )
        mine = json.loads(labels.stdout)
        forged = _foreign(
            {**mine, "com.docker.compose.service": "web", "org.orchestrator.env": "x"},
            start=True,
        )
        quick, full = (_bytes_of(e, "logs", ident, "web") for e in ENTRIES)
        assert (quick.returncode, quick.stdout, quick.stderr) == (
            full.returncode,
            full.stdout,
            full.stderr,
        )
        assert quick.returncode != 0 and b"tick" not in quick.stdout + quick.stderr
    finally:
        if forged:
            subprocess.run(["docker", "rm", "-f", forged], capture_output=True, timeout=60)
        cli("down", ident)
