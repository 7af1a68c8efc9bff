"""The flags `orchestrator exec` takes for its input and terminal (as `docker exec` spells
them), in a module of their own: the full CLI (cli/exec_cmds.py) and the quick path that
runs an exec without it (endpoint.py) read them alike, and neither imports the other."""

FLAGS = {
    "-i": ("interactive",),
    "--interactive": ("interactive",),
    "-t": ("tty",),
    "--tty": ("tty",),
    "-it": ("interactive", "tty"),
    "-ti": ("interactive", "tty"),
}
"""Each flag, and what it asks for."""
