"""GPU and CPU benchmarks, each run from the project root as `python -m benchmarks.<name>`."""
