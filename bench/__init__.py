"""Benchmarks: `python -m bench` prints one JSON object of measured figures (never asserted in tests)."""
