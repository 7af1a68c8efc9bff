"""Benchmarks that compare orchestrator with the raw alternatives side by side, in one run."""
