"""Behaviour every backend keeps. `from orchestrator.testing.conformance import *` in a test
module that defines a `conformance_target` fixture (a `Target`) runs every check against it;
a backend's deliberate deviations are listed once, in its `deviations` mapping, and the
checks of those rules skip with the reason given there."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Runtime, RuntimeResult, settings
from orchestrator.errors import (
    CommandFailed,
    OrchestratorError,
    OutputLimitExceeded,
    RuntimeClosed,
    SandboxFileNotFound,
    SandboxUnsafeArchive,
    SetupFailed,
    UsageError,
)
from orchestrator.testing.target import Target, stat_argv

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def rt(conformance_target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """One runtime per target, shared by the module's read-mostly checks."""
    with conformance_target.spawn(tmp_path_factory.mktemp(f"env-{conformance_target.id}")) as r:
        yield r


@pytest.fixture
def fresh(conformance_target: Target, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime of its own, for checks that kill or close it."""
    runtime = conformance_target.spawn(tmp_path)
    try:
        yield runtime
    finally:
        runtime.cleanup()


def _skip_if(target: Target, rule: str, when: bool = True) -> None:
    reason = target.deviation(rule)
    if reason and when:
        pytest.skip(f"{target.id} deviates from {rule!r}: {reason}")


def survivors(rt: Runtime, marker: str) -> str:
    """Processes whose command line holds `marker` (the pattern never matches itself)."""
    pattern = marker[:-1] + "[" + marker[-1] + "]"
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null "
        f"| grep -q '{pattern}' && echo $f; done; true"
    )
    return rt.execute(script, user="root" if os.geteuid() == 0 else None).stdout.strip()


def survivors_within(rt: Runtime, marker: str, seconds: float) -> str:
    """`survivors`, looked at again until none are left or `seconds` have passed: for a kill
    that is made after the call returns (a closed stream's), on a machine that may be slow."""
    deadline = time.monotonic() + seconds
    while (left := survivors(rt, marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def unique_sleep() -> str:
    return str(40000 + uuid.uuid4().int % 9999)


# ----- exit codes ----------------------------------------------------------------------------
def test_exit_zero(rt: Runtime) -> None:
    r = rt.execute("true")
    assert (r.exit_code, r.ok, r.timed_out) == (0, True, False)


@pytest.mark.parametrize("code", [1, 3, 42, 255])
def test_exit_codes(rt: Runtime, code: int) -> None:
    assert rt.execute(f"exit {code}").exit_code == code


def test_command_not_found_is_127(rt: Runtime) -> None:
    r = rt.execute(["no-such-binary-xyz"])
    assert r.exit_code == 127


def test_signal_death_reports_128_plus_n(rt: Runtime) -> None:
    r = rt.execute("kill -TERM $$; sleep 5")
    assert r.exit_code == 143 and r.elapsed < 4 and not r.timed_out
    assert rt.execute("kill -KILL $$").exit_code == 137


def test_check_raises_only_when_asked(rt: Runtime) -> None:
    assert rt.execute("exit 4").exit_code == 4
    with pytest.raises(CommandFailed) as info:
        rt.execute("exit 4", check=True)
    assert isinstance(info.value, OrchestratorError) and info.value.result.exit_code == 4


# ----- output --------------------------------------------------------------------------------
def test_stdout_and_stderr_apart(rt: Runtime) -> None:
    r = rt.execute("echo out1; echo err1 >&2; echo out2; echo err2 >&2")
    assert r.stdout == "out1\nout2\n" and r.stderr == "err1\nerr2\n"


def test_utf8_output(rt: Runtime) -> None:
    r = rt.execute(["printf", "h\u00e9llo \u2603 \U0001f600\n"])
    assert r.stdout == "h\u00e9llo \u2603 \U0001f600\n"


def test_invalid_utf8_is_replaced(rt: Runtime) -> None:
    r = rt.execute("printf 'a\\377b'")
    assert r.stdout == "a\ufffdb"


def test_argv_is_passed_literally(rt: Runtime) -> None:
    args = ["a b", "$HOME", "'q'", '"dq"', "*", ";", ""]
    r = rt.execute(["printf", "[%s]", *args])
    assert r.stdout == "".join(f"[{a}]" for a in args)


def test_shell_string_supports_pipes(rt: Runtime) -> None:
    assert rt.execute("printf 'b\\na\\n' | sort | tr -d '\\n'").stdout == "ab"


def test_50mb_output_no_deadlock_tail_kept(rt: Runtime) -> None:
    r = rt.execute("head -c 52428800 /dev/zero | tr '\\0' 'x'; printf END", timeout=120)
    assert r.exit_code == 0 and r.truncated and r.stdout_truncated and not r.stderr_truncated
    assert len(r.stdout) == 10 * MiB and r.stdout.endswith("xxEND")


def test_large_output_on_both_streams(rt: Runtime) -> None:
    r = rt.execute("head -c 3000000 /dev/zero >&2 & head -c 3000000 /dev/zero; wait", timeout=60)
    assert len(r.stdout) == 3000000 and len(r.stderr) == 3000000 and not r.truncated


def test_output_limit_per_call(rt: Runtime) -> None:
    r = rt.execute("seq 1 1000", output_limit=20)
    assert r.truncated and r.stdout.endswith("999\n1000\n") and len(r.stdout) == 20


@pytest.mark.parametrize("limit", [0, -5, 1.5, True])
def test_an_output_limit_that_is_not_a_size_is_a_usage_error(rt: Runtime, limit: object) -> None:
    """0 silently meant the default, and a negative limit dropped all output (and said
    stderr was cut when there was none): refused before anything runs."""
    with pytest.raises(UsageError, match="output_limit"):
        rt.execute("echo x", output_limit=limit)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="output_limit"):
        list(rt.stream("echo x", output_limit=limit))  # type: ignore[arg-type]


def test_a_download_onto_a_local_file_is_a_usage_error(rt: Runtime, tmp_path: Path) -> None:
    name = f"d-{uuid.uuid4().hex[:8]}"
    rt.write_file(f"{name}/f", "x")
    (tmp_path / "a-file").write_text("mine\n")
    with pytest.raises(UsageError, match="not a folder"):
        rt.download(name, tmp_path / "a-file")
    assert (tmp_path / "a-file").read_text() == "mine\n"


def test_output_limit_from_environment(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.OUTPUT_LIMIT.name, "10")
    r = rt.execute("echo 0123456789abcdef")
    assert r.truncated and r.stdout == "789abcdef\n"


def test_small_output_not_truncated(rt: Runtime) -> None:
    r = rt.execute("echo hi")
    assert not r.truncated and not r.stdout_truncated


# ----- input ---------------------------------------------------------------------------------
def test_stdin_text(rt: Runtime) -> None:
    assert rt.execute(["cat"], stdin="h\u00e9\nline2").stdout == "h\u00e9\nline2"


def test_stdin_binary(rt: Runtime) -> None:
    data = bytes(range(256)) * 100
    r = rt.execute("sha256sum | cut -d' ' -f1", stdin=data)
    assert r.stdout.strip() == hashlib.sha256(data).hexdigest()


def test_stdin_large(rt: Runtime) -> None:
    data = os.urandom(20 * MiB)
    r = rt.execute("wc -c", stdin=data, timeout=60)
    assert r.stdout.strip() == str(len(data))


def test_no_stdin_means_eof(rt: Runtime) -> None:
    r = rt.execute("cat; echo done", timeout=10)
    assert r.stdout == "done\n" and not r.timed_out


# ----- per-call settings ---------------------------------------------------------------------
def test_call_env(rt: Runtime) -> None:
    assert rt.execute("echo $CALL_VAR", env={"CALL_VAR": "x y"}).stdout == "x y\n"


def test_env_precedence(rt: Runtime) -> None:
    r = rt.execute("echo $FILE_VAR $SPAWN_VAR $OVERRIDE")
    assert r.stdout == "from-file 1 spawn\n"
    assert rt.execute("echo $OVERRIDE", env={"OVERRIDE": "call"}).stdout == "call\n"


def test_only_listed_host_vars_pass_through(rt: Runtime) -> None:
    r = rt.execute("echo ${ORCH_PASS:-none} ${ORCH_NOPASS:-none}")
    assert r.stdout == "passed none\n"


def test_default_cwd_is_workdir(rt: Runtime) -> None:
    assert (
        rt.execute("pwd").stdout.strip() == os.path.realpath(rt.workdir)
        or rt.execute("pwd").stdout.strip() == rt.workdir
    )


def test_relative_cwd(rt: Runtime) -> None:
    rt.execute("mkdir -p sub/dir")
    assert rt.execute("pwd", cwd="sub/dir").stdout.strip().endswith("/sub/dir")


def test_missing_cwd_is_an_exit_code_not_an_exception(rt: Runtime) -> None:
    """As a shell's `cd` answers (2), on every path: the plain exec gave the engine's 126
    with its words on stdout, and a cwd that is a file blamed the command (126)."""
    r = rt.execute("pwd", cwd="does/not/exist")
    assert (r.exit_code, r.stdout) == (2, ""), r
    assert "cannot change directory to" in r.stderr and "No such file" in r.stderr, r
    rt.write_file("a-file", "")
    for below in ("a-file", "a-file/sub"):  # a shell's words for the second too
        r = rt.execute("pwd", cwd=below)
        assert (r.exit_code, r.stdout) == (2, "") and "Not a directory" in r.stderr, r


def test_user_per_call(rt: Runtime, conformance_target: Target) -> None:
    _skip_if(conformance_target, "user", when=os.geteuid() != 0)
    assert rt.execute("id -u", user="root").stdout.strip() == "0"
    assert rt.execute("id -u", user="1234:1234").stdout.strip() == "1234"


def test_default_user(rt: Runtime, conformance_target: Target) -> None:
    expected = conformance_target.default_uid or str(os.getuid())
    assert rt.execute("id -u").stdout.strip() == expected


def test_concurrent_commands(rt: Runtime) -> None:
    results: dict[int, str] = {}

    def one(i: int) -> None:
        results[i] = rt.execute(f"sleep 0.2; echo {i}").stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n" for i in range(8)}


# ----- timeouts ------------------------------------------------------------------------------
def test_timeout_sets_flag_and_keeps_partial_output(rt: Runtime) -> None:
    r = rt.execute("echo before; sleep 30; echo after", timeout=1)
    assert r.timed_out and not r.ok and r.stdout == "before\n"
    assert 0.9 < r.elapsed < 5


@pytest.mark.parametrize(
    ("script", "stdout", "within"),
    [
        ("sh -c 'sleep {s} & sleep {s}' & sleep {s}; wait", "", 5),  # (grand)children
        ("setsid sleep {s} & sleep {s}; wait", "", 5),  # a process that left the group
        ("(sleep {s}; echo late) & echo early; sleep {s}", "early\n", 5),  # pipe held open
        # deaf to SIGTERM, holding the pipes: the engine may take seconds to answer the
        # plain path's in-container kill while the command's own exec winds down
        ("sh -c \"trap '' TERM; sleep {s}; :\" & sleep {s}; wait", "", 10),
    ],
    ids=["grandchildren", "left-the-group", "pipe-held-open", "ignores-sigterm"],
)
def test_timeout_kills_the_whole_tree(rt: Runtime, script: str, stdout: str, within: float) -> None:
    s = unique_sleep()
    r = rt.execute(script.format(s=s), timeout=1)
    assert r.timed_out and r.stdout == stdout and r.elapsed < within
    time.sleep(0.3)
    assert survivors(rt, s) == ""


def test_timeout_check_raises_timeout_error(rt: Runtime) -> None:
    with pytest.raises(TimeoutError):
        rt.execute("sleep 10", timeout=0.5, check=True)


def test_background_process_does_not_hold_the_call(rt: Runtime) -> None:
    s = unique_sleep()
    r = rt.execute(f"sleep {s} & echo started", timeout=20)
    assert r.exit_code == 0 and r.stdout == "started\n" and r.elapsed < 5
    rt.execute(
        f"pkill -f 'sleep {s}' || kill $(pgrep -f 'sleep {s}') || true",
        user="root" if os.geteuid() == 0 else None,
    )


# ----- streaming -----------------------------------------------------------------------------
def test_stream_order_and_finish(rt: Runtime) -> None:
    events = list(rt.stream("for i in 1 2 3; do echo $i; sleep 0.1; done; echo e >&2"))
    assert events[-1].kind == "finished" and events[-1].result is not None
    out = "".join(e.text for e in events if e.kind == "stdout")
    assert out == "1\n2\n3\n"
    assert "".join(e.text for e in events if e.kind == "stderr") == "e\n"
    assert events[-1].result.stdout == "1\n2\n3\n" and events[-1].result.exit_code == 0


def test_stream_data_is_the_commands_own_bytes(rt: Runtime) -> None:
    """`text` is decoded (bytes that are not UTF-8 replaced); `data` keeps the bytes, so a
    caller (the CLI) passes binary output on unchanged. A character split across writes
    comes whole in `text`."""
    script = "printf '\\377a\\303'; sleep 0.2; printf '\\251'; printf '\\303\\251' >&2"
    events = list(rt.stream(["sh", "-c", script]))
    joined = {k: b"".join(e.data for e in events if e.kind == k) for k in ("stdout", "stderr")}
    assert joined == {"stdout": b"\xffa\xc3\xa9", "stderr": b"\xc3\xa9"}
    assert "".join(e.text for e in events if e.kind == "stdout") == "\ufffda\u00e9"
    assert events[-1].result is not None and events[-1].result.stdout == "\ufffda\u00e9"


def test_stream_is_incremental(rt: Runtime) -> None:
    start = time.monotonic()
    for event in rt.stream("echo first; sleep 3; echo second"):
        assert event.kind == "stdout" and event.text == "first\n"
        assert time.monotonic() - start < 2.5
        break


def test_stream_timeout_while_silent(rt: Runtime) -> None:
    events = list(rt.stream("sleep 30", timeout=1))
    result = events[-1].result
    assert result is not None and result.timed_out and result.elapsed < 5


def test_stream_rejects_stdin(rt: Runtime) -> None:
    with pytest.raises(UsageError, match="stdin"):
        rt.stream("cat", stdin="x")  # type: ignore[arg-type]


def test_stream_break_kills_the_command(rt: Runtime) -> None:
    s = unique_sleep()
    gen = rt.stream(f"echo go; sleep {s}")
    for _ in gen:
        break
    gen.close()
    assert survivors_within(rt, s, 5.0) == ""  # killed, not left to sleep for 11 hours


# ----- files ---------------------------------------------------------------------------------
def test_file_text_round_trip_keeps_line_endings(rt: Runtime) -> None:
    rt.write_file("f/crlf.txt", "a\r\nb\n\u00e9")
    assert rt.read_file("f/crlf.txt") == "a\r\nb\n\u00e9"
    assert rt.execute("cat f/crlf.txt").stdout == "a\r\nb\n\u00e9"


def test_write_creates_parents_and_read_bytes(rt: Runtime) -> None:
    rt.write_file("deep/er/x.bin", b"\x00\xff\x01")
    assert rt.read_file("deep/er/x.bin", text=False) == b"\x00\xff\x01"


def test_50mib_binary_file_round_trip(rt: Runtime) -> None:
    data = os.urandom(50 * MiB)
    rt.write_file("big.bin", data)
    assert (
        hashlib.sha256(rt.read_file("big.bin", text=False)).digest()
        == hashlib.sha256(data).digest()
    )
    rt.execute("rm big.bin")


def test_read_missing_file(rt: Runtime) -> None:
    with pytest.raises(FileNotFoundError):
        rt.read_file("missing.txt")
    with pytest.raises(SandboxFileNotFound):
        rt.read_file("missing.txt")


def test_read_and_write_a_folder(rt: Runtime) -> None:
    rt.execute("mkdir -p adir")
    with pytest.raises(IsADirectoryError):
        rt.read_file("adir")
    with pytest.raises(IsADirectoryError):
        rt.write_file("adir", "x")


def test_permission_denied(rt: Runtime, conformance_target: Target) -> None:
    _skip_if(conformance_target, "user", when=os.geteuid() != 0)
    rt.write_file("secret.txt", "s", user="root")
    rt.execute("chmod 600 secret.txt", user="root")
    with pytest.raises(PermissionError):
        rt.read_file("secret.txt", user="65534:65534")
    rt.execute("mkdir -p locked && chmod 555 locked", user="root")
    with pytest.raises(PermissionError):
        rt.write_file("locked/x.txt", "x", user="65534:65534")


def test_a_download_with_something_unreadable_inside_is_permission_denied(
    rt: Runtime, conformance_target: Target, tmp_path: Path
) -> None:
    """GNU tar exits 2 on a file it cannot open, the helper's code for "no such folder": a
    folder that exists was reported missing."""
    _skip_if(conformance_target, "user", when=os.geteuid() != 0)
    name = f"part-{uuid.uuid4().hex[:8]}"
    rt.execute(f"mkdir -p {name}/sub && echo b > {name}/sub/b && chmod 700 {name}/sub", user="root")
    with pytest.raises(PermissionError):
        rt.download(name, tmp_path / "out", user="65534:65534")


def test_file_over_limit(rt: Runtime) -> None:
    rt.write_file("hundred.txt", "x" * 100)
    with pytest.raises(OutputLimitExceeded):
        rt.read_file("hundred.txt", limit=10)
    with pytest.raises(OrchestratorError):
        rt.read_file("hundred.txt", limit=10)


# ----- static assets -------------------------------------------------------------------------
def test_static_placeholders_resolve_in_file_commands_only(rt: Runtime) -> None:
    assert rt.execute("cat .static-copy").stdout == "static hello\n"  # a setup command
    assert rt.execute(rt.file_command("show")).stdout == "static hello\n"
    assert rt.execute(["cat", f"{rt.static_path('data')}/hello.txt"]).stdout == "static hello\n"
    # a caller's text runs as given: model-written text cannot reach paths by placeholder
    r = rt.execute(["echo", "{{static:data}}", "{{static:nope}}"])
    assert r.stdout == "{{static:data}} {{static:nope}}\n"
    with pytest.raises(UsageError, match="no static asset named 'nope'"):
        rt.static_path("nope")
    with pytest.raises(UsageError, match="no command named 'nope'"):
        rt.file_command("nope")


def test_static_assets_are_read_only(rt: Runtime, conformance_target: Target) -> None:
    _skip_if(conformance_target, "static-read-only-as-root", when=os.geteuid() == 0)
    hello = f"{rt.static_path('data')}/hello.txt"
    r = rt.execute(["sh", "-c", 'echo x > "$1"', "sh", hello])
    assert r.exit_code != 0
    assert rt.execute(["cat", hello]).stdout == "static hello\n"


# ----- setup ---------------------------------------------------------------------------------
def test_setup_ran_once_and_output_kept_apart(rt: Runtime) -> None:
    assert rt.setup_result is not None and "setup-marker" in rt.setup_result.stdout
    assert rt.execute("cat .setup-count").stdout == "ran\n"
    r = rt.execute("echo mine")
    assert r.stdout == "mine\n" and "setup-marker" in r.setup_stdout


def test_eval_commands_only_for_evaluation(rt: Runtime) -> None:
    assert rt.execute("cat .eval-count").exit_code != 0


def test_evaluation_and_disabled_setup(conformance_target: Target, tmp_path: Path) -> None:
    with conformance_target.spawn(tmp_path / "a", is_evaluation=True) as rt:
        assert rt.execute("cat .eval-count").stdout == "eval\n"
    with conformance_target.spawn(tmp_path / "b", disable_setup=True) as rt:
        assert rt.setup_result is None and rt.execute("cat .setup-count").exit_code != 0


def test_failing_setup_raises_with_output(conformance_target: Target, tmp_path: Path) -> None:
    with pytest.raises(SetupFailed) as info:
        conformance_target.spawn(tmp_path, setup=("echo ok", "echo boom >&2; exit 9"))
    assert info.value.result_exit_code == 9 and "boom" in info.value.stderr


# ----- lifecycle -----------------------------------------------------------------------------
def test_cleanup_is_idempotent_and_closes(fresh: Runtime) -> None:
    fresh.cleanup()
    fresh.cleanup()
    for call in (
        lambda: fresh.execute("true"),
        lambda: fresh.read_file("x"),
        lambda: fresh.write_file("x", "y"),
        fresh.poll,
        fresh.kill,
    ):
        with pytest.raises(RuntimeClosed):
            call()


def _poll_until_down(rt: Runtime, within: float = 10.0) -> int | None:
    deadline = time.monotonic() + within
    while (status := rt.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def test_poll_and_kill(fresh: Runtime) -> None:
    fresh.execute(f"setsid sleep {unique_sleep()} >/dev/null 2>&1 < /dev/null &")
    assert fresh.poll() is None
    fresh.kill()
    assert _poll_until_down(fresh) == 137  # down, as by SIGKILL: the daemon died too
    with pytest.raises(RuntimeClosed):
        fresh.execute("true")


def test_kill_stops_running_commands(fresh: Runtime) -> None:
    s = unique_sleep()
    results: list[RuntimeResult] = []
    t = threading.Thread(target=lambda: results.append(fresh.execute(f"sleep {s}", timeout=60)))
    t.start()
    time.sleep(1.0)
    started = time.monotonic()
    fresh.kill()
    t.join(20)
    assert not t.is_alive()
    [result] = results  # it ended with a result, not an exception in its thread
    assert result.exit_code == 137 and not result.timed_out and not result.ok
    assert time.monotonic() - started < 10


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_stays_bounded_while_a_command_prints_a_quarter_gigabyte(rt: Runtime) -> None:
    """Output that piled up anywhere would grow us by 256 MiB, far more than the bound."""
    base, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = rt.execute("head -c 268435456 /dev/zero; echo tail", output_limit=MiB, timeout=300)
    finally:
        done.set()
        sampler.join()
    assert r.exit_code == 0 and r.truncated and r.stdout.endswith("\x00tail\n")
    assert peak[0] - base < 150 * MiB, f"grew by {(peak[0] - base) // MiB} MiB"


# ----- hostile input: no request hangs, no deadline slips ------------------------------------
def test_timeout_holds_after_the_command_closes_its_pipes(rt: Runtime) -> None:
    started = time.monotonic()
    r = rt.execute("exec >/dev/null 2>&1; sleep 40", timeout=2)
    assert r.timed_out and time.monotonic() - started < 2 + 3


def test_deadline_holds_while_the_consumer_is_not_reading(rt: Runtime) -> None:
    late = f"late-{uuid.uuid4().hex[:8]}"
    stream = rt.stream(f"(sleep 3; touch {late}) & while :; do echo x; done", timeout=1.5)
    assert next(stream).kind == "stdout"
    time.sleep(4.5)  # not reading: the command blocks on its full pipe, the deadline passes
    events = list(stream)
    assert events[-1].result is not None and events[-1].result.timed_out
    assert rt.execute(f"test -e {late}").exit_code == 1  # killed at 1.5 s, not at 4.5 s


def test_a_stalled_stream_stalls_only_its_own_command(rt: Runtime) -> None:
    stream = rt.stream("yes spam", timeout=60)
    assert next(stream).kind == "stdout"  # then stop reading: it may fill only its own window
    try:
        time.sleep(1)
        started = time.monotonic()
        assert rt.execute("echo other", timeout=10).stdout == "other\n"
        assert time.monotonic() - started < 5
    finally:
        stream.close()


def test_unknown_user_is_exit_126_naming_the_user(rt: Runtime) -> None:
    r = rt.execute("id", user="no-such-user", timeout=10)
    assert r.exit_code == 126 and "no-such-user" in r.stderr
    assert rt.execute("echo fine").stdout == "fine\n"


@pytest.mark.parametrize(
    "call",
    [
        {"command": ["echo", "a\0b"]},
        {"command": "true", "env": {"A=B": "1"}},
        {"command": "true", "env": {"": "1"}},
        {"command": "true", "env": {"A": "x\0y"}},
        {"command": "true", "user": "a b"},
        {"command": "true", "timeout": float("nan")},
    ],
)
def test_requests_no_process_could_take_are_usage_errors(rt: Runtime, call: dict[str, Any]) -> None:
    started = time.monotonic()
    with pytest.raises(UsageError):
        rt.execute(**call)
    assert time.monotonic() - started < 1
    assert rt.execute("echo fine", timeout=10).stdout == "fine\n"


# ----- folders -------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, tuple[str, str]]:
    """name -> (kind and mode, content or link target), for comparing two trees."""
    out = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[name] = ("link", os.readlink(path))
        elif path.is_dir():
            out[name] = (f"dir {path.stat().st_mode & 0o777:o}", "")
        else:
            out[name] = (f"file {path.stat().st_mode & 0o777:o}", path.read_bytes().hex())
    return out


def test_folder_round_trip_keeps_modes_links_and_bytes(rt: Runtime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "deep" / "er").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "deep" / "er" / "data.bin").write_bytes(bytes(range(256)) * 64)
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("deep/er/data.bin")
    (src / "h\u00e9 llo.txt").write_text("spaces and \u00e9")
    dest = f"up-{uuid.uuid4().hex[:8]}"
    rt.upload(src, dest)
    assert rt.execute(["sh", f"{dest}/run.sh"]).stdout == "ran\n"
    assert rt.execute(["readlink", f"{dest}/link"]).stdout == "deep/er/data.bin\n"
    owner = rt.execute(stat_argv("%u", f"{dest}/run.sh")).stdout.strip()
    assert owner == rt.execute(["id", "-u"]).stdout.strip()  # the command user's, not ours
    names = rt.download(dest, tmp_path / "back")
    assert _tree(tmp_path / "back") == _tree(src)
    assert sorted(names) == sorted(_tree(src))


def test_folder_transfer_errors(rt: Runtime, tmp_path: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    rt.write_file(f"{name}/file", "x")
    (tmp_path / "src").mkdir()
    with pytest.raises(NotADirectoryError):
        rt.upload(tmp_path / "src", f"{name}/file")
    with pytest.raises(NotADirectoryError):
        rt.download(f"{name}/file", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        rt.download(f"{name}/missing", tmp_path / "out")
    with pytest.raises(FileNotFoundError):  # the path's words are not the reason's
        rt.download(f"{name}/no-permission-here", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        rt.read_file(f"{name}/Permission denied")
    rt.execute(f"mkfifo {name}-fifo")  # opened, it would wait for a writer: it is not
    started = time.monotonic()
    with pytest.raises(NotADirectoryError):
        rt.download(f"{name}-fifo", tmp_path / "out", timeout=20)
    assert time.monotonic() - started < 10
    with pytest.raises(UsageError):
        rt.upload(tmp_path / "no-such-folder", name)
    rt.write_file(f"{name}/big", "y" * 20000)
    with pytest.raises(OutputLimitExceeded):
        rt.download(name, tmp_path / "out", limit=10000)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_download_cannot_write_outside_its_folder(rt: Runtime, tmp_path: Path) -> None:
    name = f"evil-{uuid.uuid4().hex[:8]}"
    rt.execute(f"mkdir -p {name} && ln -s /etc {name}/escape && echo ok > {name}/a")
    out = tmp_path / "out"
    with pytest.raises(SandboxUnsafeArchive):
        rt.download(name, out)
    assert list(out.iterdir()) == []  # nothing written, not even the private staging folder


def test_a_download_merges_into_what_the_folder_holds(rt: Runtime, tmp_path: Path) -> None:
    name = f"merge-{uuid.uuid4().hex[:8]}"
    rt.execute(f"mkdir -p {name}/d && echo new > {name}/d/same && echo add > {name}/d/added")
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "d" / "same").write_text("old\n")
    (out / "mine").write_text("kept\n")
    assert sorted(rt.download(name, out)) == ["d", "d/added", "d/same"]
    assert (out / "d" / "same").read_text() == "new\n" and (out / "d" / "added").exists()
    assert sorted(p.name for p in out.iterdir()) == ["d", "mine"]  # no staging folder left


# ----- snapshots -----------------------------------------------------------------------------
def test_snapshot_and_resume(conformance_target: Target, tmp_path: Path) -> None:
    with conformance_target.spawn(tmp_path / "a") as first:
        first.write_file("work/notes.txt", "kept\n")
        first.execute("mkdir -p work/empty && ln -s notes.txt work/link && chmod 700 work")
        snap = first.snapshot(tmp_path / "snaps" / "one.tar")
    assert snap.path.is_file() and snap.size > 0 and snap.env == f"conf-{conformance_target.id}"
    with conformance_target.spawn(tmp_path / "b", resume=snap) as second:
        assert second.read_file("work/notes.txt") == "kept\n"
        assert second.execute(["readlink", "work/link"]).stdout == "notes.txt\n"
        assert second.execute(stat_argv("%a", "work")).stdout == "700\n"
        assert second.execute("test -d work/empty").exit_code == 0
        # setup's own commands did not run again; the resume commands did
        assert second.read_file(".setup-count") == "ran\n"
        assert second.read_file(".resume-count") == "resumed\n"
    snap.remove()
    assert not snap.path.exists() and not snap.record.exists()


def _running(rt: Runtime, needle: str) -> bool:
    """Whether a process whose command line holds `needle` runs where rt's commands run."""
    scan = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f" 2>/dev/null; echo; done'
    return needle in rt.execute(scan).stdout


def test_restore_kills_every_process_and_puts_the_workspace_back(
    fresh: Runtime, tmp_path: Path
) -> None:
    fresh.write_file("work/kept.txt", "before\n")
    snap = fresh.snapshot(tmp_path / "base.tar")
    daemon, child = unique_sleep(), unique_sleep()
    fresh.execute(f"setsid sleep {daemon} >/dev/null 2>&1 < /dev/null &")
    fresh.execute(f"sleep {child} >/dev/null 2>&1 < /dev/null &")
    fresh.write_file("work/kept.txt", "changed\n")
    fresh.execute("echo x > new.txt && mkdir -p locked/in && chmod 000 locked work")
    assert _running(fresh, f"sleep {daemon}") and _running(fresh, f"sleep {child}")
    fresh.restore(snap)
    assert fresh.poll() is None  # still up, and usable
    assert not _running(fresh, f"sleep {daemon}") and not _running(fresh, f"sleep {child}")
    assert fresh.read_file("work/kept.txt") == "before\n"
    assert fresh.execute("ls -A").stdout.split() == sorted([".setup-count", ".static-copy", "work"])
    assert fresh.read_file(".setup-count") == "ran\n"  # no setup command ran again
