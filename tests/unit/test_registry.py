"""`backend:` is a name checked against the registry, and what is particular to a backend is
asked of its class (`check`, `prepare`, `render`): a plugin backend, registered through the
entry-point group by a throwaway dist-info on sys.path (no pip install), is named in a file,
validated, rendered, prepared, spawned and run, by the library and by the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import SpecError, UsageError, get_runtime_class, runtime_names, spawn_runtime
from orchestrator.sandbox import registry
from orchestrator.services.spawn import backend_class, prepare
from orchestrator.spec.loader import Environment, load_environment
from orchestrator.spec.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "orch-test-plugin"
PLUGIN_MODULE = '''
from pathlib import Path
from typing import ClassVar

from orchestrator.backends.local import LocalRuntime
from orchestrator.errors import SpecError

prepared: list[str] = []


class PluginRuntime(LocalRuntime):
    """A backend from outside the package: the local one, with hooks of its own."""

    deviations: ClassVar[dict[str, str]] = dict(LocalRuntime.deviations)

    @classmethod
    def check(cls, env, policy, *, workspace=None):
        if "refuse-me" in env.spec.description:
            raise SpecError(f"{env.source}: the plugin refuses this file")
        return ["the plugin looked at it"]

    @classmethod
    def prepare(cls, env, policy):
        prepared.append(env.name)

    @classmethod
    def render(cls, env, workspace: Path, policy):
        return {"plugin.txt": f"plugin project of {env.name}\\n", "sub/extra.txt": "x\\n"}
'''


def _write_plugin(root: Path) -> Path:
    """A module and its *.dist-info with an `orchestrator.runtimes` entry point, under root."""
    site = root / "site"
    (site / "orch_test_plugin_0").mkdir(parents=True)
    (site / "orch_test_plugin_0" / "__init__.py").write_text(PLUGIN_MODULE)
    info = site / "orch_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: orch-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\n{PLUGIN} = orch_test_plugin_0:PluginRuntime\n"
    )
    return site


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = _write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    yield site
    registry._registered.pop(PLUGIN, None)
    sys.modules.pop("orch_test_plugin_0", None)


def _env_file(folder: Path, body: str) -> Path:
    path = folder / "env.yaml"
    path.write_text(body)
    return path


def test_a_plugin_backend_is_named_in_a_file_and_runs(plugin: Path, tmp_path: Path) -> None:
    assert PLUGIN in runtime_names()
    path = _env_file(tmp_path, f"version: 1\nname: p\nbackend: {PLUGIN}\n")
    env = load_environment(path, backends=runtime_names)
    assert env.backend == PLUGIN
    assert prepare(path).backend == PLUGIN
    assert sys.modules["orch_test_plugin_0"].prepared == ["p"]  # its own prepare ran
    ws = tmp_path / "ws"
    ws.mkdir()
    with spawn_runtime(path, workspace=ws) as rt:
        assert type(rt).__name__ == "PluginRuntime" and rt.info().backend == PLUGIN
        result = rt.execute("echo hi from $PWD")
        assert (result.exit_code, result.stdout) == (0, f"hi from {ws}\n")


def test_unknown_backend_is_one_spec_error_at_the_field(plugin: Path, tmp_path: Path) -> None:
    path = _env_file(tmp_path, "version: 1\nname: t\nimage: i\nbackend: dokcer\n")
    for attempt in (
        lambda: load_environment(path, backends=runtime_names),
        lambda: spawn_runtime(path, workspace=tmp_path),
        lambda: prepare(path),
    ):
        with pytest.raises(SpecError) as info:
            attempt()
        [issue] = info.value.issues
        text = str(issue)
        assert text.startswith(f"{path}:4:10: backend: unknown backend 'dokcer'"), text
        assert "did you mean 'docker'?" in text
        assert re.search(rf"registered backends: .*docker.*local.*{PLUGIN}", text), text


def test_unknown_backend_in_a_legacy_file_points_at_its_type(tmp_path: Path) -> None:
    path = _env_file(tmp_path, "name: l\ntype: locall\nlocal: {}\n")
    with pytest.raises(SpecError, match=r":2:7: backend: unknown backend 'locall'") as info:
        spawn_runtime(path, workspace=tmp_path)
    assert "did you mean 'local'?" in str(info.value)


def test_a_backend_chosen_by_the_caller_stays_a_usage_error(tmp_path: Path) -> None:
    path = _env_file(tmp_path, "version: 1\nname: l\nbackend: local\n")
    with pytest.raises(UsageError, match="unknown backend 'nope'; known backends"):
        spawn_runtime(path, workspace=tmp_path, backend="nope")


def test_an_image_backend_without_image_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """The rule is the backend's now (`needs_image`), not the schema's: a local file needs no
    image, a docker one is refused at spawn and by `check`, before any engine is asked."""
    ok = _env_file(tmp_path, "version: 1\nname: t\nbackend: local\n")
    assert load_environment(ok).spec.image is None
    path = tmp_path / "docker.yaml"
    path.write_text("version: 1\nname: t\n")
    env = load_environment(path)
    for attempt in (
        lambda: spawn_runtime(env, workspace=tmp_path),
        lambda: backend_class(env).check(env, Policy()),
    ):
        with pytest.raises(SpecError, match="the docker backend needs exactly one of `image`"):
            attempt()


def test_render_asks_the_backend(tmp_path: Path) -> None:
    local = load_environment(_env_file(tmp_path, "version: 1\nname: l\nbackend: local\n"))
    with pytest.raises(UsageError, match="local backend has no project file to render"):
        backend_class(local).render(local, tmp_path, Policy())
    swarm = load_environment_text_at(tmp_path, "version: 1\nname: s\nbackend: swarm\nimage: i\n")
    files = backend_class(swarm).render(swarm, tmp_path, Policy())
    assert list(files) == ["stack.yaml"] and "services:" in files["stack.yaml"]


def load_environment_text_at(folder: Path, text: str) -> Environment:
    (folder / "other.yaml").write_text(text)
    return load_environment(folder / "other.yaml")


def _cli(site: Path, *args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path, **env},
    )


def test_cli_validates_renders_and_lists_a_plugin_backend(tmp_path: Path) -> None:
    site = _write_plugin(tmp_path)
    path = _env_file(tmp_path, f"version: 1\nname: p\nbackend: {PLUGIN}\n")
    r = _cli(site, "validate", str(path))
    assert r.returncode == 0, r.stderr
    assert f"backend {PLUGIN}" in r.stdout and "notice: the plugin looked at it" in r.stderr
    schema = json.loads(_cli(site, "schema").stdout)["properties"]["backend"]
    assert {"docker", "swarm", "local", PLUGIN} <= set(schema["enum"])
    out = tmp_path / "out"
    r = _cli(site, "render", str(path), "--out", str(out))
    assert (r.returncode, r.stdout) == (0, "plugin project of p\n"), r.stderr
    assert (out / "sub" / "extra.txt").read_text() == "x\n"
    refused = _env_file(
        tmp_path, f"version: 1\nname: p\nbackend: {PLUGIN}\ndescription: refuse-me\n"
    )
    r = _cli(site, "validate", str(refused))
    assert r.returncode == 2 and "the plugin refuses this file" in r.stderr


def test_cli_names_an_unknown_backend_with_its_place(tmp_path: Path) -> None:
    path = _env_file(tmp_path, "version: 1\nname: t\nimage: i\nbackend: swram\n")
    for verb in ("validate", "render"):
        r = _cli(tmp_path, verb, str(path))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"{path}:4:10: backend: unknown backend 'swram'" in r.stderr
        assert "did you mean 'swarm'?" in r.stderr


def test_render_of_a_backend_without_a_project_says_so(tmp_path: Path) -> None:
    r = _cli(tmp_path, "render", str(ROOT / "environments" / "local.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "local backend has no project file to render" in r.stderr


# what may test a backend's name: the backends themselves, and files of other helpers still
# being moved to the backend hooks (remove each entry once its file asks the backend class)
_NAMES_A_BACKEND_OK: set[str] = set()


def test_nothing_outside_a_backend_tests_a_backend_name() -> None:
    package = ROOT / "orchestrator"
    pattern = re.compile(r"""\bbackend\s*(==|!=|in)\s*[("'\[]""")
    found = []
    for source in package.rglob("*.py"):
        rel = source.relative_to(package).as_posix()
        if rel.startswith("backends/") or rel in _NAMES_A_BACKEND_OK:
            continue
        found += [
            f"{rel}: {line.strip()}"
            for line in source.read_text().splitlines()
            if pattern.search(line)
        ]
    assert not found, found


@pytest.mark.parametrize(
    "name", ["orchestrator.backends.local:LocalRuntime", "os:system", "../local", "x" * 65]
)
def test_a_hostile_file_cannot_name_an_import_path(tmp_path: Path, name: str) -> None:
    """A name is looked up among registered backends; it is never imported as written."""
    path = _env_file(tmp_path, f"version: 1\nname: t\nbackend: '{name}'\n")
    with pytest.raises(SpecError, match=r":3:10: backend"):
        spawn_runtime(path, workspace=tmp_path)
    with pytest.raises(UsageError, match="unknown backend"):
        registry.get_runtime_class(name)


def test_render_checks_against_the_workspace_it_renders_for(tmp_path: Path) -> None:
    """A mount under the workspace given is checked against that workspace (an allowed root),
    not a scratch folder; a relative one resolves against the file's folder either way."""
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (tmp_path / "proj").mkdir()
    path = _env_file(
        tmp_path / "proj",
        f"version: 1\nname: r\nimage: i\nmounts: [{{source: {ws / 'data'}, target: /data}}]\n",
    )
    r = _cli(tmp_path, "render", str(path), "--workspace", str(ws))
    assert r.returncode == 0 and str(ws / "data") in r.stdout, r.stderr
    r = _cli(tmp_path, "render", str(path))  # the private workspace: no root of the file's
    assert r.returncode == 2 and "outside the allowed roots" in r.stderr, r.stderr


def test_a_plugin_installed_while_the_process_runs_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry points are scanned once and cached: a plugin installed later into a folder
    already on the path (a new dist-info) is still found, by name and in a file."""
    site = tmp_path / "later"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    assert PLUGIN not in runtime_names()  # scanned (and cached) without it
    time.sleep(0.01)  # a coarse clock would give the folder the same mtime
    made = _write_plugin(tmp_path)
    for entry in made.iterdir():
        entry.rename(site / entry.name)
    try:
        assert PLUGIN in runtime_names()
        path = _env_file(tmp_path, f"version: 1\nname: p\nbackend: {PLUGIN}\n")
        assert load_environment(path, backends=runtime_names).backend == PLUGIN
    finally:
        registry._registered.pop(PLUGIN, None)
        sys.modules.pop("orch_test_plugin_0", None)


def test_a_planted_scan_in_the_state_folder_imports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept scan (state folder, `cache/entry-points.json`) may come from someone else (a
    repository's ./.orch-state, a restored CI cache): a backend it names, for a file that
    asks for it, imports nothing; only a scan of this process's own names what is imported.
    """
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "imported"
    (site / "planted_mod_0.py").write_text(f"open({str(marker)!r}, 'w').close()\nX = 1\n")
    monkeypatch.syspath_prepend(str(site))
    key = [[p, registry._mtime(p)] for p in sys.path]
    cache = tmp_path / "state" / "cache"
    cache.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    scan = [{"key": key, "found": {"planted": "planted_mod_0:X"}, "files": []}]
    (cache / "entry-points.json").write_text(json.dumps(scan))
    registry._scan.cache_clear()
    try:
        assert "planted" in runtime_names()  # (the kept scan is read: a name, nothing more)
        with pytest.raises(UsageError, match="unknown backend 'planted'"):
            get_runtime_class("planted")
        assert not marker.exists() and "planted_mod_0" not in sys.modules
    finally:
        registry._scan.cache_clear()
        sys.modules.pop("planted_mod_0", None)
