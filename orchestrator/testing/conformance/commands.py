"""The conformance checks of a command: exit codes, output (both streams, limits, encodings),
input, per-call environment, folder and user, timeouts that kill the whole tree, and streams."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from orchestrator import Runtime, settings
from orchestrator.errors import (
    CommandFailed,
    OrchestratorError,
    UsageError,
)
from orchestrator.testing.conformance.kit import (
    MiB,
    skip_if,
    survivors,
    survivors_within,
    unique_sleep,
)
from orchestrator.testing.target import Target


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
    skip_if(conformance_target, "user", when=os.geteuid() != 0)
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
        # starts another process when SIGTERM comes: the SIGKILL that follows the grace
        # looks again (the plain path sends both from one exec)
        (
            "sh -c \"trap 'sleep {s} &' TERM; while :; do sleep 0.05; done\" & sleep {s}; wait",
            "",
            10,
        ),
    ],
    ids=[
        "grandchildren",
        "left-the-group",
        "pipe-held-open",
        "ignores-sigterm",
        "forks-at-sigterm",
    ],
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
    assert survivors_within(rt, s, 5.0) == ""  # killed, not left to sleep for years
