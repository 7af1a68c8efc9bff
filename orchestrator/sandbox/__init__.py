"""The protocol every backend speaks, and nothing built on it: `Sandbox` (the calls, each
described once and driven by a blocking or an awaited door), `Runtime` (its lifecycle and
saved states) with its class hooks (`Backend`), the registry of backend classes, options,
results, the records its calls return, and the helpers those calls need. Imports nothing of
a backend or a service (orchestrator.services); the public names are in `orchestrator`."""
