from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import BUSYBOX_IMAGE, PYTHON_IMAGE

MakeEnv = Callable[..., Path]
"""make_env(body, name="t", image=PYTHON_IMAGE) -> the file's path."""


@pytest.fixture
def make_env(tmp_path: Path) -> MakeEnv:
    """Write an environment file from the lines given; return its path."""

    def make(body: str, name: str = "t", image: str = PYTHON_IMAGE) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"version: 1\nname: {name}\nimage: {image}\n{body}")
        return path

    return make


__all__ = ["BUSYBOX_IMAGE", "PYTHON_IMAGE", "MakeEnv"]
