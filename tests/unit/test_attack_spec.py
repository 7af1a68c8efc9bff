"""Attacks from a hostile environment file (issue 19, the spec half): a file that pulls the
caller's secrets into the sandbox, a file that grants itself MKNOD, and host paths that make
the lookup itself fail. "The file never allows more": only the caller's Policy does."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import PolicyError, SpecError, load_environment_text, spawn_runtime
from orchestrator.backends.docker.render import CompiledProject, CompileOptions, compile_project
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import resolve_env

ROOT = Path(__file__).resolve().parents[2]
BASE = "version: 1\nname: t\nimage: img:1\nuser: '1000:1000'\n"
SECRET = "ORCH_SECRET_TEST"


def allow_secret() -> Policy:
    """The caller's policy letting the secret through."""
    return Policy(allow_env=frozenset({SECRET}))


def compile_text(text: str, folder: Path, **kw: Any) -> CompiledProject:
    (folder / "ws").mkdir(exist_ok=True)
    env = load_environment_text(text, source="env.yaml", base_dir=folder)
    return compile_project(env, CompileOptions(project="p", workspace=folder / "ws", **kw))


# ----- High 2: the file alone passes no host variable ----------------------------------------

FILES = {
    "star": BASE + "env_passthrough: ['*']\n",
    "named": BASE + f"env_passthrough: [{SECRET}]\n",
    "legacy": "name: t\ntype: docker\ndocker: {image: img:1}\n"
    "environment: {include_os_env: true}\n",
}


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(SECRET, "s3cret")
    monkeypatch.delenv("ORCHESTRATOR_ALLOW_ENV", raising=False)
    return "s3cret"


@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_file_alone_pulls_no_host_secret(tmp_path: Path, secret: str, kind: str) -> None:
    compiled = compile_text(FILES[kind], tmp_path)
    assert secret not in compiled.compose_yaml and SECRET not in compiled.env
    said = "\n".join(compiled.warnings)
    assert "ORCHESTRATOR_ALLOW_ENV" in said  # the warning says how the caller allows it
    if kind == "named":
        assert SECRET in said


@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_file_alone_pulls_no_host_secret_on_swarm(tmp_path: Path, secret: str, kind: str) -> None:
    env = load_environment_text(FILES[kind], source="env.yaml", base_dir=tmp_path)
    stack = compile_stack(env, StackOptions(project="p"))
    assert secret not in stack.stack_yaml and SECRET not in stack.env
    assert any("ORCHESTRATOR_ALLOW_ENV" in w for w in stack.warnings)
    allowed = compile_stack(env, StackOptions(project="p", policy=allow_secret()))
    assert allowed.env[SECRET] == secret


