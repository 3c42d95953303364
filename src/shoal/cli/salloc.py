"""salloc: get an allocation, run a command (the user's shell by default) in it, and give it back.

As Slurm's salloc, the command runs here (not on the nodes) with SLURM_JOB_ID and the
allocation's variables set, so ``srun`` inside it steps into the allocation; the allocation
ends when the command exits, and salloc exits with the command's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def allocation_environment(job: Mapping[str, Any], cluster_name: str | None = None) -> dict[str, str]:
    """The variables salloc gives its command, from the running job (docs/API.md's Job object)."""
    from shoal.model.hostlist import expand

    nodelist = job.get("nodelist") or ""
    count = str(len(expand(nodelist))) if nodelist else "0"
    env = {
        "SLURM_JOB_ID": str(job["job_id"]), "SLURM_JOBID": str(job["job_id"]),
        "SLURM_JOB_NAME": job.get("name") or "", "SLURM_JOB_PARTITION": job.get("partition") or "",
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": count, "SLURM_NNODES": count,
        "SLURM_SUBMIT_DIR": os.getcwd(),
    }
    if job.get("ntasks"):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(job["ntasks"])
    if job.get("cpus_per_task"):
        env["SLURM_CPUS_PER_TASK"] = str(job["cpus_per_task"])
    return env


def main(argv: list[str] | None = None) -> int:
    from shoal.api_client import Client, ClientError, fail
    from shoal.slurm.options import SRUN, OptionError, asks_version, parse_salloc
    from shoal.cli.srun import _allocate, _complete

    argv = sys.argv[1:] if argv is None else argv
    try:
        if asks_version(argv, SRUN):
            from shoal.slurm import version_line

            print(version_line())
            return 0
        req = parse_salloc(argv, cwd=os.getcwd(), environ=os.environ)
    except OptionError as e:
        fail(str(e), e.exit_code)
    command = req.command or [os.environ.get("SHELL") or "/bin/sh"]
    try:
        client = Client.from_config()
        job_id = _allocate(client, req.options, command, prog="salloc")
        job = client.get(f"/shoal/v1/jobs/{job_id}")
    except ClientError as e:
        fail(str(e))
    print(f"salloc: Granted job allocation {job_id}", file=sys.stderr)
    env = {**os.environ, **allocation_environment(job)}
    # As Slurm's salloc: Ctrl-C goes to the command (an interactive shell), not to salloc.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = subprocess.call(command, env=env)
    except OSError as e:
        print(f"salloc: error: {command[0]}: {e.strerror}", file=sys.stderr)
        rc = 127 if isinstance(e, FileNotFoundError) else 126
    finally:
        signal.signal(signal.SIGINT, old)
    print(f"salloc: Relinquishing job allocation {job_id}", file=sys.stderr)
    try:
        _complete(client, job_id, max(rc, 0), -rc if rc < 0 else 0)
    except ClientError as e:
        print(f"salloc: error: could not end job allocation {job_id}: {e}", file=sys.stderr)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
