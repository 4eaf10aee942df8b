"""Benchmarks of the engine and its peers; run from the repo root: python -m bench.<name>."""
