"""`ps` in a pipe loads no Rich, whatever names it lists: Rich's cell count was loaded for
any text not in ASCII, so another environment with such a name (another process's, which
`ps` lists too) made a harness's `ps` load it (and a test of that fail while others ran)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from orchestrator.tables import print_table
print_table(("ID", "ENV"), [("orch-a-1", "日本語-é"), ("orch-b-2", "plain")])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "rich")))
"""


def test_a_table_in_a_pipe_with_wide_names_loads_no_rich() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    *table, loaded = done.stdout.splitlines()
    assert json.loads(loaded) == []
    assert table == ["ID        ENV", "orch-a-1  日本語-é", "orch-b-2  plain"]
