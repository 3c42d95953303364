"""squeue: the command shell over shoal.slurm.squeue.run, with this process's streams and client."""

from __future__ import annotations

import sys

from shoal.api_client import Client
from shoal.slurm.squeue import run


def main(argv: list[str] | None = None) -> int:
    try:
        rc = run(argv, connect=Client.from_config)
    except KeyboardInterrupt:
        return 130
    if rc:
        raise SystemExit(rc)  # as fail() does: callers of main() see the exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
