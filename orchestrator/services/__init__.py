"""What is built on the protocol (orchestrator.sandbox), through its public members only:
making runtimes from files (`spawn`), admission by capacity (`admission`, `ledger`), warm
pools (`pool`), finding environments left running (`attach`, `inventory`) and waking
suspended ones (`suspend`). The protocol imports none of these; the public names are in
`orchestrator`."""
