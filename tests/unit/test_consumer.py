"""A consumer's program using every public name, run here on the local backend and type-checked
with `mypy --strict` by the typecheck gate (tests are checked like the package). If a public
name loses its types, or is added without being exercised, this file fails one of the two."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import orchestrator
from orchestrator import (
    AdmissionTimeout,
    BackendUnavailable,
    BuildChoice,
    CommandFailed,
    CommandTimeout,
    Connection,
    DockerError,
    Egress,
    Environment,
    EnvironmentStatus,
    ExecMode,
    ExecutorLost,
    HealthcheckFailed,
    LockResult,
    OrchestratorError,
    OutputLimitExceeded,
    Policy,
    PolicyError,
    Pool,
    PoolExhausted,
    Process,
    ProcessEnded,
    ProcessNotFound,
    ProjectNotFound,
    PublishedPort,
    Runtime,
    RuntimeClosed,
    RuntimeInfo,
    RuntimeResult,
    Sandbox,
    SandboxFileNotFound,
    SandboxFileTimeout,
    SandboxIsADirectory,
    SandboxNotADirectory,
    SandboxPaused,
    SandboxPermissionError,
    SandboxUnavailable,
    SandboxUnsafeArchive,
    ServiceUsage,
    SetupFailed,
    Snapshot,
    SpawnOptions,
    SpecError,
    SpecIssue,
    StartupError,
    StreamEvent,
    StreamKind,
    Usage,
    UsageError,
    __version__,
    attach,
    attachable,
    backend_class,
    check_admission,
    claim_ready,
    context_address,
    environments,
    fork,
    get_runtime_class,
    list_snapshots,
    load_environment,
    load_environment_text,
    lock_environment,
    prepare,
    reap,
    register_runtime,
    remove_environment,
    running_logs,
    runtime_names,
    spawn_runtime,
    wake,
)

#: Errors a harness tells apart: the environment failing is not the code's result.
ENVIRONMENT_FAILED: tuple[type[OrchestratorError], ...] = (
    BackendUnavailable,
    DockerError,
    ExecutorLost,
    SandboxUnavailable,
    StartupError,
    HealthcheckFailed,
    SetupFailed,
    AdmissionTimeout,
)
CALLER_ERRORS: tuple[type[OrchestratorError], ...] = (
    UsageError,
    SpecError,
    PolicyError,
    ProjectNotFound,
    RuntimeClosed,
)
FILE_ERRORS: tuple[type[OrchestratorError], ...] = (
    SandboxFileNotFound,
    SandboxFileTimeout,
    SandboxIsADirectory,
    SandboxNotADirectory,
    SandboxPermissionError,
    SandboxUnsafeArchive,
    OutputLimitExceeded,
)


def grade(rt: Sandbox, command: str, timeout: float = 10) -> tuple[int, str]:
    """What a harness does: run, tell a failed command from a failed environment."""
    try:
        result: RuntimeResult = rt.execute(command, timeout=timeout, check=True)
    except CommandTimeout as exc:
        return -1, exc.result.stdout
    except CommandFailed as exc:
        return exc.result.exit_code, exc.result.stderr
    return result.exit_code, result.stdout


def stream_kinds(rt: Runtime, command: str) -> list[StreamKind]:
    kinds: list[StreamKind] = []
    events = rt.stream(command)
    for event in events:
        ev: StreamEvent = event
        if ev.kind != "finished":
            kinds.append(ev.kind)
    events.close()
    return kinds


def talk(rt: Sandbox) -> tuple[str, int]:
    """A process a harness talks to: a line written, its answer read, its input ended."""
    proc: Process = rt.start(["sh", "-c", "read x; echo got-$x; cat"], timeout=10)
    proc.write("hi\n")
    first = proc.read(10)
    proc.close_stdin()
    result: RuntimeResult = proc.wait(10)
    with pytest.raises(ProcessEnded):  # a BrokenPipeError too: its input is gone
        proc.write("late")
    assert proc.id is None  # not kept: nobody can read it again
    with pytest.raises(UsageError):  # this place keeps no process beyond its caller
        rt.start(["true"], keep=True)
    assert issubclass(ProcessNotFound, LookupError)  # what a kept id nobody knows raises
    return (first.text if first is not None else ""), result.exit_code


def ports_text(ports: tuple[PublishedPort, ...]) -> list[str]:
    return [f"{p.service}:{p.container}->{p.host_ip}:{p.host}/{p.protocol}" for p in ports]


def describe(rt: Runtime) -> tuple[RuntimeInfo, ExecMode, Connection]:
    info = rt.info()
    return info, info.exec_mode, rt.connection()


def test_a_consumer_program(tmp_path: Path) -> None:
    assert __version__ and {"docker", "local"} <= set(runtime_names())
    text = "version: 1\nname: consumer\nbackend: local\nsetup: {commands: ['echo ready']}\n"
    env: Environment = load_environment_text(text, source="c.yaml", base_dir=tmp_path)
    (tmp_path / "env.yaml").write_text(text)
    assert load_environment(tmp_path / "env.yaml").digest == env.digest
    pinned: LockResult = lock_environment(  # env.yaml.lock: what it resolves to, reviewed
        tmp_path / "env.yaml", backend="local", policy=Policy(allow_unisolated=True)
    )
    assert pinned.written and pinned.path.name == "env.yaml.lock"
    with spawn_runtime(env, workspace=tmp_path / "ws", policy=Policy(allow_unisolated=True)) as rt:
        assert grade(rt, "echo hi") == (0, "hi\n")
        assert grade(rt.service("main"), "echo main") == (0, "main\n")
        assert grade(rt, "echo no >&2; exit 3") == (3, "no\n")
        assert grade(rt, "echo started; sleep 30", timeout=0.5) == (-1, "started\n")
        assert stream_kinds(rt, "echo a; echo b >&2") == ["stdout", "stderr"]
        info, mode, connection = describe(rt)
        assert (info.backend, mode, connection.kind, ports_text(info.ports)) == (
            "local",
            "process",
            "local",
            [],
        )
        assert talk(rt) == ("got-hi\n", 0)
        rt.write_file("f.bin", b"\x00\xff")
        data: bytes = rt.read_file("f.bin", text=False)
        text_: str = rt.read_file("f.bin")
        assert (data, text_) == (b"\x00\xff", "\x00\ufffd")
        with pytest.raises(FILE_ERRORS):
            rt.read_file("missing")
        (tmp_path / "tree" / "sub").mkdir(parents=True)
        (tmp_path / "tree" / "sub" / "a.txt").write_text("a")
        rt.upload(tmp_path / "tree", "copied")
        names: list[str] = rt.download("copied", tmp_path / "back")
        assert "sub/a.txt" in names and (tmp_path / "back" / "sub" / "a.txt").read_text() == "a"
        with pytest.raises(CALLER_ERRORS):
            rt.static_path("nope")
        saved: Snapshot = rt.snapshot("consumer-snap")
        assert saved in list_snapshots()
        rt.pause()  # frozen where it is (the local backend: SIGSTOP), until resume()
        paused: bool = rt.paused
        with pytest.raises(SandboxPaused):  # a SandboxUnavailable: the environment, not the code
            rt.execute("true")
        rt.resume()
        assert paused and not rt.paused and rt.execute("true").ok
        cost: Usage = rt.usage()  # what it cost so far: the local backend counts commands
        main: ServiceUsage = cost.services["main"]
        assert main.commands >= 8 and not cost.measured and cost.total == main
        through: Egress | None = cost.egress  # (a gateway's counts: the local backend has none)
        assert through is None
        backend = type(rt)
    assert backend_class(env) is get_runtime_class(env.backend) is backend
    options = SpawnOptions(workspace=tmp_path / "ws", policy=Policy(), disable_setup=True)
    with backend.spawn(env, options) as direct:  # a backend class spawns directly too
        assert direct.setup_result is None and direct.execute("pwd").ok
    with spawn_runtime(env, workspace=tmp_path / "resumed", resume="consumer-snap") as again:
        assert again.read_file("f.bin", text=False) == b"\x00\xff"
    saved.remove()
    with spawn_runtime(env, workspace=tmp_path / "s", policy=Policy(allow_unisolated=True)) as up:
        up.write_file("kept.txt", "kept")
        [copy] = fork(up, 1)  # a copy of it as it is now, under its own id; it runs on
        with copy:
            assert copy.read_file("kept.txt") == "kept" and copy.info().id != up.info().id
        record: Snapshot = up.suspend("consumer-suspended")  # saved to disk, then removed
    assert up.closed and record.suspended
    with wake(record.name, env=env, workspace=tmp_path / "woken") as woken:  # a new id
        assert woken.read_file("kept.txt") == "kept" and record not in list_snapshots()
    choice: BuildChoice = "never"  # an image, not a build: nothing to build either way
    assert prepare(env, build=choice).digest == env.digest  # once before many spawns
    check_admission(env, 2)  # two of it fit this host's budget at once
    assert attachable(env) == []  # a local sandbox is left running for no one to attach to
    with pytest.raises(CALLER_ERRORS):
        attach("orch-consumer-00000000")  # a Runtime, for an environment left running
    with Pool(env, size=1, total=1) as pool:  # a batch of one: no start after it
        pooled: Runtime = pool.acquire(timeout=30)
        assert grade(pooled, "echo pooled") == (0, "pooled\n")
        pool.release(pooled)
        with pytest.raises(PoolExhausted):  # the rest start their own
            pool.acquire(timeout=30)
    with pytest.raises(SpecError) as caught:
        load_environment_text("version: 1\nname: x\nimage: i\nnetwork: {mode: bridged}\n")
    issue: SpecIssue = caught.value.issues[0]
    assert issue.field == "network.mode" and issue.line == 4
    assert not issubclass(RuntimeClosed, ENVIRONMENT_FAILED)
    # environments left running, across backends (`ps`, `down`, `cleanup`): a harness's view
    inventory: tuple[object, ...] = (environments, remove_environment, reap, EnvironmentStatus)
    assert all(callable(f) for f in inventory)
    # the logs of one left running, read without attaching: none here by that id
    assert running_logs("orch-consumer-00000000", tail=5) is None
    try:
        assert register_runtime("consumer-alias")(backend) is backend
        with spawn_runtime(env, backend="consumer-alias") as alias:
            assert alias.info().backend == "consumer-alias" and rt.name == "local"
    finally:
        from orchestrator.sandbox import registry

        registry._registered.pop("consumer-alias", None)


def test_a_context_the_docker_cli_does_not_know_is_a_usage_error() -> None:
    """`--context NAME` resolves through the engine (the CLI runs no docker command)."""
    with pytest.raises(UsageError, match="no Docker context"):
        context_address("orchestrator-no-such-context")


def test_claiming_from_no_running_pool_takes_nothing(tmp_path: Path) -> None:
    """`up --pool`'s library half: with no pool of this file running, nothing is claimed and
    the taker is never called."""
    env = load_environment_text("version: 1\nname: unpooled\nimage: x:1\n", base_dir=tmp_path)
    called: list[object] = []
    assert claim_ready(env, 3, called.append) == [] and called == []


def test_the_program_names_every_public_name() -> None:
    tree = ast.parse(Path(__file__).read_text())
    [imported] = [
        n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "orchestrator"
    ]
    assert sorted(a.name for a in imported.names) == sorted(orchestrator.__all__)


def test_an_async_consumer_program(tmp_path: Path) -> None:
    """The asyncio front door, every name of `orchestrator.aio`, on the local backend."""
    from orchestrator.aio import AsyncPool, AsyncRuntime, AsyncSandbox, attach, in_thread, spawn

    text = "version: 1\nname: consumer-aio\nbackend: local\n"
    env = load_environment_text(text, source="aio.yaml", base_dir=tmp_path)
    policy = Policy(allow_unisolated=True)

    async def program() -> None:
        async with await spawn(env, workspace=tmp_path / "ws", policy=policy) as rt:
            assert isinstance(rt, AsyncRuntime) and isinstance(rt, AsyncSandbox)
            result: RuntimeResult = await rt.execute("echo out; echo err >&2; exit 3")
            assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
            kinds = [event.kind async for event in rt.stream("echo a; echo b >&2")]
            assert kinds[-1] == "finished" and {"stdout", "stderr"} <= set(kinds)
            await rt.write_file("f.txt", "hi")
            assert await rt.read_file("f.txt") == "hi"
            assert await in_thread(lambda: 6 * 7) == 42  # any blocking call, no limiter
            later = asyncio.ensure_future(rt.execute("sleep 30"))
            await asyncio.sleep(0.3)
            later.cancel()  # the command is killed; the sandbox goes on
            with pytest.raises(asyncio.CancelledError):
                await later
            assert (await rt.execute("echo on")).stdout == "on\n"
        assert rt.closed
        with pytest.raises(ProjectNotFound):
            await attach("orch-consumer-00000000")
        async with await AsyncPool.start(env, 1, policy=policy) as pool:
            pooled = await pool.acquire(timeout=30)
            assert (await pooled.execute("echo pooled")).stdout == "pooled\n"
            await pool.release(pooled)

    asyncio.run(program())


def test_the_async_program_names_every_name_of_aio() -> None:
    from orchestrator import aio

    tree = ast.parse(Path(__file__).read_text())
    [imported] = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "orchestrator.aio"
    ]
    assert sorted(a.name for a in imported.names) == sorted(aio.__all__)
