"""The controller writes pytest's cache of rewritten test modules once for the workers
(tests/rewrite_cache.py): the cache is there after it, and holds the rewritten asserts."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc

from tests.rewrite_cache import write_for_workers


def test_the_workers_find_each_test_module_rewritten(
    pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text("def test_it():\n    x = 1\n    assert x == 2\n")
    helper = tmp_path / "helper.py"  # not a test module: pytest does not rewrite it
    helper.write_text("X = 1\n")
    write_for_workers(pytestconfig, tmp_path, processes=1)
    pyc = tmp_path / "__pycache__" / f"test_sample{PYC_TAIL}"
    code = _read_pyc(module, pyc)
    assert code is not None
    inner = next(c for c in code.co_consts if getattr(c, "co_name", "") == "test_it")
    assert any(name.startswith("@py_assert") for name in inner.co_varnames), inner.co_varnames
    assert not (tmp_path / "__pycache__" / f"helper{PYC_TAIL}").exists()
    module.write_text("def test_it():\n    assert True\n")  # changed: written anew
    write_for_workers(pytestconfig, tmp_path, processes=1)
    assert _read_pyc(module, pyc) is not None
