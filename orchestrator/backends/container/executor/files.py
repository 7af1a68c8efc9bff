"""What the executor's folder in a container holds: its own modules, the process core
(`procutil`, copied whole as a package), and their compiled code for this machine's Python.
The Compose project writes them into a host folder, the copy-in packs them into the main
container's archive; both ask `executor_files`."""

from __future__ import annotations

import functools
import py_compile
import sys
import tempfile
from pathlib import Path

from orchestrator import procutil
from orchestrator.backends.container.layout import SANDBOX_MOUNT

HERE = Path(__file__).resolve().parent
AGENT = "agent.py"
#: Files copied into the sandbox folder so the executor can run inside the container, by
#: their path there: its own modules beside it, and the process core as the package
#: `procutil` (its parts import one another relatively, so it needs no `orchestrator`).
FILES = {
    **{
        name: HERE / name
        for name in (AGENT, "fds.py", "kept.py", "spawner.py", "spawnchild.py", "wire.py")
    },
    **{
        f"procutil/{f.name}": f
        for f in sorted(Path(procutil.__file__).resolve().parent.glob("*.py"))
    },
}


@functools.cache
def executor_files() -> dict[str, bytes]:
    """What the executor's folder in a container holds, by relative path: its sources, and
    the compiled code of the modules it imports for this machine's Python
    (`__pycache__/NAME.<tag>.pyc` beside each, checked against the source's hash at
    import). That folder is read-only in the container, so Python cannot cache there itself:
    a container whose Python has this tag imports them without compiling ~50 KB of source at
    each executor start (about 45 ms of CPU); any other compiles the sources as before."""
    out = {rel: f.read_bytes() for rel, f in FILES.items()}
    tag = sys.implementation.cache_tag
    if not tag:
        return out
    with tempfile.TemporaryDirectory(prefix="orch-pyc-") as tmp:
        for rel, f in FILES.items():
            if rel == AGENT:  # run as a script: Python never loads that from a cache
                continue
            folder = rel.rpartition("/")[0]
            cached = f"{folder}/__pycache__/{f.stem}.{tag}.pyc".lstrip("/")
            cfile = Path(tmp) / cached.replace("/", "_")
            py_compile.compile(
                str(f),
                cfile=str(cfile),
                dfile=f"{SANDBOX_MOUNT}/{rel}",
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
            out[cached] = cfile.read_bytes()
    return out
