"""`shoal` and the Slurm-compatible commands. Stdlib only on the start-up path."""
