"""Running Pulse: the `pulse` command line, benchmarks, deployment configs."""
