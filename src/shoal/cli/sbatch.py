"""sbatch: submit a batch script (or --wrap a command) to Shoal, as Slurm's sbatch does.

This shell reads what only this process can (argv, the script file or standard input, the
environment); shoal.slurm.sbatch.run does the rest, as the server does for the compiled front end.
"""

from __future__ import annotations

import os
import sys
import time

from shoal.slurm.sbatch import read_script, run


def main(argv: list[str] | None = None) -> int:
    from shoal.api_client import Client, fail
    from shoal.slurm.options import OptionError, asks_help, asks_version, script_source

    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "-h" or asks_help(argv):
            from shoal.slurm.fmt import emit
            from shoal.slurm.options import SBATCH, help_text

            emit(help_text(SBATCH, usage="--usage" in argv))
            return 0
        if asks_version(argv):
            from shoal.slurm import version_line

            print(version_line())
            return 0
        source = script_source(argv)
    except OptionError as e:
        fail(str(e), e.exit_code)
    script = None
    if source == "-":
        if sys.stdin.isatty():
            fail("no batch script: name a script file, pipe one on standard input, or use --wrap")
        script = read_script(sys.stdin.buffer.read())
    elif source is not None:
        try:
            with open(source, "rb") as f:
                script = read_script(f.read())
        except OSError as e:
            fail(f"Unable to open file {source}: {e.strerror}")
    return run(argv, script, source, cwd=os.getcwd(), environ=os.environ, now=time.time(),
               connect=Client.from_config, out=sys.stdout, err=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
