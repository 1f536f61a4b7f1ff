"""Benchmarks: one scenario per module, run with `python -m ops.bench.<name>`."""
