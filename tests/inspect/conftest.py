"""Inspect AI's own checks and a real `inspect eval` against our provider (needs the
`inspect` extra, which the dev install includes)."""

from __future__ import annotations

import pytest

pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install '.[inspect]')")