@pytest.mark.parametrize("kind", sorted(FILES))
def test_the_caller_passes_what_the_file_names(
    tmp_path: Path, secret: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = compile_text(FILES[kind], tmp_path, policy=allow_secret())
    assert compiled.env[SECRET] == secret and "HOME" not in compiled.env
    monkeypatch.setenv("ORCHESTRATOR_ALLOW_ENV", f"OTHER, {SECRET}")  # the caller, by variable
    assert compile_text(FILES[kind], tmp_path).env[SECRET] == secret


def test_the_caller_allowing_everything_still_passes_only_what_the_file_names(
    tmp_path: Path, secret: str
) -> None:
    everything = Policy(allow_env=frozenset({"*"}))
    assert SECRET not in compile_text(BASE + "env_passthrough: [HOME]\n", tmp_path).env
    named = compile_text(BASE + "env_passthrough: [HOME]\n", tmp_path, policy=everything)
    assert SECRET not in named.env and named.env["HOME"] == os.environ["HOME"]
    star = compile_text(FILES["star"], tmp_path, policy=everything)
    assert star.env[SECRET] == secret
    assert any(w.startswith("WARNING") and "every host variable" in w for w in star.warnings)


def test_resolve_env_without_a_policy_is_the_processs_policy(secret: str) -> None:
    env = load_environment_text(FILES["star"]).spec
    assert SECRET not in resolve_env(env, None)
    assert resolve_env(env, None, policy=allow_secret())[SECRET] == secret


def test_legacy_include_os_env_says_it_passes_nothing_by_default(secret: str) -> None:
    env = load_environment_text(FILES["legacy"])
    assert any("include_os_env" in n and "ORCHESTRATOR_ALLOW_ENV" in n for n in env.notices)


def test_local_backend_passes_no_host_secret_on_the_files_word(tmp_path: Path, secret: str) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(f"version: 1\nname: t\nbackend: local\nenv_passthrough: ['*', {SECRET}]\n")
    with spawn_runtime(path) as rt:
        assert secret not in rt.execute("env").stdout
        assert any(SECRET in w and "ORCHESTRATOR_ALLOW_ENV" in w for w in rt.warnings)
    with spawn_runtime(path, backend="local", policy=allow_secret()) as rt:
        assert f"{SECRET}={secret}" in rt.execute("env").stdout


# ----- High 3 (spec half): MKNOD only by the caller's policy ----------------------------------


@pytest.mark.parametrize("cap", ["MKNOD", "cap_mknod", "mknod"])
@pytest.mark.parametrize("where", ["main", "service"])
def test_a_file_cannot_grant_itself_mknod(tmp_path: Path, cap: str, where: str) -> None:
    body = (
        f"cap_add: [{cap}]\n"
        if where == "main"
        else (f"services: {{db: {{image: x, user: root, cap_add: [{cap}]}}}}\n")
    )
    text = BASE.replace("'1000:1000'", "root") + body
    with pytest.raises(PolicyError) as info:
        compile_text(text, tmp_path)
    message = str(info.value)
    assert "capability MKNOD is not allowed" in message and "device nodes" in message
    assert "ORCHESTRATOR_ALLOW_CAPS=MKNOD" in message  # the fix: only the caller grants it
    env = load_environment_text(text, source="env.yaml", base_dir=tmp_path)
    with pytest.raises(PolicyError, match="MKNOD"):
        compile_stack(env, StackOptions(project="p"))


def test_the_caller_may_grant_mknod_with_a_warning(tmp_path: Path) -> None:
    text = BASE.replace("'1000:1000'", "root") + "cap_add: [MKNOD]\n"
    compiled = compile_text(text, tmp_path, policy=Policy(allow_caps=frozenset({"MKNOD"})))
    assert "MKNOD" in compiled.compose_yaml
    assert any(w.startswith("WARNING") and "device nodes" in w for w in compiled.warnings)


# ----- Low 17: a host path the lookup itself chokes on is a SpecError, never a traceback -----

HOSTILE = {
    "proc-root": "/proc/1/root",
    "proc-root-child": "/proc/1/root/etc/shadow",
    "proc-cwd": "/proc/1/cwd",
    "loop": "loop/x",
    "too-long": "x" * 300,
    "nul": "a\0b",
}


def _hostile(folder: Path, key: str) -> str:
    """The path (and for `loop`, a symlink loop a -> b -> a under `folder`)."""
    if key == "loop":
        (folder / "loop").mkdir(exist_ok=True)
        for a, b in (("a", "b"), ("b", "a")):
            if not (folder / "loop" / a).is_symlink():
                (folder / "loop" / a).symlink_to(b)
        return str(folder / "loop" / "a" / "x")
    return HOSTILE[key]


def _yaml(path: str) -> str:
    return '"' + path.replace("\\", "\\\\").replace("\0", "\\0") + '"'


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_unreadable_static_asset_is_a_spec_error_at_its_line(tmp_path: Path, key: str) -> None:
    text = (
        BASE
        + f"static_assets:\n  - {{name: s, save_path: s, path: {_yaml(_hostile(tmp_path, key))}}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_environment_text(text, source="env.yaml", base_dir=tmp_path)
    (issue,) = info.value.issues
    assert issue.field == "static_assets.0.path" and issue.line == 6 and issue.fix
    assert "\0" not in str(issue)  # a NUL byte is shown escaped, not written out


@pytest.mark.parametrize("key", sorted(HOSTILE))
@pytest.mark.parametrize(
    ("template", "field"),
    [
        ("mounts: [{{source: {p}, target: /m}}]\n", "mounts.0.source"),
        ("services: {{db: {{image: x, mounts: [{{source: {p}, target: /m}}]}}}}\n", "services.db"),
        ("build: {{context: {p}}}\n", "build.context"),
        ("services: {{db: {{build: {{context: {p}}}}}}}\n", "services.db.build.context"),
    ],
)
def test_unreadable_host_path_is_a_spec_error_naming_its_field(
    tmp_path: Path, key: str, template: str, field: str
) -> None:
    text = BASE.replace("image: img:1\n", "") if template.startswith("build") else BASE
    text += template.format(p=_yaml(_hostile(tmp_path, key)))
    with pytest.raises(SpecError) as info:
        compile_text(text, tmp_path)
    assert field in str(info.value) and "fix:" in str(info.value)


@pytest.mark.parametrize("key", ["proc-root", "too-long", "nul"])
def test_unreadable_workspace_is_a_spec_error(tmp_path: Path, key: str) -> None:
    env = load_environment_text(BASE, source="env.yaml", base_dir=tmp_path)
    with pytest.raises(SpecError, match="workspace"):
        compile_project(env, CompileOptions(project="p", workspace=Path(HOSTILE[key])))


def test_unknown_home_in_a_mount_source_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"mounts\.0\.source"):
        compile_text(BASE + "mounts: [{source: ~no-such-user-orch/x, target: /m}]\n", tmp_path)


SEGMENTS = ["proc", "1", "self", "root", "cwd", "..", ".", "loop", "a", "x" * 260, "a\0b", "~"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=5), st.booleans())
def test_any_hostile_host_path_is_a_spec_error_or_fine(parts: list[str], absolute: bool) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _hostile(folder, "loop")
        (folder / "a").mkdir()
        p = _yaml(path)
        for body in (
            f"static_assets: [{{name: s, save_path: s, path: {p}}}]\n",
            f"mounts: [{{source: {p}, target: /m}}]\n",
            f"services: {{db: {{image: x, mounts: [{{source: {p}, target: /m}}]}}}}\n",
            f"env: {{}}\nbuild: {{context: {p}}}\n",
        ):
            text = BASE.replace("image: img:1\n", "") + body if "build" in body else BASE + body
            try:
                compile_text(text, folder)
            except SpecError as exc:
                assert exc.issues and all(i.field for i in exc.issues)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize("key", ["proc-root", "loop", "too-long"])
@pytest.mark.parametrize("where", ["static_assets", "mounts"])
def test_cli_exits_2_without_a_traceback(tmp_path: Path, key: str, where: str) -> None:
    p = _yaml(_hostile(tmp_path, key))
    body = (
        f"static_assets:\n  - {{name: s, save_path: s, path: {p}}}\n"
        if where == "static_assets"
        else f"mounts: [{{source: {p}, target: /m}}]\n"
    )
    env = tmp_path / "env.yaml"
    env.write_text(BASE + body)
    r = _cli("validate", str(env))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{where}.0" in r.stderr and "fix:" in r.stderr
    if where == "static_assets":
        assert f"{env}:6:" in r.stderr  # file and line
