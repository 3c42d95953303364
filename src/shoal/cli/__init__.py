"""`shoal` and the Slurm-compatible commands: thin shells over shoal.slurm and shoal.api_client that read
argv, files and standard input. Stdlib only on the start-up path; nothing below the shells imports them."""
