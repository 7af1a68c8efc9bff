"""Imports stay lazy: what `import orchestrator`, `from orchestrator import spawn_runtime` and
a whole local-backend session may load, pinned in a fresh process each. A Docker or Swarm
backend loads python-on-whales and Jinja when it is used; the CLI loads typer and rich; the
Inspect provider loads inspect_ai. None of them may creep into these paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

# beyond the standard library; what site itself may add (setuptools' hook, sysconfig data)
_SITE = {"__main__", "_distutils_hack", "sitecustomize", "usercustomize"}
_MODELS = {"pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection"}
_YAML = {"ruamel", "_ruamel_yaml", "cython_runtime", "_cython"}
"""ruamel, and its C loader (ruamel.yaml.clib, a Cython module with its runtime)."""
ALLOWED = {
    "import orchestrator": {"orchestrator"},
    "from orchestrator import spawn_runtime": {"orchestrator", *_YAML, *_MODELS},
    "local session": {"orchestrator", *_YAML, *_MODELS},
}
NEVER = ("python_on_whales", "jinja2", "typer", "click", "rich", "inspect_ai", "docker")

_SESSION = """
import tempfile
from orchestrator import load_environment_text, spawn_runtime
env = load_environment_text("version: 1\\nname: l\\nbackend: local\\n")
with tempfile.TemporaryDirectory() as ws, spawn_runtime(env, workspace=ws) as rt:
    assert rt.execute("echo hi").stdout == "hi\\n"
    rt.write_file("a.txt", "b")
    assert rt.read_file("a.txt") == "b"
"""
CODE = {
    "import orchestrator": "import orchestrator",
    "from orchestrator import spawn_runtime": "from orchestrator import spawn_runtime",
    "local session": _SESSION,
}


def _loaded(code: str) -> set[str]:
    probe = (
        code
        + "\nimport sys, json\n"
        + "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    # (Cython names its shared module after its version: _cython_3_0_11)
    top = {
        re.sub(r"^_cython_[0-9_]+$", "_cython", m) for m in json.loads(out.stdout.splitlines()[-1])
    }
    return {m for m in top if m not in sys.stdlib_module_names and m not in _SITE} - {
        m for m in top if m.startswith("_sysconfigdata")
    }


@pytest.mark.parametrize("what", list(ALLOWED))
def test_only_the_listed_packages_are_loaded(what: str) -> None:
    loaded = _loaded(CODE[what])
    assert not [m for m in loaded if m.startswith(NEVER)], loaded
    assert loaded <= ALLOWED[what], f"{what} loads {sorted(loaded - ALLOWED[what])} as well"
