"""The provider's lifecycle beyond single calls: every service by name, connection(), keeping
environments for --no-sandbox-cleanup, and `inspect sandbox cleanup orchestrator`."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from inspect_ai.util import OutputLimitExceededError, SandboxEnvironment, SandboxUnavailableError
from inspect_ai.util._sandbox.limits import override_max_exec_output_size

from orchestrator.backends.container.inventory import list_projects
from orchestrator.errors import UsageError
from orchestrator.integrations.inspect import (
    OrchestratorSandbox,
    OrchestratorSandboxConfig,
    metadata_env,
)
from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE, labelled_ids

pytestmark = pytest.mark.docker


def env_file(folder: Path, name: str = "provider") -> str:
    """The tests' file; each test that lists environments by name has a name of its own (the
    tests of this module may run at once, in several workers)."""
    path = folder / "env.yaml"
    path.write_text(
        f"version: 1\nname: {name}\nimage: {PYTHON_IMAGE}\nuser: '1000:1000'\n"
        f"services:\n  web: {{image: {BUSYBOX_IMAGE}, command: [sleep, '3600']}}\n"
    )
    return str(path)


def test_metadata_become_inspect_variables() -> None:
    assert metadata_env({"word": "a b", "n-1": 2, "skip": {"x": 1}}) == {
        "SAMPLE_METADATA_WORD": "a b",
        "SAMPLE_METADATA_N_1": "2",
    }


def test_services_by_name_connection_keep_and_cli_cleanup(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    config = env_file(tmp_path)
    before = labelled_ids()

    async def scenario() -> str:
        await OrchestratorSandbox.task_init("t", config)
        envs: dict[str, SandboxEnvironment] = await OrchestratorSandbox.sample_init(
            "t", config, {"word": "hi"}
        )
        assert list(envs) == ["default", "web"]  # default first, then every service
        r = await envs["default"].exec(["sh", "-c", "id -u; echo $SAMPLE_METADATA_WORD"])
        assert r.stdout == "1000\nhi\n"
        assert (await envs["web"].exec(["hostname"])).success
        connection = await envs["default"].connection()
        argv = [a if a != "-it" else "-i" for a in shlex.split(connection.command)]
        shell = subprocess.run(argv, input="id -u; exit\n", capture_output=True, text=True)
        assert shell.stdout.strip() == "1000" and connection.container
        await OrchestratorSandbox.task_cleanup("t", config, cleanup=False)  # keep them
        box = envs["default"]
        assert isinstance(box, OrchestratorSandbox)
        return box.runtime.info().id if not box.runtime.closed else box.runtime.env.name

    kept = asyncio.run(scenario())
    found = [p for p in list_projects() if p.env == "provider"]
    [info] = found if len(found) == 1 else pytest.fail(f"not one 'provider' environment: {found}")
    out = capsys.readouterr().out
    assert f"kept sandbox {info.name}: remove it with `orchestrator down {info.name}`" in out
    assert "running" in {state for _, _, state in info.containers}
    asyncio.run(OrchestratorSandbox.cli_cleanup(info.name))
    assert f"removed {info.name}" in capsys.readouterr().out
    assert labelled_ids() <= before and kept


def test_limits_interruption_and_a_dead_sandbox(tmp_path: Path) -> None:
    config = env_file(tmp_path, "provider-limits")
    before = labelled_ids()

    async def scenario() -> None:
        envs = await OrchestratorSandbox.sample_init("t", config, {})
        box = envs["default"]
        assert isinstance(box, OrchestratorSandbox)
        with override_max_exec_output_size(1024), pytest.raises(OutputLimitExceededError) as info:
            await box.exec(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; echo tail"])
        assert info.value.truncated_output is not None
        assert info.value.truncated_output.endswith("xtail\n")
        with pytest.raises(TimeoutError):
            await box.exec(["sleep", "10"], timeout=1)
        with pytest.raises(PermissionError):
            await box.exec(["/etc/passwd"])
        await box.write_file("bad.txt", b"\xff\xfe")
        with pytest.raises(UnicodeDecodeError):
            await box.read_file("bad.txt")
        subprocess.run(["docker", "kill", f"{box.runtime.info().id}-web-1"], capture_output=True)
        with pytest.raises(SandboxUnavailableError, match="service 'web'"):
            await envs["web"].exec(["true"], timeout=10)
        # interrupted: left to task_cleanup, which removes it
        await OrchestratorSandbox.sample_cleanup("t", config, envs, interrupted=True)
        assert not box.runtime.closed
        await OrchestratorSandbox.task_cleanup("t", config, cleanup=True)
        assert box.runtime.closed

    asyncio.run(scenario())
    assert labelled_ids() <= before


def test_task_init_builds_images_once(tmp_path: Path) -> None:
    from orchestrator.services.spawn import prepare

    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {PYTHON_IMAGE}\nRUN echo built > /built\n")
    path = tmp_path / "env.yaml"
    path.write_text(
        f"version: 1\nname: prep-{tmp_path.name[-6:].lower()}\nbuild: {{context: ctx}}\n"
    )
    from orchestrator.backends.docker.buildplan import build_tags
    from orchestrator.spec.loader import load_environment

    [tag] = build_tags(load_environment(path))
    try:
        asyncio.run(OrchestratorSandbox.task_init("t", str(path)))
        assert (
            subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0
        )
        from orchestrator.backends.docker.render import CompileOptions, compile_project
        from orchestrator.backends.docker.start import build_images

        env = load_environment(path)
        compiled = compile_project(env, CompileOptions(project="p", workspace=tmp_path))
        assert build_images(env, compiled) == []
        prepare(path)  # and again: nothing to build
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_a_service_named_default_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(
        f"version: 1\nname: d\nimage: {PYTHON_IMAGE}\n"
        f"services: {{default: {{image: {BUSYBOX_IMAGE}}}}}\n"
    )
    with pytest.raises(UsageError, match="service named 'default' would hide the main sandbox"):
        asyncio.run(OrchestratorSandbox.task_init("t", str(path)))


def test_a_cancelled_sample_leaves_no_process_and_a_usable_sandbox(tmp_path: Path) -> None:
    """Inspect cancels a sample's task (its time limit, an error elsewhere, Ctrl-C) while a
    command sleeps: that command's whole tree dies in the sandbox, at once, and the sandbox
    answers the next call as before."""
    config = env_file(tmp_path, "provider-cancel")
    before = labelled_ids()
    alive = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f | grep -q '[s]leep 321' "
        "&& echo $f; done; true"
    )

    async def scenario() -> tuple[str, str, str]:
        envs = await OrchestratorSandbox.sample_init("t", config, {})
        box = envs["default"]
        try:
            task = asyncio.ensure_future(box.exec(["sh", "-c", "sleep 321 & setsid sleep 321"]))
            # both sleeps run before the cancel (a fixed pause can be too short under load);
            # "^" counts the sleeps alone, not a shell that holds their text
            sleeps = alive.replace("'[s]leep 321'", "'^[s]leep 321'")
            deadline = time.monotonic() + 30
            while True:
                running = (await box.exec(["sh", "-c", sleeps], user="root")).stdout
                if running.count("/proc/") >= 2:
                    break
                assert time.monotonic() < deadline and not task.done(), (
                    f"both sleeps never ran in 30 s: {running!r}"
                )
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 10)  # not after the 321 s
            left = "?"
            for _ in range(20):  # the kill is sent at once; the engine reports it soon after
                left = (await box.exec(["sh", "-c", alive], user="root")).stdout
                if not left:
                    break
                await asyncio.sleep(0.25)
            after = await box.exec(["sh", "-c", "echo usable"])
            return running, left, after.stdout
        finally:
            await OrchestratorSandbox.sample_cleanup("t", config, envs, interrupted=False)
            await OrchestratorSandbox.task_cleanup("t", config, cleanup=True)

    running, left, after = asyncio.run(scenario())
    assert running.count("/proc/") >= 2, running  # both sleeps ran
    assert left == "" and after == "usable\n"
    assert labelled_ids() <= before


def test_a_prewarmed_task_gives_every_sample_a_fresh_environment(tmp_path: Path) -> None:
    config = OrchestratorSandboxConfig(file=env_file(tmp_path, "provider-warm"), prewarm=2)
    assert OrchestratorSandbox.config_deserialize(config.model_dump()) == config
    with pytest.raises(ValueError, match="prewarm"):
        OrchestratorSandboxConfig(file="env.yaml", prewarm=-1)
    with pytest.raises(ValueError, match="samples"):
        OrchestratorSandboxConfig(file="env.yaml", prewarm=2, samples=0)
    before = labelled_ids()

    async def scenario() -> list[str]:
        # as Inspect calls them: task_init and task_cleanup once for the eval, under names of
        # their own; sample_init under the task's
        await OrchestratorSandbox.task_init("startup", config)
        seen = []
        try:
            for word in ("one", "two", "three"):
                envs = await OrchestratorSandbox.sample_init("t", config, {"word": word})
                box = envs["default"]
                assert isinstance(box, OrchestratorSandbox) and box.pool is not None
                first = await box.exec(
                    ["sh", "-c", "test ! -e used && touch used && echo $SAMPLE_METADATA_WORD"]
                )
                seen.append(box.runtime.info().id + " " + first.stdout.strip())
                await OrchestratorSandbox.sample_cleanup("t", config, envs, interrupted=False)
        finally:
            await OrchestratorSandbox.task_cleanup("shutdown", config, cleanup=True)
        return seen

    seen = asyncio.run(scenario())
    assert [s.split()[1] for s in seen] == ["one", "two", "three"]
    assert len({s.split()[0] for s in seen}) == 3  # never the same environment twice
    assert labelled_ids() <= before  # the pool's waiting ones went with task_cleanup


def test_a_prewarmed_task_told_its_samples_starts_none_for_nothing(tmp_path: Path) -> None:
    """prewarm=2 for 3 samples: the pool starts 3 environments in all (none is left waiting
    at the end); a 4th sample (a retry) starts its own."""
    config = OrchestratorSandboxConfig(
        file=env_file(tmp_path, "provider-total"), prewarm=2, samples=3
    )
    before = labelled_ids()

    async def scenario() -> tuple[list[bool], int, int]:
        await OrchestratorSandbox.task_init("startup", config)
        warm, ids = [], set()
        try:
            for _ in range(4):
                envs = await OrchestratorSandbox.sample_init("t", config, {})
                box = envs["default"]
                assert isinstance(box, OrchestratorSandbox)
                warm.append(box.pool is not None)
                assert (await box.exec(["sh", "-c", "test ! -e used && touch used"])).success
                ids.add(box.runtime.info().id)
                await OrchestratorSandbox.sample_cleanup("t", config, envs, interrupted=False)
            pool = OrchestratorSandbox._pools[config].sync
            left = pool.ready + pool.starting
        finally:
            await OrchestratorSandbox.task_cleanup("shutdown", config, cleanup=True)
        return warm, len(ids), left

    warm, distinct, left = asyncio.run(scenario())
    assert warm == [True, True, True, False] and distinct == 4 and left == 0
    assert labelled_ids() <= before


def test_prewarm_is_refused_for_a_compose_file_that_reads_sample_metadata(
    tmp_path: Path,
) -> None:
    """A warm pool starts environments before any sample exists: a Compose file that
    interpolates a sample's metadata cannot be prewarmed, and says so before anything starts."""
    path = tmp_path / "compose.yaml"
    path.write_text(
        f"services:\n  default:\n    image: {BUSYBOX_IMAGE}\n"
        "    environment: {WORD: '${SAMPLE_METADATA_WORD}'}\n"
    )
    before = labelled_ids()
    config = OrchestratorSandboxConfig(file=str(path), prewarm=2)
    with pytest.raises(UsageError, match="SAMPLE_METADATA"):
        asyncio.run(OrchestratorSandbox.task_init("compose-warm", config))
    assert labelled_ids() <= before
