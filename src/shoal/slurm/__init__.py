"""The Slurm commands' logic, pure and stdlib-only: the option table and #SBATCH directives
(``options``), output formats (``fmt``), and sbatch/squeue/scancel's ``run`` with every input
passed in, so the command shells (shoal.cli) and the server (for the compiled front end) run the same code."""


# The Slurm release whose commands Shoal's follow (the differential suite runs against it).
SLURM_VERSION = "22.05.8"


def version_line() -> str:
    """What the Slurm-compatible commands' -V/--version (and `scontrol version`) print:
    ``slurm 22.05.8 (shoal <version>)``. Tools that check for Slurm read the first two words,
    as upstream Slurm prints them (Debian's build says ``slurm-wlm``); the rest says what runs."""
    from shoal import __version__

    return f"slurm {SLURM_VERSION} (shoal {__version__})"
