"""egraft's benchmarks: each script runs on its own (``python3 bench/<name>.py``), ``python -m bench`` runs them all."""
