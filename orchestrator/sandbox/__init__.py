"""The protocol every backend speaks (`base`: Sandbox, Runtime and the backend interface),
and what the backends share by contract: results, options, files, snapshots, the pool, the
registry and `attach`. Imports nothing of a backend; the public names are in `orchestrator`."""
