"""pytest's rewritten test modules, written once for the whole run before its workers start.

pytest imports each test module (and each plugin of its own) through its assertion
rewriting: the source parsed, its asserts rewritten, the tree compiled. It keeps the result in
a cache beside the module, but writes that cache only where Python may write bytecode: where
PYTHONDONTWRITEBYTECODE is set (as on the machines that run our CI), every worker of `-n 8`
rewrote all of them again, about 6 s of CPU each, all eight at once at the start of the run
on a machine of two CPUs. pytest reads that cache wherever it finds it, so the controller
writes it here, once, before the workers start; where it is there and whole, nothing is done.

This uses pytest's own functions for it (private ones: no public call does this). Where they
are not there (another pytest), nothing is written and the workers rewrite as before. It
writes where pytest itself would, were bytecode written: beside each test module, and for
the plugins pytest rewrites (hypothesis, anyio, xdist), in the virtual environment.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
import warnings
from pathlib import Path

import pytest

WITHIN = 60.0
"""Seconds the writing may take (about 3 on two CPUs); a child still writing then is killed."""


def write_for_workers(config: pytest.Config, tests: Path, processes: int | None = None) -> None:
    """Write pytest's cache of rewritten modules for the test modules under `tests` and the
    modules this process already rewrote (its plugins, the conftest files), split among
    `processes` children (this machine's CPUs; 1: here, in this process); what is cached
    already is left."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,  # noqa: F401 (there, as _write needs it)
            _write_pyc,  # noqa: F401
            assertstate_key,
            get_cache_dir,
        )

        state = config.stash[assertstate_key]
        hook = state.hook
        if hook is None:
            return
        patterns = list(hook.fnpats)
        done = list(hook._rewritten_names.values())
    except (ImportError, AttributeError, KeyError):
        return
    modules = {Path(path) for path in done}
    for path in tests.rglob("*.py"):
        if path.name == "conftest.py" or any(fnmatch.fnmatch(path.name, p) for p in patterns):
            modules.add(path)

    def missing(path: Path) -> tuple[Path, Path] | None:
        pyc = get_cache_dir(path) / (path.name[:-3] + PYC_TAIL)
        return None if _read_pyc(path, pyc) is not None else (path, pyc)

    todo = [each for each in map(missing, sorted(modules)) if each is not None]
    if not todo:
        return
    if processes == 1:
        _write(todo, config, state)
        return
    shares = max(1, min(len(todo), processes or os.cpu_count() or 1))
    children = []
    for share in range(shares):
        with warnings.catch_warnings():  # (a fork beside threads warns: here, there are none)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # a child: its share, then out at once (no cleanup of the parent's)
            code = 0
            try:
                _write(todo[share::shares], config, state)
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    deadline = time.monotonic() + WITHIN
    while children:
        for pid in list(children):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                children.remove(pid)
            elif time.monotonic() > deadline:  # the workers rewrite what it did not
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                children.remove(pid)
        time.sleep(0.02)


def _write(todo: list[tuple[Path, Path]], config: pytest.Config, state: object) -> None:
    from _pytest.assertion.rewrite import _rewrite_test, _write_pyc

    for path, pyc in todo:
        try:  # (one that fails is rewritten by each worker, which says why)
            pyc.parent.mkdir(parents=True, exist_ok=True)  # (PYTHONPYCACHEPREFIX: a tree)
            source_hash, co = _rewrite_test(path, config)
            _write_pyc(state, co, source_hash, pyc)  # type: ignore[arg-type]
        except (OSError, SyntaxError, ValueError):
            continue
