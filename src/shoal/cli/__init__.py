"""`shoal` and the Slurm-compatible commands. Stdlib only on the start-up path."""


def version_line() -> str:
    """What the Slurm-compatible commands' -V/--version (and `scontrol version`) print:
    ``<name> <version>``, as Slurm's print ``slurm 22.05.8`` (Debian's ``slurm-wlm 22.05.8``)."""
    from shoal import __version__

    return f"shoal {__version__}"
