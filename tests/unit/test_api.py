"""The public API is pinned, imports lazily, and backends register as documented."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import orchestrator
from orchestrator import UsageError, load_environment_text
from orchestrator.backends.local import LocalRuntime
from orchestrator.sandbox.registry import get_runtime_class, register_runtime, runtime_names


def test_all_is_literal_sorted_and_every_name_resolves() -> None:
    """The names themselves are pinned by tests/unit/test_consumer.py, which imports each."""
    assert orchestrator.__all__ == sorted(orchestrator.__all__)
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name) is not None


def test_the_public_names_are_listed_once_and_each_loads_from_its_home() -> None:
    """The `if TYPE_CHECKING:` imports of orchestrator/__init__.py are the one list: what
    type checkers read is what `__all__`, `dir()` and the lazy loading answer."""
    import ast
    import importlib

    tree = ast.parse((Path(orchestrator.__file__)).read_text())
    block, *others = [n for n in tree.body if isinstance(n, ast.If)]  # the first is the list
    assert all(  # (another says only what type checkers need: no public name)
        not isinstance(n, ast.ImportFrom) or n.module == "typing" for o in others for n in o.body
    )
    homes = {a.name: n.module for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert sorted(homes) == [n for n in orchestrator.__all__ if n != "__version__"]
    assert dir(orchestrator) == orchestrator.__all__
    for name, home in homes.items():
        assert getattr(orchestrator, name) is getattr(importlib.import_module(str(home)), name)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "__all__"]


def test_import_pulls_in_no_docker_library_or_pydantic() -> None:
    code = (
        "import sys, orchestrator; "
        "print(any(m.startswith(('python_on_whales', 'pydantic', 'jinja2')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_errors_inherit_builtins() -> None:
    assert issubclass(orchestrator.SpecError, ValueError)
    assert issubclass(orchestrator.CommandTimeout, TimeoutError)
    assert issubclass(orchestrator.SpecError, orchestrator.OrchestratorError)


def test_registry_knows_builtins_and_registers_new() -> None:
    assert {"docker", "local"} <= set(runtime_names())

    @register_runtime("test-extra")
    class Extra(LocalRuntime):
        pass

    assert get_runtime_class("test-extra") is Extra and "test-extra" in runtime_names()


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(UsageError, match=r"known backends: .*docker.*local"):
        get_runtime_class("nope")


def test_spawn_runtime_dispatches_on_backend(tmp_path: Path) -> None:
    env = load_environment_text("version: 1\nname: l\nbackend: local\n")
    with orchestrator.spawn_runtime(env, workspace=tmp_path) as rt:
        assert isinstance(rt, LocalRuntime)
        assert rt.execute("pwd").stdout.strip() == str(tmp_path)


def _install_plugin(site: Path, name: str) -> None:
    """What installing a distribution with backend `name` leaves in folder `site`."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    _fill_plugin(info, name)


def _fill_plugin(info: Path, name: str) -> None:
    from orchestrator.sandbox import registry

    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\n{name} = orchestrator.backends.local:LocalRuntime\n"
    )


