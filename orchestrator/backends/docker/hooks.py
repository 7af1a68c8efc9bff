"""What the registry and the CLI ask of the docker backend class, without starting anything:
check a file (its policy and mount rules, compiled against a scratch workspace), prepare it
once before many spawns (build its images), render its Compose project."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from orchestrator.backends.container.identity import LABEL_DIGEST, LABEL_ENV, LABEL_MANAGED
from orchestrator.backends.docker.render import CompiledProject, CompileOptions, compile_project
from orchestrator.spec.loader import Environment, require_main_image
from orchestrator.spec.policy import Policy


def _scratch_compile(
    env: Environment, policy: Policy, project: str, workspace: Path | None = None
) -> CompiledProject:
    require_main_image(env)
    if workspace is not None:
        return compile_project(
            env, CompileOptions(project=project, workspace=workspace, policy=policy)
        )
    with tempfile.TemporaryDirectory(prefix="orch-check-") as ws:
        return compile_project(
            env, CompileOptions(project=project, workspace=Path(ws), policy=policy)
        )


def check(env: Environment, policy: Policy, workspace: Path | None = None) -> list[str]:
    """Spec, policy and mount errors of the Compose project (raised), and its warnings."""
    return list(_scratch_compile(env, policy, "validate", workspace).warnings)


def prepare(env: Environment, policy: Policy) -> None:
    """Check, then build the images the file builds, so spawns starting together do not each
    build them."""
    from orchestrator.backends.docker.lifecycle import build_images

    build_images(env, _scratch_compile(env, policy, f"orch-prepare-{os.getpid()}"))


def render(env: Environment, workspace: Path, policy: Policy) -> dict[str, str]:
    """compose.yaml first, then the project's other files (the sandbox entry script)."""
    require_main_image(env)
    labels = {LABEL_MANAGED: "1", LABEL_ENV: env.name, LABEL_DIGEST: env.digest}
    options = CompileOptions(
        project=f"orch-{env.name}-preview", workspace=workspace, labels=labels, policy=policy
    )
    compiled = compile_project(env, options)
    return {"compose.yaml": compiled.compose_yaml, **compiled.files}
