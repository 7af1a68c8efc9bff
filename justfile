# orchestrator: common tasks. `just --list` shows them all.
set shell := ["bash", "-euo", "pipefail", "-c"]

py := ".venv/bin/python"

# Install the engine (if missing), the virtualenv and the test images
setup:
    scripts/bootstrap

# Run the whole test suite (Docker tests included)
test *ARGS: setup
    {{py}} -m pytest -n 8 --dist loadgroup --durations=15 {{ARGS}}

# Lint with ruff
lint:
    {{py}} -m ruff check orchestrator tests bench

# Format the code
fmt:
    {{py}} -m ruff format orchestrator tests bench

# Type-check package, tests and bench (strict)
typecheck:
    {{py}} -m mypy

# Format check, lint and types: the gates CI runs before the tests
static-checks:
    scripts/static-checks

# Everything CI runs: install, gates, tests
check: setup static-checks test

# Bring up the multi-service example, reach the sidecar by name, take it down
demo: setup
    #!/usr/bin/env bash
    set -euo pipefail
    id=$(.venv/bin/orchestrator up environments/multi-service.yaml)
    trap '.venv/bin/orchestrator down "$id"' EXIT
    .venv/bin/orchestrator ps
    .venv/bin/orchestrator exec "$id" -- python3 -c "import urllib.request as u; print(u.urlopen('http://web:8080/').read().decode())"

# Benchmarks side by side (writes bench/results/)
bench: setup
    .venv/bin/python -m pip install -q -e '.[bench]'
    {{py}} -m bench
    {{py}} -m bench.inspect_race
    {{py}} -m bench.bash_session
    {{py}} -m bench.transfer
    {{py}} -m bench.cli
    {{py}} -m bench.processes
    {{py}} -m bench.snapshot
    {{py}} -m bench.scale
    {{py}} -m bench.swarm
    {{py}} -m bench.egress
    {{py}} -m bench.isolation
    scripts/build-images harbor
    {{py}} -m bench.harbor

# A Swarm of N engines on this machine, for the swarm backend (tests start one themselves)
cluster-up N="3": setup
    scripts/cluster up {{N}}

# Remove the test Swarm
cluster-down:
    scripts/cluster down

# Hundreds of environments with random faults: hangs, errors and leaks must all be 0
soak ENVS="300": setup
    {{py}} -m bench.soak --envs {{ENVS}}

# Build (or reuse) the local test images
images:
    scripts/build-images