def test_entry_point_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from orchestrator.sandbox import registry

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    site = tmp_path / "site"
    site.mkdir()
    _install_plugin(site, "from-plugin")
    monkeypatch.syspath_prepend(str(site))
    assert "from-plugin" in runtime_names()
    assert issubclass(get_runtime_class("from-plugin"), LocalRuntime)
    assert get_runtime_class("from-plugin").name == "from-plugin"
    assert LocalRuntime.name == "local"  # an alias never renames the class it points at

    # the next process reads the scan kept in the state folder: no metadata is read again
    def unread(**_: object) -> object:
        raise AssertionError("the installed distributions were scanned again")

    registry._scan.cache_clear()
    with monkeypatch.context() as scans:
        scans.setattr(importlib.metadata, "entry_points", unread)
        assert "from-plugin" in runtime_names()
    # another way of starting (another first folder on the path) keeps a scan of its own,
    # beside the first: neither scans again when they alternate
    with monkeypatch.context() as started:
        started.syspath_prepend(str(tmp_path))
        registry._scan.cache_clear()
        assert "from-plugin" in runtime_names()
    for _ in range(2):
        with monkeypatch.context() as scans:
            scans.setattr(importlib.metadata, "entry_points", unread)
            registry._scan.cache_clear()
            assert "from-plugin" in runtime_names()
    # ... until a plugin is installed into (or removed from) a folder on the path
    time.sleep(0.05)  # (a folder's mtime moves in steps of the kernel's clock tick)
    _install_plugin(site, "second-plugin")
    registry._scan.cache_clear()
    assert {"from-plugin", "second-plugin"} <= set(runtime_names())
    # a plugin's entry points rewritten in place (an egg-info's are) move no folder's mtime
    listed = site / "second_plugin-1.0.dist-info" / "entry_points.txt"
    time.sleep(0.05)
    listed.write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\nsecond-plugin = orchestrator.backends.docker:gone\n"
    )
    registry._scan.cache_clear()
    assert registry._entry_points()["second-plugin"] == "orchestrator.backends.docker:gone"
    # and a backend asked for by name that the kept scan lacks is looked for again
    (site / "third_plugin-1.0.dist-info").mkdir()
    registry._scan.cache_clear()
    with monkeypatch.context() as scans:  # (the kept scan, as if no folder had moved)
        scans.setattr(registry, "_mtime", lambda p: 0)
        registry._scan.cache_clear()
        runtime_names()
        _fill_plugin(site / "third_plugin-1.0.dist-info", "third-plugin")
        assert get_runtime_class("third-plugin").name == "third-plugin"
    # a kept scan another hand wrote wrong is read as none
    kept = tmp_path / "state" / "cache" / "entry-points.json"
    kept.write_text('[{"key": 1, "found": {"x": 2}}, 3]')
    registry._scan.cache_clear()
    assert "second-plugin" in runtime_names()
    registry._scan.cache_clear()


def test_a_kept_scan_is_read_only_from_a_private_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATTACK (another local user, where the state folder's cache is a link to a folder of
    theirs): a kept scan names modules to import, so one outside our private state folder
    is never read."""
    import json

    from orchestrator.sandbox import registry

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / "state" / "cache").symlink_to(theirs)
    key = [[p, registry._mtime(p)] for p in sys.path]
    planted = [{"key": key, "found": {"planted": "os:system"}}]
    (theirs / "entry-points.json").write_text(json.dumps(planted))
    registry._scan.cache_clear()
    try:
        assert "planted" not in runtime_names()
    finally:
        registry._scan.cache_clear()


def test_registering_an_alias_keeps_the_class_name(tmp_path: Path) -> None:
    from orchestrator.sandbox import registry

    try:
        assert orchestrator.register_runtime("alias-of-local")(LocalRuntime) is LocalRuntime
        assert LocalRuntime.name == "local"
        env = load_environment_text("version: 1\nname: l\nbackend: local\n")
        with orchestrator.spawn_runtime(env, workspace=tmp_path, backend="alias-of-local") as rt:
            assert isinstance(rt, LocalRuntime) and rt.info().backend == "alias-of-local"
        with orchestrator.spawn_runtime(env, workspace=tmp_path) as rt:
            assert rt.info().backend == "local"
    finally:
        registry._registered.pop("alias-of-local", None)


def test_wheel_carries_templates_environments_and_types(tmp_path: Path) -> None:
    import zipfile

    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(root),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("orchestrator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "orchestrator/_data/templates/compose.yaml.j2" in names
    assert "orchestrator/_data/environments/python.yaml" in names
    assert "orchestrator/py.typed" in names
    # every file the executor is copied into a container with (its parts, procutil's)
    from orchestrator.backends.container.executor.files import FILES

    package = Path(orchestrator.__file__).resolve().parent
    carried = [f"orchestrator/{path.relative_to(package)}" for path in FILES.values()]
    assert "orchestrator/procutil/pump.py" in carried
    assert [name for name in carried if name not in names] == []
