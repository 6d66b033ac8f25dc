"""Studies and sweeps: ``python -m benchmarks.studies.<name>`` from the repository root (README.md lists them)."""
