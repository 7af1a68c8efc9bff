"""Every shipped environment validates and renders to its golden Compose file; where Compose
is installed, `docker compose config` accepts every rendered project.
Regenerate the golden files with ORCHESTRATOR_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator import load_environment
from orchestrator.backends.docker.render import CompileOptions, compile_project

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
SHIPPED = sorted((ROOT / "environments").glob("*.yaml"))
LABELS = {"org.orchestrator.managed": "1", "org.orchestrator.project": "golden"}
HOST = {"HUID": "1000", "HGID": "1000"}


def test_environments_are_shipped() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"python", "busybox", "multi-service", "local"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_environment_renders_to_golden(path: Path, tmp_path: Path) -> None:
    env = load_environment(path)
    if env.backend != "docker":
        pytest.skip("local environments have no Compose project")
    ws = tmp_path / "ws"
    ws.mkdir()
    compiled = compile_project(
        env,
        CompileOptions(
            project=f"golden-{env.name}",
            workspace=ws,
            labels=LABELS,
            subnet="10.213.0.0/27",
            host_env=HOST,
        ),
    )
    text = compiled.compose_yaml.replace(str(ws), "<WORKSPACE>").replace(str(ROOT), "<ROOT>")
    golden = GOLDEN / f"{path.stem}.compose.yaml"
    if os.environ.get("ORCHESTRATOR_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), "no golden file: run with ORCHESTRATOR_UPDATE_GOLDEN=1"
    assert text == golden.read_text()
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        compiled.write(tmp_path / "project")
        out = subprocess.run(
            ["docker", "compose", "-f", str(tmp_path / "project" / "compose.yaml"), "config", "-q"],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
