"""Inspect AI's own checks and a real `inspect eval` against our provider (needs the
`inspect` extra, which the dev install includes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog

pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install '.[inspect]')")


WEB_COMMAND = json.dumps(
    [
        "sh",
        "-c",
        "mkdir -p /tmp/www && echo hello from web > /tmp/www/index.html"
        " && exec httpd -f -p 8080 -h /tmp/www",
    ]
)
"""A busybox sidecar's command (JSON is YAML too): it serves "hello from web" on port 8080."""


def passing_eval(folder: Path, *options: str) -> EvalLog:
    """`inspect eval task.py` in `folder` (with the built-in mock model), which must succeed
    with every sample scored correct by its scorer `check`: its log."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    argv = [sys.executable, "-m", "inspect_ai", "eval", "task.py", "--model", "mockllm/model"]
    run = subprocess.run(
        [*argv, "--log-dir", str(folder / "logs"), "--display", "plain", *options],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [info] = list_eval_logs(str(folder / "logs"))
    log = read_eval_log(info)
    assert log.status == "success", log.error
    assert log.results is not None
    [score] = log.results.scores
    explanations = [s.scores["check"].explanation for s in log.samples or [] if s.scores]
    assert score.metrics["accuracy"].value == 1.0, explanations
    return log
